"""Compile a document: lower its sweeps, validate each point, build each point's plan tree.

Reads the checkpoint's config and tokenizer from their files, never its weights
(``causalab.models.resolve`` only returns a directory; ``causalab.models.readers`` spares
importing transformers where the files say everything). Every refusal here is a :class:`CompileError` with its JSON path.
"""
from __future__ import annotations

import functools
from typing import Any

from causalab.compile.addresses import facts, resolve_address
from causalab.compile.featurizers import featurizers_node
from causalab.compile.inputs import inputs_of
from causalab.compile.passes import Context
from causalab.compile.plan import ModelRef, Plan
from causalab.compile.prompts import RememberingTokenizer
from causalab.compile.steps import step_nodes
from causalab.document import digest as point_digest
from causalab.document import validate, validate_point
from causalab.document.schema import Document, ModelSpec
from causalab.document.sweep import authored_path
from causalab.errors import CausalabError


def model_ref(model: ModelSpec) -> ModelRef:
    """Resolve the document's ``model`` to a local directory (no weights are read)."""
    from causalab.models import resolve

    found = resolve(model.key, model.revision)
    return ModelRef(key=model.key, revision=model.revision, dtype=model.dtype,
                    attn_implementation=model.attn_implementation, path=found.path,
                    control=model.control)


def addresses(document: Document, config: Any) -> dict:
    """Every declared site resolved against the config (C2–C5 at ``sites.<t>``)."""
    attn = document.model.attn_implementation
    out = {}
    for name, site in document.sites.items():
        layer = site.layers[0] if site.layers else None
        out[name] = resolve_address(site.component, layer, site.heads, site.units, config,
                                    attn, ("sites", name))
    return out


def compile_point(point, document: Document | None, *, model: ModelRef, config: Any,
                  tokenizer: Any, data_root: str, resolver=None,
                  shared: dict | None = None) -> Plan:
    """One point's plan: the featurizers node (when declared), then its steps in order.

    The ops are built from ``document``, the validated schema object (validated here when
    None), so every default is the schema's; ``point.document``, the lowered dict, is kept
    only for the digest and for ``document.json``. ``shared``: what the points of one
    compile share (``Context.shared``).
    """
    raw = point.document
    document = document if document is not None else validate_point(raw)
    digest = point_digest(raw)
    sites = addresses(document, config)
    node = featurizers_node(document, sites, model, digest, resolver)
    ctx = Context(document=document, config=config, tokenizer=tokenizer, data_root=data_root,
                  facts=facts(config), addresses=sites,
                  featurizers={s.name: s for s in node.featurizers} if node else {},
                  shared={} if shared is None else shared)
    children = [node] if node else []
    for name, step in document.steps.items():
        children.extend(step_nodes(name, step, ctx, point.label))
    bundles = [spec.file_path for spec in (node.featurizers if node else ()) if spec.file_path]
    return Plan(name=point.label or "<root>", directory=point.label, children=tuple(children),
                model=model, digest=digest, document=raw,
                coordinates={k: _frozen(v) for k, v in point.coordinates.items()},
                input_digests=inputs_of(ctx.tables, data_root, bundles))


def _frozen(value: Any) -> Any:
    """Lists as tuples, so a plan equals itself after a JSON round trip."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def compile_document(raw: dict, *, data_root: str, resolver=None) -> Plan:
    """The plan tree of a raw document: the root holds its steps, or one Plan per sweep point.
    ``resolver`` (``runs:/`` URI -> local path, from the tracking layer) checks tracked bundles
    here; without it they are checked when the run fetches them."""
    from causalab.models.readers import read_config, read_tokenizer

    checked = validate(raw)
    points = [point for point, _ in checked]
    ref = model_ref(checked[0][1].model)
    config = read_config(ref.path)
    tokenizer = RememberingTokenizer(read_tokenizer(ref.path))
    if resolver is not None:
        resolver = functools.lru_cache(maxsize=None)(resolver)  # one fetch per URI, not per point
    plans, shared = [], {}
    for point, document in checked:
        try:
            plans.append(compile_point(point, document, model=ref, config=config,
                                       tokenizer=tokenizer, data_root=data_root, resolver=resolver,
                                       shared=shared))
        except CausalabError as error:  # named where the author wrote it, not as lowered
            raise type(error)(authored_path(point, error.path), error.message) from None
    if len(plans) == 1 and not points[0].label:
        return plans[0]
    return Plan(name="<root>", directory="", children=tuple(plans), model=ref)
