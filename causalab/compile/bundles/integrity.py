"""A bundle's tensors against its stamp: the digest of their bytes, and finiteness.

Every safetensors file causalab writes carries, beside its identity stamp, ``tensors_sha256``:
a JSON object of tensor name -> SHA-256 over that tensor's name, dtype, shape and data bytes
(docs/format.md §8.3). Checking one reads the file's data section once through a memory map
and needs neither torch nor a model; the same pass refuses NaN or Inf in a float tensor (its
exponent bits all ones). A file whose stamp has no digest (another tool's, or one written
before causalab stamped its bytes) is reported as not checked, never silently passed.
Refusals are CompileErrors at the caller's path, naming the file and the tensor.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import mmap
import os

from causalab.errors import CompileError, Path

DIGEST_KEY = "tensors_sha256"
# Exponent bits of each float dtype: all set means Inf or NaN.
_EXPONENT = {"F16": ("<u2", 0x7C00), "BF16": ("<u2", 0x7F80), "F32": ("<u4", 0x7F800000),
             "F64": ("<u8", 0x7FF0000000000000)}


def tensor_digest(name: str, dtype: str, shape, data) -> str:
    """SHA-256 of one tensor: its name, dtype and shape (as written) and its bytes.

    >>> tensor_digest("weight", "F32", [1], b"\\x00" * 4)[:12]
    '886fbe22400f'
    """
    digest = hashlib.sha256()
    head = json.dumps([name, dtype, list(shape)], separators=(",", ":"))
    digest.update(head.encode("utf-8", "surrogatepass") + b"\0")
    digest.update(data)
    return digest.hexdigest()


def header_digests(header: dict, data) -> dict[str, str]:
    """Each tensor's digest, from a parsed header and the data section's bytes ``data``."""
    out = {}
    for name, entry in sorted(header.items()):
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = tensor_digest(name, entry["dtype"], entry["shape"], data[begin:end])
    return out


def digest_text(digests: dict[str, str]) -> str:
    """The ``tensors_sha256`` value: the digests as compact JSON, names sorted."""
    return json.dumps(digests, sort_keys=True, separators=(",", ":"))


def _non_finite(dtype: str, data) -> int:
    if dtype not in _EXPONENT or not len(data):
        return 0
    import numpy

    kind, mask = _EXPONENT[dtype]
    bits = numpy.frombuffer(data, dtype=kind)
    return int(numpy.count_nonzero((bits & numpy.array(mask, dtype=kind)) == mask))


def _said(metadata: dict, file: str, at: Path) -> dict | None:
    text = metadata.get(DIGEST_KEY)
    if text is None:
        return None
    try:
        said = json.loads(text)
    except ValueError:
        said = None
    if not isinstance(said, dict) or not all(isinstance(v, str) for v in said.values()):
        raise CompileError(at, f"{file}: its stamp's {DIGEST_KEY} is not an object of digests")
    return said


def check_tensors(file: str, header: dict, at: Path, *, shown: str | None = None,
                  finite: bool = True) -> bool:
    """Refuse at ``at`` a file whose tensors differ from its stamp's digest (naming the first
    that does) or, with ``finite``, hold NaN or Inf; True when a digest was checked, False
    when it has none. ``shown`` names the file in a refusal (a URI for a download).

    ``header`` is the file's parsed, layout-checked safetensors header. The answer is kept
    per file state (path, size, modification and change times, inode), so a sweep's points
    read a bundle once and a file changed since is read again.
    """
    status = os.stat(file)
    key = (os.path.realpath(file), status.st_size, status.st_mtime_ns, status.st_ctime_ns,
           status.st_ino, finite)
    return _checked(key, file, json.dumps(header, sort_keys=True), at, shown or file)


@functools.lru_cache(maxsize=64)
def _checked(key: tuple, file: str, header_text: str, at: Path, shown: str) -> bool:
    header = json.loads(header_text)
    said = _said(header.get("__metadata__") or {}, shown, at)
    with open(file, "rb") as handle:
        start = 8 + int.from_bytes(handle.read(8), "little")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped, \
                memoryview(mapped) as whole:
            _compare(shown, header, (whole, start), said, at, finite=key[-1])
    return said is not None


def _compare(file: str, header: dict, data: tuple, said: dict | None, at: Path, *,
             finite: bool) -> None:
    names = sorted(name for name in header if name != "__metadata__")
    if said is not None:
        for name in sorted(set(said) - set(names)):
            raise CompileError(at, f"{file}: tensor {name} is in its stamp's digest but not in "
                                   "the file")
    whole, start = data
    for name in names:
        entry = header[name]
        begin, end = entry["data_offsets"]
        with whole[start + begin:start + end] as chunk:
            changed = said is not None and name in said and tensor_digest(
                name, entry["dtype"], entry["shape"], chunk) != said[name]
            bad = _non_finite(entry["dtype"], chunk) if finite else 0
        if said is not None and name not in said:
            raise CompileError(at, f"{file}: tensor {name} is not in its stamp's digest "
                                   "(added after the file was stamped?)")
        if changed:
            raise CompileError(at, f"{file}: tensor {name} differs from its stamp's digest "
                                   "(changed after it was saved); if the change is meant, "
                                   "re-stamp it (causalab restamp FILE)")
        if bad:  # C21
            raise CompileError(at, f"{file}: bundle tensor {name} holds {bad} NaN or Inf "
                                   f"values of {math.prod(entry['shape'])}; a featurizer must "
                                   "be finite")
