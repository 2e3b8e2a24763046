"""The revision of a checkpoint: a SHA-256 digest over its tensors, and its record on disk.

It hashes names (sorted), dtypes, shapes and raw bytes, so the same weights saved twice (with
different safetensors metadata or shard layout) have one revision. Hashing reads every weight,
so it is done once, where the weights are made (a built-in's materialisation) or first loaded,
and recorded beside them (``RECORD``) with each weight file's size and modification time; a
record whose files still match is the revision without reading a weight (``recorded``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

from causalab.errors import ModelError
from causalab.files import stamp

DIGEST_LENGTH = 64
RECORD = "causalab-revision.json"


def tensor_digest(tensors: dict) -> str:
    """SHA-256 hex of ``{name: torch.Tensor}``, independent of dict order and file layout."""
    import torch

    sha = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        sha.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def _weights(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def directory_digest(path: str | Path) -> str:
    """The tensor digest of every ``*.safetensors`` file in a model directory, merged.

    Remembered in this process per directory and per each file's name and ``files.stamp``, so
    rewritten weights change the key. A directory without weights is a ``ModelError`` at
    ``model.key``.
    """
    directory = Path(path).resolve()
    files = _weights(directory)
    if not files:
        raise ModelError(("model", "key"), f"{path} holds no *.safetensors weights, so its "
                                           "tensor digest (the pinned revision) cannot be checked")
    return _digest_of(str(directory), tuple((f.name, stamp(f)) for f in files))


@functools.lru_cache(maxsize=64)
def _digest_of(directory: str, stamps: tuple) -> str:
    """``tensor_digest`` of every file's tensors, read one tensor at a time (an 8B model's
    files are never in memory at once)."""
    import contextlib

    import torch
    from safetensors import safe_open

    sha = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        where = {}
        for name, _ in stamps:
            handle = stack.enter_context(safe_open(str(Path(directory) / name), "pt"))
            where.update({key: handle for key in handle.keys()})
        for key in sorted(where):
            tensor = where[key].get_tensor(key).contiguous()
            sha.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
            sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
            del tensor
    return sha.hexdigest()


def _file_stamps(directory: Path) -> dict[str, list[int]]:
    """Each weight file's (size, mtime in ns): what a copy that keeps times (``copy2``) keeps."""
    found = {}
    for file in _weights(directory):
        info = file.stat()
        found[file.name] = [info.st_size, info.st_mtime_ns]
    return found


def write_record(path: str | Path, revision: str) -> bool:
    """Record ``revision`` beside the weights of ``path``; False where the folder is read-only.

    Written to a temporary file and renamed, so a reader sees a whole record or none.
    """
    directory = Path(path)
    body = json.dumps({"revision": revision, "files": _file_stamps(directory)}, sort_keys=True)
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{RECORD}-")
    except OSError:
        return False
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(body)
    os.chmod(temporary, 0o644)
    os.replace(temporary, directory / RECORD)
    return True


def recorded(path: str | Path) -> str | None:
    """The recorded revision when every weight file is still the one recorded, else None."""
    directory = Path(path)
    try:
        values = json.loads((directory / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(values, dict) or not looks_like_digest(values.get("revision")):
        return None
    files = _file_stamps(directory)
    return values["revision"] if files and values.get("files") == files else None


def looks_like_digest(revision: str | None) -> bool:
    """True for a 64-digit hex string, the only revision form a tensor digest can take."""
    return (isinstance(revision, str) and len(revision) == DIGEST_LENGTH
            and all(c in "0123456789abcdef" for c in revision))
