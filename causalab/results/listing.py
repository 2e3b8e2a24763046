"""``causalab runs``: the tracked runs of a store as plain dicts, newest first.

Reaches the store first (a server that does not answer is one refusal in seconds) and never
creates a SQLite store that is not there. Reads through one ``MlflowClient`` in this process.
"""
from __future__ import annotations

import os

from causalab.tracking.reach import reach, source_of
from causalab.tracking.runs import (ERROR, JOB, KIND, MODEL_KEY, PARENT, POINT, PRODUCED_BY,
                                    REUSED_FROM, client, resolve_uri, store_exists)

DIGEST_LENGTH = 64  # hex characters of a produced_by (the CLI checks a given one is hex)


def list_runs(produced_by: str | None = None, tracking_uri: str | None = None,
              experiment: str | None = None) -> list[dict]:
    """Tracked runs as plain dicts, newest first; ``produced_by`` keeps one point digest's,
    or those starting with it (the 12 characters ``causalab runs`` shows).

    ``experiment`` (else MLFLOW_EXPERIMENT_NAME) narrows to one experiment; without either,
    every active experiment of the store is searched. A SQLite store that is not there has
    no runs and is not created.

    >>> rows = list_runs(produced_by="0" * 64)  # doctest: +SKIP
    """
    uri = resolve_uri(tracking_uri)
    reach(uri, source_of())
    if not store_exists(uri):
        return []
    mlflow = client(uri)
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name:
        found = mlflow.get_experiment_by_name(name)
        ids = [found.experiment_id] if found is not None else []
    else:
        ids = [e.experiment_id for e in mlflow.search_experiments()]
    if not ids:
        return []
    whole = produced_by is not None and len(produced_by) == DIGEST_LENGTH
    query = (f"tags.`{PRODUCED_BY}` = '{produced_by}'" if whole else
             f"tags.`{PRODUCED_BY}` LIKE '{produced_by}%'" if produced_by else "")
    runs = mlflow.search_runs(ids, filter_string=query, max_results=5000)
    return [_record(run) for run in runs]


def _record(run) -> dict:
    tags = run.data.tags
    return {
        "run_id": run.info.run_id,
        "name": run.info.run_name,
        "status": run.info.status,
        "experiment_id": run.info.experiment_id,
        "parent_run_id": tags.get(PARENT),
        "produced_by": tags.get(PRODUCED_BY),
        "point": tags.get(POINT),
        "kind": tags.get(KIND),
        "model": tags.get(MODEL_KEY),
        "job": tags.get(JOB),
        "reused_from": tags.get(REUSED_FROM),
        "error": tags.get(ERROR),
        "artifact_uri": run.info.artifact_uri,
        "metrics": dict(run.data.metrics),
        "params": dict(run.data.params),
    }
