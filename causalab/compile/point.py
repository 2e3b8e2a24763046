"""Compile a document: lower its sweeps, validate each point, build each point's plan tree.

Reads the checkpoint's config and tokenizer from their files, never its weights
(``causalab.models.resolve`` only returns a directory; ``causalab.models.readers`` spares
importing transformers where the files say everything). Every refusal here is a :class:`CompileError` with its JSON path.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.addresses import facts, resolve_address
from causalab.compile.featurizers import featurizers_node
from causalab.compile.passes import Context
from causalab.compile.plan import ModelRef, Plan
from causalab.compile.prompts import RememberingTokenizer
from causalab.compile.steps import step_nodes
from causalab.document import digest as point_digest
from causalab.document import validate


def model_ref(model: dict) -> ModelRef:
    """Resolve the document's ``model`` to a local directory (no weights are read)."""
    from causalab.models import resolve

    found = resolve(model["key"], model.get("revision"))
    return ModelRef(key=model["key"], revision=model["revision"], dtype=model["dtype"],
                    attn_implementation=model.get("attn_implementation"), path=found.path)


def addresses(document: dict, config: Any) -> dict:
    """Every declared site resolved against the config (C2–C5 at ``sites.<t>``)."""
    attn = document["model"].get("attn_implementation")
    out = {}
    for name, site in document["sites"].items():
        layers = site.get("layers")
        out[name] = resolve_address(site["component"], layers[0] if layers else None,
                                    site.get("heads"), site.get("units"), config, attn,
                                    ("sites", name))
    return out


def compile_point(point, document, *, model: ModelRef, config: Any, tokenizer: Any,
                  data_root: str) -> Plan:
    """One point's plan: the featurizers node (when declared), then its steps in order.

    ``document`` is the validated schema object; the plan is built from ``point.document``,
    the lowered dict, whose field names are FORMAT's own.
    """
    raw = point.document
    digest = point_digest(raw)
    sites = addresses(raw, config)
    node = featurizers_node(raw, sites, model, digest)
    ctx = Context(document=raw, config=config, tokenizer=tokenizer, data_root=data_root,
                  facts=facts(config), addresses=sites, schema=document,
                  featurizers={s.name: s for s in node.featurizers} if node else {})
    children = [node] if node else []
    for name, step in raw["steps"].items():
        children.extend(step_nodes(name, step, ctx, point.label))
    return Plan(name=point.label or "<root>", directory=point.label, children=tuple(children),
                model=model, digest=digest, document=raw,
                coordinates={k: _frozen(v) for k, v in point.coordinates.items()})


def _frozen(value: Any) -> Any:
    """Lists as tuples, so a plan equals itself after a JSON round trip."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def compile_document(raw: dict, *, data_root: str) -> Plan:
    """The plan tree of a raw document: the root holds its steps, or one Plan per sweep point."""
    from causalab.models.readers import read_config, read_tokenizer

    checked = validate(raw)
    points = [point for point, _ in checked]
    ref = model_ref(points[0].document["model"])
    config = read_config(ref.path)
    tokenizer = RememberingTokenizer(read_tokenizer(ref.path))
    plans = [compile_point(p, doc, model=ref, config=config, tokenizer=tokenizer,
                           data_root=data_root) for p, doc in checked]
    if len(plans) == 1 and not points[0].label:
        return plans[0]
    return Plan(name="<root>", directory="", children=tuple(plans), model=ref)
