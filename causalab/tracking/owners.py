"""Who owns a run, so a later run can end what a dead process left open.

Every run causalab opens carries ``causalab.owner`` (host, pid, process start). A RUNNING run
whose owner is gone is ended KILLED by the next run of its document, or multirun, and a resumed
sweep reattaches to its old parent (docs/platform.md §5). Owners on another host are never
judged: their processes cannot be seen from here.
"""
from __future__ import annotations

import json
import os
import socket
from typing import Iterable

from causalab.tracking import runs as store

OWNER = "causalab.owner"
_RUNNING = "attributes.status = 'RUNNING'"


def owner_tags() -> dict[str, str]:
    """The ``causalab.owner`` tag of a run this process opens."""
    import psutil

    process = psutil.Process()
    owner = {"host": socket.gethostname(), "pid": process.pid,
             "start": f"{process.create_time():.2f}"}
    return {OWNER: json.dumps(owner, sort_keys=True)}


def owner_of(run) -> dict | None:
    """A run's ``causalab.owner``, None when it has none (or not one causalab wrote)."""
    try:
        owner = json.loads(run.data.tags.get(OWNER) or "null")
    except ValueError:
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def owner_is_dead(run) -> bool:
    """Whether a run's owner is known to be gone: on this host, and its pid absent, a zombie
    (killed, not yet reaped by its parent) or reused by a process that started later."""
    import psutil

    owner = owner_of(run)
    if owner is None or owner.get("host") != socket.gethostname():
        return False
    try:
        process = psutil.Process(owner["pid"])
        if process.status() == psutil.STATUS_ZOMBIE:
            return True
        started = f"{process.create_time():.2f}"
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):
        return False  # alive, someone else's
    return bool(owner.get("start")) and started != owner["start"]


def _kill(mlflow, run) -> None:
    owner = owner_of(run) or {}
    store.kill(mlflow, run.info.run_id, f"KilledOwner: its process {owner.get('host')}:"
                                        f"{owner.get('pid')} died without ending it")


def reap(mlflow, experiment_id: str, digests: Iterable[str], sweep: str | None = None) -> list[str]:
    """End KILLED the RUNNING runs of these point digests (or of this sweep) whose owner died,
    and their RUNNING parents whose owner died too; returns the ids ended."""
    digests = set(digests)
    running = {run.info.run_id: run for run in
               mlflow.search_runs([experiment_id], filter_string=_RUNNING, max_results=5000)}
    ended: list[str] = []
    for run in list(running.values()):
        tags = run.data.tags
        ours = tags.get(store.PRODUCED_BY) in digests or (sweep and tags.get(store.SWEEP) == sweep)
        while ours and run is not None and run.info.run_id not in ended and owner_is_dead(run):
            if run.data.tags.get(store.CLAIM) == "waiting":  # a claim it never started on
                store.withdraw(mlflow, run.info.run_id)
            else:
                _kill(mlflow, run)
            ended.append(run.info.run_id)
            run = running.get(run.data.tags.get(store.PARENT, ""))
    return ended


def reap_multiruns(mlflow, experiment_id: str) -> list[str]:
    """End KILLED the RUNNING multirun parents whose launcher died, and the RUNNING runs below
    them whose owner died too (another host's are left); returns the ids ended."""
    query = f"{_RUNNING} and tags.`{store.KIND}` = 'multirun'"
    ended: list[str] = []
    for parent in mlflow.search_runs([experiment_id], filter_string=query, max_results=5000):
        if not owner_is_dead(parent):
            continue
        for run in store.descendants(mlflow, experiment_id, parent.info.run_id):
            if run.info.status == "RUNNING" and owner_is_dead(run):
                _kill(mlflow, run)
                ended.append(run.info.run_id)
        _kill(mlflow, parent)
        ended.append(parent.info.run_id)
    return ended


def resumable_sweep(mlflow, experiment_id: str, sweep: str) -> str | None:
    """The sweep's latest parent when it ended KILLED or FAILED, for a rerun to reattach to."""
    query = f"tags.`{store.SWEEP}` = '{sweep}'"
    latest = mlflow.search_runs([experiment_id], filter_string=query, max_results=1,
                                order_by=["attributes.start_time DESC"])
    if not latest or latest[0].info.status not in ("KILLED", "FAILED"):
        return None
    return latest[0].info.run_id


def reopen(mlflow, run_id: str, owner: dict[str, str]) -> None:
    """Make an ended sweep parent ``owner``'s again: RUNNING, its tags, no error."""
    mlflow.update_run(run_id, status="RUNNING")
    store.log_batch(mlflow, run_id, tags=owner)
    if store.ERROR in mlflow.get_run(run_id).data.tags:
        mlflow.delete_tag(run_id, store.ERROR)
