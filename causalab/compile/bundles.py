"""Bundle checks at compile time: read a safetensors header and compare its stamp.

Needs no torch and no model: :func:`read_stamp` parses the safetensors JSON header by
hand, so a bundle that is missing, corrupt, of the wrong kind, or stamped for another
site or model is refused (C8) before any weight loads. Published dictionaries are
SAELens tensors in one file or SAELens's own directory (``cfg.json`` +
``sae_weights.safetensors``). Every refusal is a CompileError at
``featurizers.<name>.file_path``. Loading tensors is the engine's (engine/bundles.py).
"""
from __future__ import annotations

import json
import os
import re
from typing import Callable

from causalab.errors import CompileError, Path
from causalab.files import SAELENS_CONFIG, SAELENS_WEIGHTS, TENSOR_KEY

IDENTITY_KEYS = (
    "kind", "k", "d", "parametrization", "site", "component", "layer", "heads", "units",
    "model_key", "model_revision", "model_dtype",
)
SAE_TENSORS = ("W_enc", "W_dec", "b_enc", "b_dec")
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_MAX_HEADER = 100 * 1024 * 1024
_SAE_KINDS = ("sae", "linear")
_BASIS_KINDS = ("subspace", "pca")

Resolver = Callable[[str], str]
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def is_uri(file_path: str) -> bool:
    """A ``runs:/`` (or other scheme) bundle: fetched and checked where the run runs."""
    return _URI.match(file_path) is not None


def local_bundle_path(file_path: str, resolver: Resolver | None = None) -> str:
    """The local path of a bundle. A URI (``runs:/<id>/<path>``) goes through ``resolver``,
    which the tracking layer supplies; anything else is returned unchanged."""
    if resolver is not None and is_uri(file_path):
        return resolver(file_path)
    return file_path


def weights_file(path: str) -> str:
    return os.path.join(path, SAELENS_WEIGHTS) if os.path.isdir(path) else path


def _header(path: str, at: Path) -> dict:
    """The parsed safetensors header of ``path`` (a file or a SAELens directory)."""
    file = weights_file(path)
    if not os.path.isfile(file):
        raise CompileError(at, f"bundle not found: {file}")
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if length <= 0 or length > min(_MAX_HEADER, size - 8):
                raise ValueError("header length out of range")
            header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
        if max(ends, default=0) != size - 8 - length:
            raise ValueError("data section does not match the header (truncated?)")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise CompileError(at, f"unreadable bundle {file}: {exc}") from None
    return header


def read_stamp(path: str, *, at: Path = ()) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """``(metadata, {tensor name: shape})`` of a bundle, from its header alone (no torch).

    ``path`` is a ``.safetensors`` file or a SAELens directory. A missing or unreadable
    bundle raises CompileError at ``at``.
    """
    header = _header(path, at)
    metadata = header.pop("__metadata__", None) or {}
    shapes = {name: tuple(entry["shape"]) for name, entry in header.items()}
    bad = [name for name, entry in header.items() if entry.get("dtype") not in _FLOAT_DTYPES]
    if bad:
        raise CompileError(at, f"bundle tensors must be floating point; not: {', '.join(bad)}")
    return {str(key): str(value) for key, value in metadata.items()}, shapes


def document_stamp(spec) -> dict[str, str]:
    """The identity a FeaturizerSpec implies: its compiled stamp, with kind, d, k and
    parametrization taken from the spec's own fields (k only when the document fixes it)."""
    stamp = {key: str(value) for key, value in spec.stamp.items()}
    stamp.update(kind=spec.kind, d=str(spec.d), parametrization=spec.parametrization)
    if spec.k is not None:
        stamp["k"] = str(spec.k)
    else:
        stamp.pop("k", None)
    return stamp


def is_stamped(metadata: dict[str, str]) -> bool:
    return any(key in metadata for key in IDENTITY_KEYS)


def _check_identity(metadata: dict[str, str], stamp: dict[str, str], at: Path) -> None:
    for key in IDENTITY_KEYS:
        if key not in metadata:
            continue
        if key == "k" and "k" not in stamp:
            continue  # sae/linear take k from the bundle
        said, implied = metadata[key], stamp.get(key, "")
        if said != implied:
            raise CompileError(at, f"{key}: bundle says {said or '<none>'}, "
                                   f"document says {implied or '<none>'}")


def _check_saelens_config(path: str, kind: str, at: Path) -> None:
    config_file = os.path.join(path, SAELENS_CONFIG)
    try:
        with open(config_file, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise CompileError(at, f"SAELens directory without a readable {SAELENS_CONFIG}: {exc}") from None
    architecture = config.get("architecture", "standard")
    if kind == "sae" and architecture != "standard":
        raise CompileError(at, f"SAELens architecture {architecture!r} is not a ReLU sae; "
                               "only 'standard' loads as kind sae")
    if config.get("normalize_activations") not in (None, "none"):
        raise CompileError(at, "SAELens normalize_activations is not supported: "
                               f"{config.get('normalize_activations')!r}")


def _shape_error(at: Path, kind: str, name: str, found, wanted) -> CompileError:
    return CompileError(at, f"{kind} bundle tensor {name} has shape {list(found)}, expected {list(wanted)}")


def _check_shapes(kind: str, shapes: dict, d: int, k: int | None, at: Path) -> None:
    """Tensor names and shapes against the kind: input width must equal the site's d."""
    if kind in _SAE_KINDS:
        extra = sorted(set(shapes) - set(SAE_TENSORS))
        if "W_enc" not in shapes or extra:
            raise CompileError(at, f"an {kind} bundle holds {', '.join(SAE_TENSORS)} (W_enc required); "
                                   f"found {', '.join(sorted(shapes)) or 'nothing'}")
        enc = shapes["W_enc"]
        if len(enc) != 2 or enc[0] != d or (k is not None and enc[1] != k):
            raise _shape_error(at, kind, "W_enc", enc, (d, k if k is not None else "k"))
        width = enc[1]
        wanted = {"W_dec": (width, d), "b_enc": (width,), "b_dec": (d,)}
        for name, shape in wanted.items():
            if name in shapes and shapes[name] != shape:
                raise _shape_error(at, kind, name, shapes[name], shape)
        return
    if set(shapes) != {TENSOR_KEY}:
        raise CompileError(at, f"a {kind} bundle holds one tensor {TENSOR_KEY!r}; "
                               f"found {', '.join(sorted(shapes)) or 'nothing'}")
    wanted = (d,) if kind == "gate" else (d, k)
    if shapes[TENSOR_KEY] != wanted:
        raise _shape_error(at, kind, TENSOR_KEY, shapes[TENSOR_KEY], wanted)


def check_bundle(spec, *, resolver: Resolver | None = None) -> None:
    """Refuse a FeaturizerSpec's bundle that is missing, corrupt, of the wrong kind, stamped
    for something else, or unstamped without ``trust_unstamped``. No torch, no model."""
    at: Path = ("featurizers", spec.name, "file_path")
    path = local_bundle_path(spec.file_path, resolver)
    metadata, shapes = read_stamp(path, at=at)
    if os.path.isdir(path):
        _check_saelens_config(path, spec.kind, at)
    if is_stamped(metadata):
        _check_identity(metadata, document_stamp(spec), at)
    elif not spec.trust_unstamped:
        raise CompileError(at, "bundle has no identity stamp; set trust_unstamped: true to load it "
                               "(only shapes are then checked)")
    _check_shapes(spec.kind, shapes, spec.d, spec.k, at)


def saelens_options(path: str) -> dict:
    """Featurizer options a SAELens directory's ``cfg.json`` carries (empty for a file)."""
    if not os.path.isdir(path):
        return {}
    with open(os.path.join(path, SAELENS_CONFIG), encoding="utf-8") as handle:
        config = json.load(handle)
    return {"apply_b_dec_to_input": bool(config.get("apply_b_dec_to_input", True))}


