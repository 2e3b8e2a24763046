"""Cache entries appear whole or not at all: built in a staging folder, then one rename.

A first use killed half-way leaves only a dot-named staging folder, which no lookup trusts.
Folders are made with the process's umask, like any folder the user makes, so a cache shared
by a group (``CAUSALAB_HOME`` on a cluster, ``umask 002``) is readable by the group; a
``tempfile`` folder would be 0700 whatever the umask. Knows nothing of what is built inside.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def staging_folder(root: Path, name: str) -> Path:
    """A new hidden folder ``root/.<name>-<random>`` to build into, its mode from the umask."""
    while True:
        folder = root / f".{name}-{secrets.token_hex(6)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def _follow_umask(folder: Path) -> None:
    """Give every file in ``folder`` the mode a new file gets from the umask: safetensors
    writes a checkpoint's weights 0600 whatever the umask, which a group's cache cannot read."""
    probe = folder / f".mode-{secrets.token_hex(6)}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    mode = stat.S_IMODE(probe.stat().st_mode)
    probe.unlink()
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def publish(staging: Path, final: Path, marker: str) -> None:
    """Rename a finished ``staging`` folder to ``final``, its files' modes from the umask. A
    concurrent first use that got there first (``final/marker`` present) wins quietly; any
    other failure is raised."""
    _follow_umask(staging)
    try:
        os.rename(staging, final)
    except OSError:
        if not (final / marker).is_file():
            raise
