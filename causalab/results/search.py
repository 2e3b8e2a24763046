"""Point runs as a table: one row per point, for comparing a sweep or several in a notebook.

Built on MLflow's run search (``MlflowClient.search_runs``, the call ``mlflow.search_runs``
wraps, here bound to one explicit tracking URI rather than the process-global one). Columns:
``run_id``, ``status``, ``name``, ``model``, ``parent_run_id``, ``produced_by``,
``reused_from``, one column per swept coordinate, then one per metric with its last value:
the scores (``iia/test``, ``iia/control``, …, main score first), a fit's final series values
(``train/loss``, ``eval/iia``) and the row counts (``n/iia/test``).
"""
from __future__ import annotations

import json
import os

from causalab.scores import naming
from causalab.tracking import runs as store


def _runs(mlflow, experiment_id: str, query: str) -> list:
    found, token = [], None
    while True:
        page = mlflow.search_runs([experiment_id], filter_string=query, max_results=1000,
                                  page_token=token)
        found += list(page)
        token = page.token
        if not token:
            return found


def point_rows(experiment: str | None = None, *, tracking_uri: str | None = None,
               filter_string: str = "", parent_run_id: str | None = None):
    """The DataFrame :func:`causalab.search_points` returns (empty when nothing matches)."""
    import pandas

    uri = store.resolve_uri(tracking_uri)
    mlflow = store.client(uri)
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or store.default_experiment(uri)
    found = mlflow.get_experiment_by_name(name)
    if found is None:
        return pandas.DataFrame(columns=_FIXED)
    query = [f"tags.`{store.KIND}` = 'point'"]
    if parent_run_id:
        query.append(f"tags.`{store.PARENT}` = '{parent_run_id}'")
    if filter_string:
        query.append(filter_string)
    rows = [_row(run) for run in _runs(mlflow, found.experiment_id, " and ".join(query))]
    if not rows:
        return pandas.DataFrame(columns=_FIXED)
    frame = pandas.DataFrame.from_records(rows)
    metrics = sorted({k for row in rows for k in row["_metrics"]}, key=naming.listed)
    places = [c for c in frame.columns if c not in _FIXED and c != "_metrics" and c not in metrics]
    return frame[_FIXED + places + metrics]


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
