"""What the tests that race or kill real ``causalab run`` processes share: the corpus DBM
sweep with fits of a chosen length, and the environment those processes run in."""
from __future__ import annotations

import json
import os
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
