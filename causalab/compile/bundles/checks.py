"""Bundle checks at compile time: read a safetensors header and compare its stamp.

Needs no torch and no model: :func:`read_header` parses the safetensors JSON header by
hand, so a bundle that is missing, corrupt, of the wrong kind, or stamped for another
site or model, or whose tensors differ from the stamp's digest (compile/bundles/integrity.py), is
refused (C8) before any weight loads. Published dictionaries are
SAELens tensors in one file or SAELens's own directory (``cfg.json`` +
``sae_weights.safetensors``), whose cfg is its identity (compile/bundles/saelens.py). A ``runs:/``
bundle is checked the same way once a resolver (the tracking layer's) gives its local path.
Every refusal is a CompileError at ``featurizers.<name>.file_path``. Loading tensors is the
engine's (engine/bundle_files.py).
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Callable

from causalab.compile.bundles import saelens
from causalab.compile.bundles.integrity import check_tensors
from causalab.document.references import step_source  # noqa: F401  (the engine reads it here)
from causalab.errors import CausalabError, CompileError, Path
from causalab.files import BASIS_KEY, SAELENS_CONFIG, SAELENS_WEIGHTS, TENSOR_KEY

IDENTITY_KEYS = (
    "kind", "k", "d", "parametrization", "site", "component", "layer", "heads", "units",
    "model_key", "model_revision", "model_dtype", "model_control",
)
SAE_TENSORS = ("W_enc", "W_dec", "b_enc", "b_dec")  # a plain (non-SAELens) dictionary file
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
# Bytes per element of each safetensors dtype; any other dtype is refused.
_DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2,
                "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
                "F64": 8}
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


def _is_count(value) -> bool:
    return type(value) is int and value >= 0


def _span(name: str, entry) -> tuple[int, int]:
    """A tensor entry's ``(begin, end)`` in the data section, once its dtype, shape and
    offsets are well formed and the byte length is the shape's."""
    if not isinstance(entry, dict):
        raise ValueError(f"tensor {name} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _DTYPE_SIZES:
        raise ValueError(f"tensor {name} has an unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise ValueError(f"tensor {name} has a malformed shape")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(n) for n in offsets)
            or offsets[0] > offsets[1]):
        raise ValueError(f"tensor {name} has malformed data_offsets")
    length = math.prod(shape) * _DTYPE_SIZES[dtype]
    if offsets[1] - offsets[0] != length:
        raise ValueError(f"tensor {name} spans {offsets[1] - offsets[0]} bytes; "
                         f"its shape {shape} of {dtype} needs {length}")
    return offsets[0], offsets[1]


def _check_layout(header: dict, data: int) -> None:
    """What safetensors itself requires: string metadata, and tensors that tile the ``data``
    bytes exactly, in offset order, with no overlap and no hole."""
    metadata = header.get("__metadata__")
    if metadata is not None and (not isinstance(metadata, dict)
                                 or not all(isinstance(v, str) for v in metadata.values())):
        raise ValueError("__metadata__ is not an object of strings")
    spans = sorted((*_span(name, entry), name) for name, entry in header.items()
                   if name != "__metadata__")
    end = 0
    for begin, stop, name in spans:
        if begin != end:
            raise ValueError(f"tensor {name} starts at byte {begin}, not {end}: the data offsets "
                             "overlap or leave a hole")
        end = stop
    if end != data:
        raise ValueError(f"the tensors end at byte {end}, the data section has {data} (truncated?)")


def _header(path: str, at: Path) -> dict:
    """The parsed safetensors header of ``path`` (a file or a SAELens directory), refused (C8)
    unless it describes the file's bytes as the safetensors format requires."""
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
        _check_layout(header, size - 8 - length)
    except (OSError, ValueError, RecursionError) as exc:
        raise CompileError(at, f"unreadable bundle {file}: {exc}") from None
    return header


def layout_header(path: str, *, at: Path = ()) -> dict:
    """The parsed header of any safetensors file causalab reads or re-stamps (integer tensors
    allowed), refused at ``at`` unless it describes the file's bytes exactly."""
    return _header(path, at)


def read_header(path: str, *, at: Path = ()) -> dict:
    """A bundle's safetensors header: ``{tensor name: {dtype, shape, data_offsets}}`` and
    ``__metadata__`` (strings), refused at ``at`` unless every tensor is floating point."""
    header = _header(path, at)
    bad = [name for name, entry in header.items()
           if name != "__metadata__" and entry.get("dtype") not in _FLOAT_DTYPES]
    if bad:
        raise CompileError(at, f"bundle tensors must be floating point; not: {', '.join(bad)}")
    header["__metadata__"] = dict(header.get("__metadata__") or {})
    return header


def read_stamp(path: str, *, at: Path = ()) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """``(metadata, {tensor name: shape})`` of a bundle, from its header alone (no torch).

    ``path`` is a ``.safetensors`` file or a SAELens directory. A missing or unreadable
    bundle raises CompileError at ``at``.
    """
    header = read_header(path, at=at)
    metadata = header.pop("__metadata__")
    return metadata, {name: tuple(entry["shape"]) for name, entry in header.items()}


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


def check_identity(metadata: dict[str, str], stamp: dict[str, str], at: Path) -> None:
    """Refuse at ``at`` a bundle whose stamped identity differs from the document's: shared by
    a bundle file (here) and a featurizer published by an earlier step (the engine)."""
    for key in IDENTITY_KEYS:
        if key not in metadata:
            continue
        if key == "k" and "k" not in stamp:
            continue  # sae/linear take k from the bundle
        said, implied = metadata[key], stamp.get(key, "")
        if said != implied:
            hint = (f" (the bundle was fitted on the model's {said} control, not the checkpoint; "
                    f"give the featurizer control: {said!r} to use it as such)"
                    if key == "model_control" and not implied else "")
            raise CompileError(at, f"{key}: bundle says {said or '<none>'}, "
                                   f"document says {implied or '<none>'}{hint}")


def _shape_error(at: Path, kind: str, name: str, found, wanted) -> CompileError:
    return CompileError(at, f"{kind} bundle tensor {name} has shape {list(found)}, expected {list(wanted)}")


def check_shapes(kind: str, shapes: dict, d: int, k: int | None, at: Path) -> None:
    """Tensor names and shapes against the kind, refused at ``at``: the input width must
    equal the site's ``d`` (and the rank ``k`` where the kind has one)."""
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
    allowed = {TENSOR_KEY, BASIS_KEY} if kind == "subspace" else {TENSOR_KEY}
    if TENSOR_KEY not in shapes or not set(shapes) <= allowed:
        raise CompileError(at, f"a {kind} bundle holds {' and '.join(sorted(allowed))}; "
                               f"found {', '.join(sorted(shapes)) or 'nothing'}")
    wanted = (d,) if kind == "gate" else (d, k)
    for name, shape in shapes.items():
        if shape != wanted:
            raise _shape_error(at, kind, name, shape, wanted)


def resolve_bundle(file_path: str, resolver: Resolver | None, at: Path) -> str:
    """The bundle's local path. A tracking store that cannot give it, or a URI with no store
    to ask, is refused at ``at`` in one line."""
    try:
        local = local_bundle_path(file_path, resolver)
    except CausalabError as error:
        raise CompileError(at, error.message) from None
    if is_uri(local):
        raise CompileError(at, f"{file_path} names a tracked run, and no tracking store is set "
                               "to fetch it from (run with tracking, or give --tracking-uri)")
    return local


def _saelens_config(path: str, spec, at: Path) -> tuple[dict, str] | None:
    """``(normalised SAELens config, where it came from)`` of an sae/linear bundle: its
    cfg.json, else the document's ``saelens`` block; None for a plain dictionary file with
    neither. A cfg.json that names no hook takes the block's ``hook_name``, if it has one."""
    block = getattr(spec, "saelens", None) or {}
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_file = os.path.join(directory, SAELENS_CONFIG)
    own = os.path.isdir(path) or os.path.basename(path) == SAELENS_WEIGHTS
    if own and os.path.isfile(config_file):
        try:
            with open(config_file, encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError, RecursionError) as exc:
            raise CompileError(at, f"unreadable {config_file}: {exc}") from None
        config = saelens.normalise(config, at, config_file)
        if "hook_name" not in config and block.get("hook_name"):
            config["hook_name"] = block["hook_name"]
        return config, config_file
    if own or block:
        return saelens.from_document(block, at, config_file), saelens.BLOCK
    return None


def _check_dictionary(spec, config: dict, source: str, header: dict, at: Path) -> dict:
    """A SAELens dictionary's options, after its cfg, tensors and site are checked."""
    options = saelens.check(config, header, spec.stamp, at, source)
    enc = tuple(header["W_enc"]["shape"])
    if enc[0] != spec.d or (spec.k is not None and enc[1] != spec.k):
        raise _shape_error(at, spec.kind, "W_enc", enc, (spec.d, spec.k if spec.k is not None else "k"))
    width = enc[1]
    wanted = {"W_dec": (width, spec.d), "b_dec": (spec.d,)}
    wanted.update({name: (width,) for name in ("b_enc", "threshold", "b_gate", "b_mag", "r_mag")})
    for name, entry in header.items():
        if name in wanted and tuple(entry["shape"]) != wanted[name]:
            raise _shape_error(at, spec.kind, name, entry["shape"], wanted[name])
    if spec.kind == "linear":
        options.pop("architecture", None)
        options.pop("k", None)
        options.pop("rescale_acts_by_decoder_norm", None)
    return options


def check_bundle(spec, *, resolver: Resolver | None = None, notes: list | None = None) -> dict:
    """Refuse a FeaturizerSpec's bundle that is missing, corrupt, changed since it was stamped
    (its tensors against the stamp's digest), not finite, of the wrong kind, stamped for
    something else, or unstamped without ``trust_unstamped``; return the featurizer's options
    (an SAE's architecture and cfg switches). No torch, no model.

    A SAELens directory (or a weights file whose document block says its cfg) is its own
    identity: no stamp or ``trust_unstamped`` is needed, its cfg is checked instead. A stamp
    without a digest (one deleted key would defeat the tamper check) is refused unless the
    document trusts it (``trust_unstamped``); then why its tensors went unchecked is appended
    to ``notes``.
    """
    at: Path = ("featurizers", spec.name, "file_path")
    path = resolve_bundle(spec.file_path, resolver, at)
    if spec.kind not in _SAE_KINDS and os.path.isdir(path):  # only SAELens ships folders
        raise CompileError(at, f"{path} is a folder; a {spec.kind} bundle is one .safetensors file")
    header = read_header(path, at=at)
    shown = None
    if is_uri(spec.file_path):  # name what the author wrote, not the download cache's copy
        shown = spec.file_path + (f"/{SAELENS_WEIGHTS}" if os.path.isdir(path) else "")
    digested = check_tensors(weights_file(path), header, at, shown=shown)
    metadata = header.pop("__metadata__", None) or {}
    config = _saelens_config(path, spec, at) if spec.kind in _SAE_KINDS else None
    if is_stamped(metadata):
        check_identity(metadata, document_stamp(spec), at)
        if not digested and not spec.trust_unstamped:
            raise CompileError(at, f"{shown or weights_file(path)}: its stamp has no tensor "
                                   f"digest, so an edit to its tensors would go unseen; re-stamp "
                                   f"it (causalab restamp {weights_file(path)}) or set "
                                   "trust_unstamped: true to load it unchecked")
        if not digested and notes is not None:
            notes.append(f"{spec.file_path}: tensors not checked: its stamp has no digest, "
                         f"trusted as the document says (re-stamp it: causalab restamp "
                         f"{weights_file(path)})")
    elif config is None and not spec.trust_unstamped:
        raise CompileError(at, "bundle has no identity stamp; set trust_unstamped: true to load it "
                               "(only shapes are then checked)")
    if config is not None:
        return _check_dictionary(spec, *config, header, at)
    shapes = {name: tuple(entry["shape"]) for name, entry in header.items()}
    check_shapes(spec.kind, shapes, spec.d, spec.k, at)
    return {}
