"""Links: a point done by an earlier run, shown in the new parent that asked for it again.

A link is a small FINISHED child of the new parent with the original's params, last metric
values and tags, and ``causalab.reused_from`` naming the run that holds the files. Resume
follows a link to its origin (:func:`causalab.tracking.stored.done_runs`): links never chain.
"""
from __future__ import annotations

import json
import time
from typing import Iterable, Mapping

from causalab.tracking import runs as store

_COPIED_TAGS = (store.PRODUCED_BY, store.POINT, store.COORDINATES, store.MODEL_KEY,
                store.MODEL_REVISION)


def link(mlflow, experiment: str, origin: str, parent: str, name: str,
         tags: Mapping[str, str]) -> str:
    """Create the link to ``origin`` under ``parent``; returns the link's run id."""
    source = mlflow.get_run(origin)
    copied = {k: source.data.tags[k] for k in _COPIED_TAGS if k in source.data.tags}
    run_id = store.create_run(mlflow, experiment, name, {**tags, **copied,
                                                         store.REUSED_FROM: origin}, parent)
    now = int(time.time() * 1000)
    metrics = [store.Point(k, v, now, 0) for k, v in source.data.metrics.items()]
    store.log_batch(mlflow, run_id, metrics=metrics, params=dict(source.data.params))
    store.terminate(mlflow, run_id, "FINISHED")
    return run_id


def means_of(mlflow, run_ids: Iterable[str]) -> list[tuple[dict, dict]]:
    """``(coordinates, metrics)`` of linked runs, for the parent's plots."""
    found = []
    for run_id in run_ids:
        run = mlflow.get_run(run_id)
        coordinates = json.loads(run.data.tags.get(store.COORDINATES) or "{}")
        found.append((coordinates, dict(run.data.metrics)))
    return found
