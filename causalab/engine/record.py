"""What a run leaves on disk: document files, ``run.json``, metric tables and tensor saves.

Every file is written to a temporary name in its own directory and renamed into place, so
nothing half-written ever looks finished; a write given its ``root`` never lands outside it.
Formatting is fixed (``json_text``: a table one row per line, a record indented by one space),
so two runs of one document give byte-identical tables and run records. It never traces and
never decides what to save: the walk names the value and the path.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from causalab.engine.containment import inside
from causalab.files import RUN_RECORD, TENSOR_KEY

_VERSIONED = ("torch", "transformers", "nnsight", "nnterp", "pydantic")
_PACKAGE = Path(__file__).resolve().parents[1]


def atomic(path: str | Path, write: Callable[[str], None], *, root: str | Path | None = None) -> str:
    """Call ``write(temporary_path)`` and rename the result onto ``path``; returns ``path``.

    With ``root``, the real path (symlinks followed) must stay under the real ``root``, checked
    before the directory is made and again after (a symlink made meanwhile).
    """
    target = Path(path)
    if root is not None:
        inside(root, target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    if root is not None:
        inside(root, target)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part",
                                         dir=target.parent)
    os.close(handle)
    try:
        write(temporary)
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return str(target)


def write_text(path: str | Path, text: str, *, root: str | Path | None = None) -> str:
    def _write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
    return atomic(path, _write, root=root)


def write_json(path: str | Path, value: Any, *, root: str | Path | None = None) -> str:
    """A JSON file in the one fixed format every table and record uses."""
    return write_text(path, json_text(value), root=root)


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
    from safetensors.torch import save_file

    plain = {TENSOR_KEY: tensor.detach().to("cpu").contiguous()}
    return atomic(path, lambda temporary: save_file(plain, temporary, metadata=metadata_),
                  root=root)


def write_tensors(path: str | Path, tensors: dict[str, Any],
                  metadata_: dict[str, str] | None = None, *,
                  root: str | Path | None = None) -> str:
    """A bundle of several named tensors (a subspace's ``weight`` and ``basis``)."""
    from safetensors.torch import save_file

    plain = {name: t.detach().to("cpu").float().contiguous() for name, t in tensors.items()}
    return atomic(path, lambda temporary: save_file(plain, temporary, metadata=metadata_),
                  root=root)


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
