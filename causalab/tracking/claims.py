"""Claims: a run holds its ``--out`` folder, and each point it computes, before it starts.

The folder: an exclusive ``flock`` on ``<out>/.causalab-claim.json``, which names its owner;
the kernel drops it when the process dies, even by SIGKILL (docs/format.md §13), so claims
need ``fcntl`` (POSIX: Linux, macOS). The points: each point's run, created RUNNING before
anything computes, goes to its earliest live claim (docs/platform.md §5).

    >>> import tempfile
    >>> with claim(tempfile.mkdtemp()):
    ...     pass
"""
from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from causalab.errors import UsageError
from causalab.files import CLAIM
from causalab.tracking import owners, runs as store, stored


def _owner() -> dict:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
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


@dataclass
class Claims:
    """By digest: done points' runs, why others are not, this run's claims, others' live ones."""

    done: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    mine: dict[str, str] = field(default_factory=dict)
    taken: dict[str, str] = field(default_factory=dict)


def claim_points(mlflow: Any, experiment: str, wanted: Mapping[str, Mapping[str, str]],
                 asked: Mapping[str, tuple[str, dict[str, str]]]) -> Claims:
    """Which of ``wanted`` (digest: inputs) are done; the rest of ``asked`` (digest: its run's
    name and tags, owner included) claimed (won or not)."""
    answer = Claims()
    since = int(time.time() * 1000) - 1000  # a point another run ends after this is seen
    answer.done, answer.why = stored.done_runs(mlflow, experiment, wanted)
    for digest, (name, tags) in asked.items():
        if digest not in answer.done:
            answer.mine[digest] = store.create_run(mlflow, experiment, name,
                                                   {**tags, store.CLAIM: "waiting"})
    if not answer.mine:
        return answer
    query = f"attributes.status = 'RUNNING' and tags.`{store.KIND}` = 'point'"
    running = mlflow.search_runs([experiment], filter_string=query, max_results=5000)
    for digest, run_id in list(answer.mine.items()):
        live = [run for run in running if run.data.tags.get(store.PRODUCED_BY) == digest
                and (run.info.run_id == run_id or _holds(run))]
        first = min(live, key=lambda run: (run.info.start_time or 0, run.info.run_id),
                    default=None)
        if first is not None and first.info.run_id != run_id:
            store.withdraw(mlflow, run_id)
            del answer.mine[digest]
            answer.taken[digest] = _named(first)
    _ended_meanwhile(mlflow, experiment, wanted, answer, since)
    return answer


def _ended_meanwhile(mlflow: Any, experiment: str, wanted: Mapping[str, Mapping[str, str]],
                     answer: Claims, since: int) -> None:
    """A point another run finished between the lookup and the claim is done, not claimed:
    its run was RUNNING at the lookup and is no longer a claim at the election."""
    query = (f"attributes.status = 'FINISHED' and attributes.end_time >= {since} "
             f"and tags.`{store.KIND}` = 'point'")
    for run in mlflow.search_runs([experiment], filter_string=query, max_results=5000):
        digest = run.data.tags.get(store.PRODUCED_BY)
        if digest in answer.mine and store.REUSED_FROM not in run.data.tags \
                and stored.not_done(mlflow, run, wanted.get(digest) or {}) is None:
            store.withdraw(mlflow, answer.mine.pop(digest))
            answer.done[digest] = run.info.run_id


def _holds(run: Any) -> bool:
    """Whether another run's claim stands: its owner is alive on this host."""
    owner = owners.owner_of(run)
    return owner is not None and owner.get("host") == socket.gethostname() \
        and not owners.owner_is_dead(run)


def _named(run: Any) -> str:
    owner = owners.owner_of(run) or {}
    return f"run {run.info.run_id} (pid {owner.get('pid')} on {owner.get('host')})"
