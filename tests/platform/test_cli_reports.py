"""What the command line says about itself and its refusals: full help, errors as JSON, and a
Python tracking listener that refuses to start when it could not upload what a run writes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from causalab.cli.main import VERBS, main
from causalab.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def test_the_full_help_names_every_verb_and_shows_examples():
    done = subprocess.run([sys.executable, "-m", "causalab", "--help"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0
    first = done.stdout.split("positional arguments")[0]
    assert "tracked in MLflow." in first  # the description is whole, not cut at a line end
    assert all(f"    {verb} " in done.stdout for verb in VERBS)
    assert "examples:" in done.stdout and "causalab run " in done.stdout


@pytest.mark.parametrize("argv,path", [
    (["validate", "/no/such/document.json"], []),
    (["run"], []),
], ids=["unreadable_document", "missing_argument"])
def test_a_refusal_with_json_prints_one_json_object_naming_its_path(capsys, argv, path):
    status = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert status == 2 and err.startswith("error: ")
    found = json.loads(out)
    assert found["ok"] is False and found["error"]["path"] == path
    assert found["error"]["line"] == err.strip()


def test_a_tracking_listener_without_out_refuses_to_start():
    from causalab.tracking import TrackingEvents

    with pytest.raises(UsageError) as refused:
        TrackingEvents(tracking_uri="sqlite:////nonexistent/never-created.db")
    assert refused.value.path == ("out",)
    assert not Path("/nonexistent/never-created.db").exists()


def test_quiet_leaves_out_mlflows_notes_on_making_a_new_store(tmp_path):
    """Under CAUSALAB_QUIET=1 a tracked run into a new SQLite store prints none of MLflow's
    INFO lines on making its tables, and the store is still made; without it too, since the
    store is made in one transaction of MLflow's migrations whose notes are not a user's."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(HF_HUB_OFFLINE="1", CAUSALAB_QUIET="1")
    database = tmp_path / "quiet" / "mlflow.db"
    done = subprocess.run(
        [sys.executable, "-m", "causalab", "run", str(REPO / "documents" / "v2" / "patching.json"),
         "--out", str(tmp_path / "out"), "--data-root", str(REPO / "documents" / "data"),
         "--tracking-uri", f"sqlite:///{database}"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "database tables" not in done.stderr and database.is_file()
    assert "logit_diff.json" in done.stdout
    env.pop("CAUSALAB_QUIET")
    told = subprocess.run(
        [sys.executable, "-c", "import sys; from causalab.tracking import runs; "
                               "runs.client(sys.argv[1])", f"sqlite:///{tmp_path / 'told.db'}"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert told.returncode == 0, told.stderr
    assert "database tables" not in told.stderr and (tmp_path / "told.db").is_file()
