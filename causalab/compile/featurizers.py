"""The ``featurizers`` plan node: each declared featurizer with ``d``, seed, stamp and trainer.

Reads a bundle's safetensors header (JSON) to learn an ``sae``/``linear`` rank and to check its
stamp and shapes (C8), and its tensors' bytes against the stamp's digest and for NaN (C8,
C21), before any weight loads. A ``runs:/`` bundle is checked here too when the caller passes
a resolver (the tracking layer's, bound to a known tracking URI); without one its spec says
why it went unchecked (``unchecked``), and it is checked where the run fetches it.
"""
from __future__ import annotations

import dataclasses
import json

from causalab.compile.bundles.checks import Resolver, check_bundle, is_uri, read_stamp, resolve_bundle
from causalab.compile.plan import Address, FeaturizerSpec, Featurizers, ModelRef
from causalab.document.interventions import Intervention
from causalab.document.references import step_source
from causalab.document.schema import Document, Featurizer
from causalab.document.schema import Fit as FitStep
from causalab.document.vocab import IDENTITY, MODEL_CONTROLS, parametrization_of
from causalab.errors import CompileError

NODE_NAME = "featurizers"


def _bodies(document: Document) -> list[Intervention]:
    """Every intervention body: declared ones and those written inline on steps."""
    bodies = list(document.interventions.values())
    for step in document.steps.values():
        spelled = getattr(step, "interventions", None)
        for value in spelled if isinstance(spelled, list) else [spelled]:
            if isinstance(value, Intervention):
                bodies.append(value)
    return bodies


def sites_of(document: Document) -> dict[str, str]:
    """Featurizer name -> the site its reads and writes use (validate ensures it is one)."""
    found: dict[str, str] = {}
    for body in _bodies(document):
        for op in list(body.reads.values()) + list(body.writes.values()):
            if op.featurizer != IDENTITY:
                found.setdefault(op.featurizer, op.site)
    return found


def _trainers(document: Document) -> dict[str, tuple[str, int]]:
    """Featurizer -> (first fit step that trains it, that fit's seed)."""
    trainers: dict[str, tuple[str, int]] = {}
    for name, step in document.steps.items():
        if step.kind == "fit":
            for param in step.params:
                trainers.setdefault(param, (name, step.seed))
    return trainers


def bundle_rank(file_path: str, path: tuple, resolver: Resolver | None = None,
                document: Document | None = None) -> int | None:
    """``k`` of an sae/linear bundle: the second axis of ``W_enc`` in the safetensors header,
    or the ``k`` of the output an earlier step publishes (``steps:<step>/<value>``)."""
    source = step_source(file_path)
    if source is not None:
        step = document.steps.get(source[0]) if document is not None else None
        output = (getattr(step, "outputs", None) or {}).get(source[1])
        return getattr(output, "k", None)
    if is_uri(file_path):
        if resolver is None:
            return None
        file_path = resolve_bundle(file_path, resolver, path)
    _, shapes = read_stamp(file_path, at=path)
    entry = shapes.get("W_enc")
    if not entry or len(entry) != 2:
        raise CompileError(path, f"bundle {file_path!r} has no 2-axis W_enc tensor")
    return int(entry[1])


def stamp(name: str, kind: str, k: int | None, d: int, site: str, address: Address,
          model: ModelRef, digest: str, parametrization: str | None = None,
          control: str | None = None) -> dict[str, str]:
    """The identity stamp a bundle of this featurizer carries (docs/format.md §8.3); its
    parametrization is the kind's own (a subspace's as the document declares it)."""
    out = {"kind": kind, "d": str(d), "parametrization": parametrization_of(kind, parametrization),
           **where(site, address)}
    if k is not None and kind != "gate":
        out["k"] = str(k)
    out.update(_model(model, control), featurizer_dtype="fp32", produced_by=digest,
               engine="causalab")
    return out


def save_stamp(value: str, place: dict[str, str], model: ModelRef, digest: str) -> dict[str, str]:
    """The stamp of a plain tensor save (a read, a mean, generated ids, a loss curve, a gate's
    mask): ``kind: tensor``, the value's name, where it was taken (``place``: site, component,
    layer; "" for none) and the model, so no tensor causalab writes is anonymous."""
    return {"kind": "tensor", "value": value, "site": "", "component": "", "layer": "", **place,
            **_model(model), "produced_by": digest, "engine": "causalab"}


def where(site: str, address: Address) -> dict[str, str]:
    """A site's place in a stamp: its name, component, layer and any heads or units."""
    out = {"site": site, "component": address.component,
           "layer": "" if address.layer is None else str(address.layer)}
    if address.heads:
        out["heads"] = json.dumps(list(address.heads), separators=(",", ":"))
    if address.units:
        out["units"] = json.dumps(list(address.units), separators=(",", ":"))
    return out


def _model(model: ModelRef, control: str | None = None) -> dict[str, str]:
    """The model a file was made on: the checkpoint, and the control that replaced its weights
    (``control`` overrides the document's, for a bundle a featurizer says came from a twin)."""
    out = {"model_key": model.key, "model_revision": model.revision, "model_dtype": model.dtype}
    control = control or model.control
    if control:
        out.update(model_control=control, model_control_seed=str(MODEL_CONTROLS[control]["seed"]))
    return out


def _spec(name: str, raw: Featurizer, site: str, address: Address, trainer, model: ModelRef,
          digest: str, resolver: Resolver | None = None,
          document: Document | None = None) -> FeaturizerSpec:
    path = ("featurizers", name)
    d = address.width
    if d is None:
        raise CompileError(path, f"featurizer {name!r} sits at {address.component}, which has no width")
    kind, k = raw.kind, raw.k
    if kind in ("sae", "linear") and k is None:
        k = bundle_rank(raw.file_path, path + ("file_path",), resolver, document)
    if kind in ("subspace", "pca") and k is not None and k > d:
        raise CompileError(path + ("k",), f"k={k} is larger than the site width {d}")
    seed = raw.seed
    if seed is None:
        # Unseeded: the seed of the fit that trains it, else the seed a fit takes by default.
        seed = trainer[1] if trainer else FitStep.model_fields["seed"].default
    spec = FeaturizerSpec(
        name=name, kind=kind, d=d, k=k, seed=seed, file_path=raw.file_path,
        trust_unstamped=raw.trust_unstamped,
        parametrization=parametrization_of(kind, raw.parametrization),
        stamp=stamp(name, kind, k, d, site, address, model, digest, raw.parametrization,
                    raw.control),
        trained_by=trainer[0] if trainer else None,
        saelens=raw.saelens.model_dump(exclude_unset=True) if raw.saelens else {})
    if spec.file_path is None or step_source(spec.file_path) is not None:
        return spec
    if resolver is None and is_uri(spec.file_path):
        return dataclasses.replace(spec, unchecked=f"{spec.file_path} not checked: no tracking "
                                   "store known (give --tracking-uri or set MLFLOW_TRACKING_URI)")
    notes: list[str] = []
    check_bundle(spec, resolver=resolver, notes=notes)
    return dataclasses.replace(spec, unchecked="; ".join(notes)) if notes else spec


def featurizers_node(document: Document, addresses: dict[str, Address], model: ModelRef,
                     digest: str, resolver: Resolver | None = None) -> Featurizers | None:
    """The node the compiler puts first whenever featurizers are declared; None otherwise.
    ``resolver`` (uri -> local path) lets ``runs:/`` bundles be checked here too."""
    declared = document.featurizers
    if not declared:
        return None
    sites, trainers = sites_of(document), _trainers(document)
    specs = tuple(
        _spec(name, raw, sites[name], addresses[sites[name]], trainers.get(name), model, digest,
              resolver, document)
        for name, raw in declared.items())
    return Featurizers(name=NODE_NAME, featurizers=specs)
