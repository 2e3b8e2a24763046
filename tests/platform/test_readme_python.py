"""The notebook API's Python block (docs/tour.md), as written, is a plain script that runs tracked.

The block under "From Python (notebooks)" of docs/tour.md (moved there from the README) is
saved as a ``.py`` file (no ``__main__`` guard, nothing added) and run by a fresh interpreter in a temporary folder that holds the
checkout's ``documents/`` (the block's paths are relative to where it runs), with
``MLFLOW_TRACKING_URI`` pointing at a store there: it exits 0 with no traceback, and its
points are FINISHED in that store.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient

from causalab.tracking import runs as store

REPO = Path(__file__).resolve().parents[2]


def _python_block() -> str:
    readme = (REPO / "docs" / "tour.md").read_text()
    section = readme.split("## From Python (notebooks)", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_python_block_runs_as_a_plain_tracked_script(tmp_path):
    script = tmp_path / "cell.py"
    script.write_text(_python_block())
    (tmp_path / "documents").symlink_to(REPO / "documents")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               OMP_WAIT_POLICY="PASSIVE", MLFLOW_TRACKING_URI=uri,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_EXPERIMENT_NAME", None)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(store.DEFAULT_EXPERIMENT).experiment_id
    points = [r for r in client.search_runs([experiment])
              if r.data.tags.get(store.KIND) == "point"]
    assert len(points) == 3 and {r.info.status for r in points} == {"FINISHED"}
