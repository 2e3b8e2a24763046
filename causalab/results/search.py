"""Point runs as a table: one row per point, for comparing a sweep or several in a notebook.

Built on MLflow's run search (``MlflowClient.search_runs``, the call ``mlflow.search_runs``
wraps, here bound to one explicit tracking URI rather than the process-global one). Columns:
``run_id``, ``status``, ``name``, ``model``, ``parent_run_id``, ``produced_by``,
``reused_from``, one column per swept coordinate, then one per metric with its last value:
the scores (``iia/test``, ``iia/control``, …, main score first), a fit's final series values
(``train/loss``, ``eval/iia``) and the row counts (``n/iia/test``).

Which points: one sweep by default, the newest of the experiment (the sweep, multirun or
lone point run whose point started last: what a notebook just ran), so documents on other
models never share a table with it and leave NaN columns; ``sweep=`` names another (its
parent run's id, or a :class:`~causalab.results.result.Result`), and ``sweep="all"`` is every
point of the experiment. The frame's ``attrs["sweep"]`` says which.
"""
from __future__ import annotations

import json
import os
from typing import Any

from causalab.errors import UsageError
from causalab.scores import naming
from causalab.tracking import runs as store
from causalab.tracking.landing import stored_points


def _runs(mlflow, experiment_id: str, query: str) -> list:
    found, token = [], None
    while True:
        page = mlflow.search_runs([experiment_id], filter_string=query, max_results=1000,
                                  page_token=token)
        found += list(page)
        token = page.token
        if not token:
            return found


def point_rows(experiment: str | None = None, *, sweep: Any = "newest",
               tracking_uri: str | None = None, filter_string: str = "",
               parent_run_id: str | None = None):
    """The DataFrame :func:`causalab.search_points` returns (empty when nothing matches)."""
    import pandas

    if parent_run_id:
        sweep = parent_run_id
    uri = store.resolve_uri(tracking_uri)
    mlflow = store.client(uri)
    empty = pandas.DataFrame(columns=_FIXED)
    experiment_id = _experiment_of(mlflow, uri, experiment, sweep)
    if experiment_id is None:
        return empty
    query = [f"tags.`{store.KIND}` = 'point'"] + ([filter_string] if filter_string else [])
    kept, top = _scope(mlflow, experiment_id, sweep)
    runs = [] if kept is not None and not kept else \
        _runs(mlflow, experiment_id, " and ".join(query))
    rows = [_row(run) for run in runs if kept is None or run.info.run_id in kept]
    if not rows:
        empty.attrs["sweep"] = top
        return empty
    frame = pandas.DataFrame.from_records(rows)
    metrics = sorted({k for row in rows for k in row["_metrics"]}, key=naming.listed)
    places = [c for c in frame.columns if c not in _FIXED and c != "_metrics" and c not in metrics]
    frame = frame[_FIXED + places + metrics]
    frame.attrs["sweep"] = top
    return frame


def _experiment_of(mlflow, uri: str, experiment: str | None, sweep: Any) -> str | None:
    """The experiment's id: the one named, else the one a named sweep (a run id, a Result's
    runs) was tracked in, else MLFLOW_EXPERIMENT_NAME's or the store's default (``causalab``,
    per user on a server with a login); None: not there."""
    named = [*getattr(sweep, "runs", {}).values(), *getattr(sweep, "skipped", {}).values()]
    if isinstance(sweep, str) and sweep not in ("all", "newest"):
        named.append(sweep)
    if experiment is None:
        for run_id in named[:1]:
            run = store.found_run(mlflow, run_id)
            if run is not None:
                return run.info.experiment_id
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") \
        or store.default_experiment(uri)
    found = mlflow.get_experiment_by_name(name)
    return None if found is None else found.experiment_id


def _scope(mlflow, experiment_id: str, sweep: Any) -> tuple[set[str] | None, str | None]:
    """(the point run ids kept, None for every one; the sweep's top run id) of ``sweep``."""
    if isinstance(sweep, str) and sweep == "all":
        return None, None
    ids = [*getattr(sweep, "runs", {}).values(), *getattr(sweep, "skipped", {}).values()]
    if ids or hasattr(sweep, "runs"):  # a Result: the points it ran or reused
        return set(ids), None
    if sweep in (None, "newest"):
        newest = mlflow.search_runs([experiment_id], filter_string=f"tags.`{store.KIND}` = 'point'",
                                    order_by=["attributes.start_time DESC"], max_results=1)
        if not newest:
            return set(), None
        sweep = _top(mlflow, newest[0])
    if not isinstance(sweep, str):
        raise UsageError(("sweep",), f"a sweep is its parent run's id, a Result, 'newest' or "
                                     f"'all', not {type(sweep).__name__}")
    run = store.found_run(mlflow, sweep)
    if run is None:
        raise UsageError(("sweep",), f"no run {sweep} in this store")
    if run.data.tags.get(store.KIND) == "point":
        return {run.info.run_id}, sweep
    return {r.info.run_id for r in stored_points(mlflow, experiment_id, sweep)}, sweep


def _top(mlflow, run) -> str:
    """The run at the top of ``run``'s parents: the sweep or multirun it belongs to."""
    while run.data.tags.get(store.PARENT):
        above = store.found_run(mlflow, run.data.tags[store.PARENT])
        if above is None:
            break
        run = above
    return run.info.run_id


_FIXED = ["run_id", "status", "name", "model", "parent_run_id", "produced_by", "reused_from"]


def _row(run) -> dict:
    tags = run.data.tags
    row = {"run_id": run.info.run_id, "status": run.info.status, "name": run.info.run_name,
           "model": tags.get(store.MODEL_KEY), "parent_run_id": tags.get(store.PARENT),
           "produced_by": tags.get(store.PRODUCED_BY), "reused_from": tags.get(store.REUSED_FROM)}
    for key, value in json.loads(tags.get(store.COORDINATES) or "{}").items():
        row.setdefault(key, value[0] if isinstance(value, list) and len(value) == 1 else value)
    for key, value in run.data.metrics.items():
        row.setdefault(key, value)
    row["_metrics"] = list(run.data.metrics)
    return row
