"""The ``featurizers`` plan node: each declared featurizer with ``d``, seed, stamp and trainer.

Reads a bundle's safetensors header (JSON, no tensors) to learn an ``sae``/``linear`` rank
and to check its stamp and shapes (C8) before any weight loads; a ``runs:/`` bundle is
checked where the run fetches it.
"""
from __future__ import annotations

import json
from typing import Any

from causalab.compile.bundles import check_bundle, is_uri, read_stamp
from causalab.compile.plan import Address, FeaturizerSpec, Featurizers, ModelRef
from causalab.document.references import step_source
from causalab.errors import CompileError

NODE_NAME = "featurizers"


def _bodies(document: dict) -> list[dict]:
    """Every intervention body: declared ones and those written inline on steps."""
    bodies = list(document.get("interventions", {}).values())
    for step in document["steps"].values():
        spelled = step.get("interventions")
        for value in spelled if isinstance(spelled, list) else [spelled]:
            if isinstance(value, dict):
                bodies.append(value)
    return bodies


def sites_of(document: dict) -> dict[str, str]:
    """Featurizer name -> the site its reads and writes use (validate ensures it is one)."""
    found: dict[str, str] = {}
    for body in _bodies(document):
        for op in list(body.get("reads", {}).values()) + list(body.get("writes", {}).values()):
            name = op.get("featurizer", "identity")
            if name != "identity":
                found.setdefault(name, op["site"])
    return found


def _trainers(document: dict) -> dict[str, tuple[str, int]]:
    """Featurizer -> (first fit step that trains it, that fit's seed)."""
    trainers: dict[str, tuple[str, int]] = {}
    for name, step in document["steps"].items():
        if step["kind"] == "fit":
            for param in step.get("params", []):
                trainers.setdefault(param, (name, step.get("seed", 0)))
    return trainers


def bundle_rank(file_path: str, path: tuple, document: dict | None = None) -> int | None:
    """``k`` of an sae/linear bundle: the second axis of ``W_enc`` in the safetensors header,
    or the ``k`` of the output an earlier step publishes (``steps:<step>/<value>``)."""
    source = step_source(file_path)
    if source is not None:
        output = ((document or {}).get("steps", {}).get(source[0], {}).get("outputs") or {})
        return (output.get(source[1]) or {}).get("k")
    if is_uri(file_path):
        return None
    _, shapes = read_stamp(file_path, at=path)
    entry = shapes.get("W_enc")
    if not entry or len(entry) != 2:
        raise CompileError(path, f"bundle {file_path!r} has no 2-axis W_enc tensor")
    return int(entry[1])


def stamp(name: str, kind: str, k: int | None, d: int, site: str, address: Address,
          model: ModelRef, digest: str) -> dict[str, str]:
    """The identity stamp a bundle of this featurizer carries (FORMAT §8.3)."""
    out = {"kind": kind, "d": str(d), "parametrization": "cayley", "site": site,
           "component": address.component,
           "layer": "" if address.layer is None else str(address.layer)}
    if k is not None and kind != "gate":
        out["k"] = str(k)
    if address.heads:
        out["heads"] = json.dumps(list(address.heads), separators=(",", ":"))
    if address.units:
        out["units"] = json.dumps(list(address.units), separators=(",", ":"))
    out.update(model_key=model.key, model_revision=model.revision, model_dtype=model.dtype,
               featurizer_dtype="fp32", produced_by=digest, engine="causalab")
    return out


def _spec(name: str, raw: dict, site: str, address: Address, trainer, model: ModelRef,
          digest: str, document: dict) -> FeaturizerSpec:
    path = ("featurizers", name)
    d = address.width
    if d is None:
        raise CompileError(path, f"featurizer {name!r} sits at {address.component}, which has no width")
    kind = raw["kind"]
    k = raw.get("k")
    if kind in ("sae", "linear") and k is None:
        k = bundle_rank(raw["file_path"], path + ("file_path",), document)
    if kind in ("subspace", "pca") and k is not None and k > d:
        raise CompileError(path + ("k",), f"k={k} is larger than the site width {d}")
    seed = raw.get("seed")
    if seed is None:
        seed = trainer[1] if trainer else 0
    spec = FeaturizerSpec(
        name=name, kind=kind, d=d, k=k, seed=seed, file_path=raw.get("file_path"),
        trust_unstamped=bool(raw.get("trust_unstamped", False)),
        parametrization=raw.get("parametrization", "cayley"),
        stamp=stamp(name, kind, k, d, site, address, model, digest),
        trained_by=trainer[0] if trainer else None)
    if spec.file_path is not None and not is_uri(spec.file_path) and not step_source(spec.file_path):
        check_bundle(spec)
    return spec


def featurizers_node(document: dict, addresses: dict[str, Address], model: ModelRef,
                     digest: str) -> Featurizers | None:
    """The node the compiler puts first whenever featurizers are declared; None otherwise."""
    declared: dict[str, Any] = document.get("featurizers") or {}
    if not declared:
        return None
    sites, trainers = sites_of(document), _trainers(document)
    specs = tuple(
        _spec(name, raw, sites[name], addresses[sites[name]], trainers.get(name), model, digest,
              document)
        for name, raw in declared.items())
    return Featurizers(name=NODE_NAME, featurizers=specs)
