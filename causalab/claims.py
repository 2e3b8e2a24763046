"""A run's claim on its ``--out`` folder: a lock file naming the owner, held while it runs.

Two runs writing one ``--out`` would each exit 0 and leave a folder mixing both. The first run
creates ``<out>/.causalab-claim.json`` and holds an exclusive ``flock`` on it, with its owner
(user, host, pid, start) written inside; a second run finds the lock held and is refused in one
line naming that owner. The kernel drops the lock when its process dies, even by SIGKILL, so a
dead owner's claim is simply taken over: no pid is guessed alive or dead. The claim is removed
when the run ends, and a folder the claim made is removed again when nothing else was written
to it. Where ``fcntl`` is missing (Windows) a run claims nothing.

    >>> import tempfile
    >>> with claim(tempfile.mkdtemp()):
    ...     pass
"""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from causalab.errors import UsageError
from causalab.files import CLAIM

try:
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms causalab runs on
    fcntl = None


def _owner() -> dict:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return {"owner": f"{user}@{socket.gethostname()}", "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _holder(handle: int) -> str:
    """The owner a held claim names, as one phrase."""
    try:
        found = json.loads(os.pread(handle, 4096, 0) or b"null")
        return f"{found['owner']} (pid {found['pid']}, since {found['started']})"
    except (OSError, ValueError, TypeError, KeyError):
        return "its owner not written yet"


def _take(folder: Path) -> int:
    """An open, locked claim file of ``folder`` holding this process's owner."""
    path = folder / CLAIM
    while True:
        try:
            handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as error:
            raise UsageError(("--out",), f"cannot claim {folder} for this run: {path}: "
                             f"{error.strerror or error}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            os.close(handle)
            raise UsageError(("--out",), f"{folder} is being written by another run: "
                             f"{holder}; wait for it to end or choose another --out") from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(handle).st_ino:
                os.ftruncate(handle, 0)
                os.pwrite(handle, json.dumps(_owner()).encode(), 0)
                return handle
        os.close(handle)  # the file was released and removed while we waited: take a new one


@contextlib.contextmanager
def claim(out: str | os.PathLike) -> Iterator[None]:
    """Hold ``out`` for one run; refuse (``--out``) while another live run holds it."""
    folder = Path(out)
    made = not folder.exists()
    if fcntl is None:
        yield
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(("--out",), f"cannot make {folder}: {error.strerror or error}") from None
    handle = _take(folder)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(folder / CLAIM)
        os.close(handle)
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when the run wrote nothing
