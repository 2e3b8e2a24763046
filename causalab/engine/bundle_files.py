"""Featurizer bundles as tensors: load a checked bundle, write a stamped one.

A bundle causalab writes is a safetensors file with one tensor under ``weight`` and a
``__metadata__`` stamp of strings with the digest of its tensors (docs/format.md §8.3); the
stamp and digest checks live in compile/bundles/checks.py and compile/bundles/integrity.py and run again
here before loading; :func:`restamp` gives an intended edit its new digest. Never compares bytes: a file another
tool wrote may order its header otherwise (causalab's own sort theirs, ``record``), so bundles
are compared by content. :func:`check_plan_bundles` reads
every bundle file a plan loads for NaN and Inf before the run writes anything.
"""
from __future__ import annotations

from causalab.compile.bundles.checks import (  # noqa: F401  (read_stamp re-exported for callers)
    Resolver, check_bundle, document_stamp, is_uri, local_bundle_path, read_stamp, resolve_bundle,
    step_source, weights_file,
)
from causalab.compile.plan import FeaturizerSpec, Featurizers
from causalab.errors import RunError
from causalab.files import TENSOR_KEY


def read_bundle(path: str) -> tuple[dict[str, str], dict]:
    """``(metadata, {name: float32 CPU tensor})`` of a bundle file or SAELens directory."""
    from safetensors import safe_open

    file = weights_file(path)
    with safe_open(file, framework="pt", device="cpu") as handle:
        metadata = dict(handle.metadata() or {})
        # clone: safetensors' buffer can sit off a 16-byte boundary, and CPU matmuls round
        # differently on misaligned memory, so a loaded basis would drift by an ulp.
        tensors = {name: handle.get_tensor(name).float().clone() for name in handle.keys()}
    return metadata, tensors


def _refuse_non_finite(spec, name: str, tensor) -> None:  # R7
    import torch

    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        raise RunError(("featurizers", spec.name, "file_path"), f"bundle tensor {name} holds "
                       f"{int((~finite).sum())} NaN or Inf values of {tensor.numel()}; "
                       "a featurizer must be finite")


def load_bundle(spec, *, resolver: Resolver | None = None) -> tuple[dict, dict]:
    """Check then load a spec's bundle: ``({name: tensor}, featurizer options)``."""
    options = check_bundle(spec, resolver=resolver)
    path = local_bundle_path(spec.file_path, resolver)
    _, tensors = read_bundle(path)
    for name, tensor in tensors.items():
        _refuse_non_finite(spec, name, tensor)
    return tensors, options


def check_finite(spec, *, resolver: Resolver | None = None) -> None:
    """Refuse a spec's bundle file holding NaN or Inf, as :func:`load_bundle` does, reading
    one tensor at a time so a large SAE is never held whole beside the model."""
    from safetensors import safe_open

    at = ("featurizers", spec.name, "file_path")
    file = weights_file(resolve_bundle(spec.file_path, resolver, at))
    with safe_open(file, framework="pt", device="cpu") as handle:
        for name in handle.keys():
            _refuse_non_finite(spec, name, handle.get_tensor(name))


def bundle_files(node, resolver: Resolver | None = None) -> dict[str, FeaturizerSpec]:
    """Each distinct bundle file a plan loads (file path -> the first spec naming it): the
    specs compile checked, so not an earlier step's output nor a URI with no store to ask."""
    found: dict[str, FeaturizerSpec] = {}
    if isinstance(node, Featurizers):
        for spec in node.featurizers:
            path = spec.file_path
            if (path is not None and step_source(path) is None
                    and (resolver is not None or not is_uri(path))):
                found.setdefault(path, spec)
    for child in getattr(node, "children", ()):
        for path, spec in bundle_files(child, resolver).items():
            found.setdefault(path, spec)
    return found


def check_plan_bundles(plan, *, resolver: Resolver | None = None) -> None:
    """Refuse NaN or Inf in any bundle file the plan loads, before the run writes anything."""
    for spec in bundle_files(plan, resolver).values():
        check_finite(spec, resolver=resolver)


def stamp_metadata(stamp: dict[str, str], *, produced_by: str) -> dict[str, str]:
    """A full ``__metadata__``: the identity stamp plus dtype, producer and engine."""
    metadata = {key: str(value) for key, value in stamp.items()}
    metadata.update(featurizer_dtype="fp32", produced_by=produced_by, engine="causalab")
    return metadata


def restamp(path: str) -> list[str]:
    """Re-stamp a bundle on purpose: its metadata's digest recomputed from the tensors it holds
    now (docs/format.md §8.3), every other stamp key kept, the tensor bytes untouched. A
    stamp from before each kind named its own parametrization (``cayley`` on a gate, pca or
    dictionary) is corrected to the kind's. Returns the tensor names; the file is replaced
    atomically. ``causalab restamp FILE`` calls this.
    """
    import json
    import os
    from pathlib import Path

    from causalab.compile.bundles.checks import layout_header
    from causalab.document.vocab import FEATURIZER_KINDS, parametrization_of
    from causalab.engine import record

    file = weights_file(path)
    header = layout_header(file, at=(path,))
    data = Path(file).read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")
    metadata = header.setdefault("__metadata__", {})
    kind = metadata.get("kind")
    if kind in FEATURIZER_KINDS and metadata.get("parametrization") == "cayley":
        metadata["parametrization"] = parametrization_of(kind, "cayley")
    text = json.dumps(header).encode()
    blob = len(text).to_bytes(8, "little") + text + data[start:]
    mode = os.stat(file).st_mode & 0o777
    record.atomic(file, record.canonical_safetensors(blob, digest=True))
    os.chmod(file, mode)
    return sorted(name for name in header if name != "__metadata__")


def weights_results(names, featurizers: dict) -> dict:
    """What a weights step publishes: each named featurizer's ``weight``, detached copies."""
    return {name: featurizers[name].tensors()[TENSOR_KEY].detach().clone() for name in names}


def same_content(first: str, second: str, *, ignore: tuple[str, ...] = ()) -> bool:
    """Whether two bundles hold equal tensors and metadata (keys in ``ignore`` skipped)."""
    import torch

    meta_a, tensors_a = read_bundle(first)
    meta_b, tensors_b = read_bundle(second)
    meta_a = {k: v for k, v in meta_a.items() if k not in ignore}
    meta_b = {k: v for k, v in meta_b.items() if k not in ignore}
    if meta_a != meta_b or set(tensors_a) != set(tensors_b):
        return False
    return all(torch.equal(tensors_a[name], tensors_b[name]) for name in tensors_a)
