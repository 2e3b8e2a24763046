"""What the command line says about itself and its refusals: full help, errors as JSON, and a
Python tracking listener that refuses to start when it could not upload what a run writes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from causalab.cli import VERBS, main
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
