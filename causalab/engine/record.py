"""What a run leaves on disk: document files, ``run.json``, metric tables and tensor saves.

Every file is written to a temporary name in its own directory and renamed into place, so
nothing half-written ever looks finished; a write given its ``root`` never lands outside it.
Formatting is fixed (``json_text``: a table one row per line, a record indented by one space),
so two runs of one document give byte-identical tables and run records. It never traces and
never decides what to save: the walk names the value and the path.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import secrets
from importlib import metadata
from pathlib import Path
from typing import Any

from causalab.engine.containment import OUT_FLAG, inside, under
from causalab.errors import RunError
from causalab.files import RUN_RECORD, TENSOR_KEY

_VERSIONED = ("torch", "transformers", "nnsight", "nnterp", "pydantic")
_PACKAGE = Path(__file__).resolve().parents[1]
# Where Linux names the directory an open descriptor refers to.
_DESCRIPTORS = "/proc/self/fd"


def atomic(path: str | Path, data: bytes, *, root: str | Path | None = None) -> str:
    """Write ``data`` to a temporary file beside ``path`` and rename it onto ``path``.

    With ``root``, the real path (symlinks followed) must stay under the real ``root``: checked
    before the directory is made and again after, and where the system names a descriptor's
    directory (``/proc/self/fd``) the directories are then opened one by one from the real
    root, each checked where it really is, and the file is written and renamed through the
    last one's descriptor: a symlink swapped in meanwhile cannot carry the write elsewhere.
    """
    target = Path(path)
    if root is not None:
        inside(root, target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    if root is None:
        return _replace(target, data, None)
    inside(root, target)
    folder = _pinned(root, target.parent)
    try:
        return _replace(target, data, folder)
    finally:
        if folder is not None:
            os.close(folder)


def _replace(target: Path, data: bytes, folder: int | None) -> str:
    """The write itself: in ``target``'s directory, or through the descriptor ``folder``."""
    name = f".{target.name}.{secrets.token_hex(6)}.part"
    place = {"dir_fd": folder} if folder is not None else {}
    temporary = name if folder is not None else str(target.parent / name)
    # 0o666 less the umask, as any file the user writes: group-readable under umask 002
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666,
                     **place)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        if folder is None:
            os.replace(temporary, target)
        else:
            os.replace(temporary, target.name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, **place)
        raise
    return str(target)


def _pinned(root: str | Path, folder: Path) -> int | None:
    """A descriptor of ``folder``, reached from the real ``root`` one directory at a time,
    each found (by ``/proc/self/fd``) to lie under the real root; None on a system without
    it, or a folder not named below ``root``."""
    if not os.path.isdir(_DESCRIPTORS):
        return None
    try:
        parts = Path(os.path.abspath(folder)).relative_to(os.path.abspath(root)).parts
    except ValueError:
        return None
    real_root = os.path.realpath(root)
    descriptor = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = below
            real = os.readlink(f"{_DESCRIPTORS}/{descriptor}")
            if not under(real_root, real):
                raise RunError(OUT_FLAG, f"{folder} is now {real}, outside {real_root} (a "
                                         "symlink made during the run?); nothing is written there")
    except OSError as error:
        os.close(descriptor)
        raise RunError(OUT_FLAG, f"cannot write under {folder}: {error.strerror}") from None
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def write_text(path: str | Path, text: str, *, root: str | Path | None = None) -> str:
    return atomic(path, text.encode("utf-8"), root=root)


def write_json(path: str | Path, value: Any, *, root: str | Path | None = None) -> str:
    """A JSON file in the one fixed format every table and record uses."""
    return write_text(path, json_text(value), root=root)


def write_safetensors(path: str | Path, tensors: dict[str, Any],
                      metadata_: dict[str, str] | None = None, *,
                      root: str | Path | None = None) -> str:
    """Named tensors (already on the CPU, contiguous) as one safetensors file, the same
    bytes for the same tensors and metadata (``canonical_safetensors``), its metadata carrying
    the digest of the tensors' bytes (compile/bundles/integrity.py) beside any stamp."""
    from safetensors.torch import save

    data = save(tensors, metadata=metadata_)
    return atomic(path, canonical_safetensors(data, digest=True), root=root)


def canonical_safetensors(data: bytes, *, digest: bool = False) -> bytes:
    """``data`` (a safetensors file) with its header's keys sorted. The library writes the
    metadata from a hash map whose order changes from one save to the next, so the same
    tensors and metadata came out as other bytes each time; the tensor data is untouched
    (its offsets count from the header's end) and the header is padded to 8 bytes, as the
    library pads it. ``digest`` puts each tensor's digest into the metadata (re-stamping)."""
    from causalab.compile.bundles.integrity import DIGEST_KEY, digest_text, header_digests

    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    if digest:
        metadata = header.setdefault("__metadata__", {})
        metadata[DIGEST_KEY] = digest_text(header_digests(header, memoryview(data)[8 + size:]))
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + size:]


def json_text(value: Any) -> str:
    """A table (a list) is one row per line, each row by the C encoder (``indent`` would
    send every row through the pure-Python one); anything else is indented by one space.

    >>> print(json_text([{"a": 1}, {"a": 2}]))
    [
     {"a": 1},
     {"a": 2}
    ]
    """
    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(" " + json.dumps(item) for item in value) + "\n]"
    return json.dumps(value, indent=1)


def write_tensor(path: str | Path, tensor: Any, metadata_: dict[str, str] | None = None, *,
                 root: str | Path | None = None) -> str:
    """A tensor save: safetensors with the tensor under ``weight`` (and a stamp if given)."""
    return write_safetensors(path, {TENSOR_KEY: tensor.detach().to("cpu").contiguous()},
                             metadata_, root=root)


def write_tensors(path: str | Path, tensors: dict[str, Any],
                  metadata_: dict[str, str] | None = None, *,
                  root: str | Path | None = None) -> str:
    """A bundle of several named tensors (a subspace's ``weight`` and ``basis``)."""
    plain = {name: t.detach().to("cpu").float().contiguous() for name, t in tensors.items()}
    return write_safetensors(path, plain, metadata_, root=root)


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """SHA-256 over causalab's own ``.py`` files, concatenated in path order; once per
    process, so it names the code this process imported."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py"), key=lambda p: p.relative_to(_PACKAGE).as_posix()):
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _version(name: str) -> str:
    """An installed distribution's version: read once per process (installs do not change
    under a running process, and each lookup parses the package's metadata)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def run_record(engine: str, batch_size: int | None, served_dtype: str) -> dict:
    """The ``run.json`` fields (docs/format.md §13): no host, time or absolute path in it."""
    return {
        "engine": engine,
        "remote": False,
        "batch_size": batch_size,
        "versions": {name: _version(name) for name in _VERSIONED},
        "causalab": package_digest(),
        "served_dtype": served_dtype,
    }


def write_run_record(out: str | Path, engine: str, batch_size: int | None, served_dtype: str) -> str:
    return write_json(Path(out) / RUN_RECORD, run_record(engine, batch_size, served_dtype),
                      root=out)
