"""What the tests that race or kill real ``causalab run`` processes share: the corpus DBM
sweep with fits of a chosen length, and the environment those processes run in."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_env(**extra: str) -> dict:
    """The test's environment for a run it starts: offline, quiet, this checkout first on the
    path, and no MLflow store of the user's (``extra`` sets what a test names itself)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               OMP_WAIT_POLICY="PASSIVE", CAUSALAB_QUIET="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_EXPERIMENT_NAME", None)
    return {**env, **extra}


def dbm_sweep(folder: Path, epochs: int) -> str:
    """The corpus DBM sweep (four points, a fit each) written in ``folder``, each fit
    ``epochs`` long with no early stop: how long a point takes is the test's to choose."""
    document = json.loads((REPO / "documents" / "v2" / "dbm.json").read_text())
    fit = document["steps"]["fit"]
    fit["epochs"] = fit["early_stop"]["patience"] = epochs
    path = folder / "dbm.json"
    path.write_text(json.dumps(document))
    return str(path)


def running(uri: str) -> list[str]:
    """Every run of the store left RUNNING, in any experiment, the deleted ones too (a run
    deleted while RUNNING stays RUNNING in MLflow's trash)."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return [f"{r.info.run_name} ({r.info.run_id}, {r.info.lifecycle_stage})" for r in
            client.search_runs(experiments, "attributes.status = 'RUNNING'",
                               run_view_type=ViewType.ALL, max_results=5000)]


def each_point_finished_once(uri: str, points: int | None = None) -> None:
    """No run of the store is RUNNING (:func:`running`), and each point of its default
    experiment (``points`` of them, when given) was computed and FINISHED exactly once."""
    from mlflow import MlflowClient

    from causalab.tracking import runs as store

    assert running(uri) == []
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(store.DEFAULT_EXPERIMENT).experiment_id
    runs = client.search_runs([experiment], max_results=1000)
    computed = Counter(r.data.tags[store.PRODUCED_BY] for r in runs
                       if r.data.tags.get(store.KIND) == "point" and r.info.status == "FINISHED"
                       and store.REUSED_FROM not in r.data.tags)
    assert computed and set(computed.values()) == {1}, computed
    assert points is None or len(computed) == points, computed
