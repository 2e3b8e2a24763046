"""Each point is claimed in the store before it is computed, so concurrent runs of one document
compute it once.

A run's claim on a point is the point's own run, created RUNNING (with its owner,
``causalab.owner``) in the same worker call as the resume lookup, before anything computes.
Then every RUNNING run of those digests is read back and each digest goes to its earliest
live claim (start time, then run id): a claim whose owner died on this host does not count,
and neither does one from another host, whose process cannot be seen from here (it could be
a killed job's, which would hold the point forever). Every run reads the same claims in the
same order, so of several runs that start at once exactly one keeps each point; a run that
lost withdraws its claim (ended, then deleted) and leaves the point to the winner (:class:`Claims.taken`), which it
reports as skipped. Start times come from each run's clock, which on one host is one clock.
Runs in the tracking worker: every function takes the worker's ``MlflowClient``.
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from causalab.tracking import owners, stored
from causalab.tracking import runs as store


@dataclass(frozen=True)
class Claim:
    """What a run asks for one point: its run's name and tags (owner included)."""

    name: str
    tags: dict[str, str]


@dataclass
class Claims:
    """The start call's answer: which points are done (and why others are not), the runs
    this run holds its points in, and the points a live run elsewhere holds."""

    done: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    mine: dict[str, str] = field(default_factory=dict)
    taken: dict[str, str] = field(default_factory=dict)


def claim(mlflow: Any, experiment: str, wanted: Mapping[str, Mapping[str, str]],
          asked: Mapping[str, Claim]) -> Claims:
    """Look up which of ``wanted`` (digest -> its inputs) are done, claim the rest of
    ``asked`` (digest -> claim) and keep the claims this run won."""
    answer = Claims()
    since = int(time.time() * 1000) - 1000  # a point another run ends after this is seen
    answer.done, answer.why = stored.done_runs(mlflow, experiment, wanted)
    for digest, wish in asked.items():
        if digest not in answer.done:
            answer.mine[digest] = store.create_run(mlflow, experiment, wish.name,
                                                   {**wish.tags, store.CLAIM: "waiting"})
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
    try:
        owner = json.loads(run.data.tags.get(owners.OWNER) or "null")
    except ValueError:
        return False
    here = isinstance(owner, dict) and owner.get("host") == socket.gethostname()
    return here and not owners.owner_is_dead(run)


def _named(run: Any) -> str:
    owner = json.loads(run.data.tags.get(owners.OWNER) or "{}")
    return f"run {run.info.run_id} (pid {owner.get('pid')} on {owner.get('host')})"
