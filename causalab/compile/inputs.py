"""What a point reads besides its document: its data tables and bundle files, each by digest.

A tracked point's resume key is its document's digest plus these (docs/platform.md §5): a data
table edited, or a bundle overwritten at the same path, makes an earlier run of the same
document no longer this point's result. A file is hashed once per stamp (mtime, size, inode)
in a process, so the points of a sweep that read one table share one read, and a rerun hashes
only what it reads (data tables are kilobytes; a bundle is read whole by the run anyway).
``runs:/`` bundles are named by their URI, which the document digest already covers, and are
checked against their stamp's digest when fetched.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Iterable

from causalab import files
from causalab.compile.bundles.checks import is_uri

DIGEST_CHARS = 16  # of the SHA-256: 64 bits tell an edit apart, and keep the run's tag short


@functools.lru_cache(maxsize=256)
def _hashed(file: str, stamp: tuple | None) -> str:
    sha = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:DIGEST_CHARS]


def file_digest(path: "str | Path") -> str | None:
    """The digest of a file's bytes, or of a folder's files (names and bytes, in name order);
    None when there is nothing at ``path``."""
    path = Path(path)
    if path.is_file():
        return _hashed(str(path.resolve()), files.stamp(path))
    if not path.is_dir():
        return None
    sha = hashlib.sha256()
    for member in sorted(p for p in path.rglob("*") if p.is_file()):
        sha.update(member.relative_to(path).as_posix().encode() + b"\0")
        sha.update(_hashed(str(member.resolve()), files.stamp(member)).encode())
    return sha.hexdigest()[:DIGEST_CHARS]


def inputs_of(tables: Iterable[str], data_root: str, bundles: Iterable[str]) -> dict[str, str]:
    """``name -> digest`` of what a point reads: each table by its path under the data root,
    each local bundle by its ``file_path`` as the document writes it."""
    root = Path(data_root).resolve()
    found: dict[str, str] = {}
    for table in sorted(set(tables)):
        file = Path(table)
        name = file.relative_to(root).as_posix() if root in file.parents else str(file)
        digest = file_digest(file)
        if digest is not None:
            found[f"data:{name}"] = digest
    for bundle in sorted(set(bundles)):
        digest = None if is_uri(bundle) else file_digest(bundle)
        if digest is not None:
            found[f"bundle:{bundle}"] = digest
    return found
