"""Every command an experiment's header comment documents runs: each `python -m causalab.run …`
line of conf/experiment/*.yaml, tracked to a temporary store, exits 0.

All are slow (`make test-slow`). Those on the built-in weekday and tiny models (about 4.5
minutes together on 2 cores) are also marked `commands` and run by `make test-commands`, which
`.ci/run` runs; those on SmolLM2 and Gemma-3 (about 20 minutes) only by `make test-slow`."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HUB_ONLY = ("model=llama3_2_1b",)  # the real checkpoint needs the hub (tests/QUARANTINE.md)
REAL = ("model=smollm2", "model=gemma3")  # minutes a command on 2 cores
COMMAND = re.compile(r"^#\s+(?:\.venv/bin/)?python -m causalab\.run (.+?)(?:\s{2,}\(.*\))?$")


def documented() -> list[tuple[str, list[str]]]:
    """(experiment, arguments) for every documented command without a <placeholder> that
    runs offline."""
    found = []
    for path in sorted((REPO / "conf" / "experiment").glob("*.yaml")):
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            match = COMMAND.match(line.rstrip())
            if match and "<" not in match.group(1) and not any(
                    hub in match.group(1) for hub in HUB_ONLY):
                found.append((path.stem, shlex.split(match.group(1))))
    return found


def test_every_experiment_documents_a_command_that_needs_no_placeholder():
    assert {stem for stem, _ in documented()} == {
        p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")}


def _cases() -> list:
    """Each documented command, marked ``commands`` unless it loads SmolLM2 or Gemma-3."""
    cases = []
    for stem, arguments in documented():
        real = any(model in arguments for model in REAL)
        cases.append(pytest.param(stem, arguments, id=" ".join(arguments),
                                  marks=() if real else pytest.mark.commands))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("experiment, arguments", _cases())
def test_a_documented_command_runs_to_the_end(experiment, arguments, tmp_path):
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
               HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    where = [f"hydra.sweep.dir={tmp_path / 'multirun'}", f"hydra.run.dir={tmp_path / 'job'}",
             f"run.data_root={REPO / 'documents' / 'data'}"]
    done = subprocess.run([sys.executable, "-m", "causalab.run", *arguments, *where], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
