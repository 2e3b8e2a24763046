"""A fresh SQLite store with a plain MLflow client polling it from the run's first second.

What ``mlflow ui``, a notebook or a second tool does beside a run: a process of MLflow's own
client alone (``MlflowClient().search_experiments()``, and the runs of each experiment, in a
loop, in the working folder whose ``mlflow.db`` the run makes too) started within the run's
first seconds or just before it, at a different offset each trial, so that either makes the
store first or both at once. MLflow's own client makes a new store itself, unlocked, one
migration at a time; the run makes it in place in one SQLite transaction, under its lock, and
waits for a store another client is still making. Each trial: the run exits 0 with no
traceback, SQLite's integrity check passes, each point is FINISHED once and nothing is
RUNNING, the polling client sees every run the run stored, and nothing is left beside the
store or in the working folder. Both processes run in their own groups, stopped by group.
Two trials run in the fast suite; all ten, the issue's count, in ``make test-capabilities``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from causalab.tracking.sqlite_store import lock_path
from dbm_runs import each_point_finished_once, run_env

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
HEADS = str(REPO / "documents" / "v2" / "head_patching.json")
LIMIT_S = 600
TRIALS = 10
# The fast suite's two trials of the ten: the poller 0.9 s before the run, and 0.6 s after.
FAST = [2, 7]

_POLL = """
import json, time
from mlflow import MlflowClient
while True:
    try:
        client = MlflowClient()
        found = client.search_experiments()
        runs = sum(len(client.search_runs([e.experiment_id], max_results=1000)) for e in found)
        print(json.dumps({"runs": runs}), flush=True)
    except Exception as error:
        print(json.dumps({"error": (str(error).splitlines() or ["?"])[0][:300]}), flush=True)
    time.sleep(0.1)
"""


def _group(arguments: list[str], cwd: Path, **streams) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *arguments], cwd=cwd, env=run_env(), text=True,
                            start_new_session=True, **streams)


def _stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def _sees(poll_log: Path, runs: int) -> bool:
    """Whether a poll saw ``runs`` runs (the poller's other lines are MLflow's own notes)."""
    lines = [json.loads(line) for line in poll_log.read_text().splitlines()
             if line.startswith("{")]
    return any(line.get("runs", -1) >= runs for line in lines)


@pytest.mark.parametrize("trial", FAST, ids=["poller-first", "run-first"])
def test_a_run_on_a_fresh_store_a_plain_client_polls_exits_0_and_leaves_it_whole(
        tmp_path, trial):
    _polled_trial(tmp_path, trial)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS), ids=[f"trial{t}" for t in range(TRIALS)])
def test_ten_runs_on_fresh_stores_a_plain_client_polls_all_exit_0_and_leave_them_whole(
        tmp_path, trial):
    _polled_trial(tmp_path, trial)


def _polled_trial(tmp_path: Path, trial: int) -> None:
    """One trial: the poller started ``0.3 * trial - 1.5`` s after the run (before it when
    negative), then every check of the module's docstring."""
    work = tmp_path / "work"
    work.mkdir()
    database = work / "mlflow.db"
    poll_log = tmp_path / "poll.jsonl"
    # The poller starts up to 1.5 s before the run or 1.2 s after it, by trial: MLflow's own
    # client makes the store first in some trials, the run in others.
    offset = 0.3 * trial - 1.5
    started = []
    try:
        for which in ("run", "poller") if offset >= 0 else ("poller", "run"):
            if started:
                time.sleep(abs(offset))
            if which == "run":
                run = _group(["-m", "causalab", "run", HEADS, "--device-map", "cpu", "--out",
                              "out", "--data-root", DATA], work, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
            else:
                with open(poll_log, "w") as log:
                    poller = _group(["-c", _POLL], work, stdout=log, stderr=subprocess.STDOUT)
            started.append(run if which == "run" else poller)
        _, stderr = run.communicate(timeout=LIMIT_S)
        assert run.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
        with contextlib.closing(sqlite3.connect(database)) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        uri = f"sqlite:///{database}"
        each_point_finished_once(uri, 4)
        client = MlflowClient(uri)
        stored = sum(len(client.search_runs([e.experiment_id], max_results=1000))
                     for e in client.search_experiments())
        deadline = time.monotonic() + LIMIT_S
        while not _sees(poll_log, stored):
            assert poller.poll() is None, poll_log.read_text()[-3000:]
            assert time.monotonic() < deadline, poll_log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        for process in started:
            _stop(process)
    assert sorted(p.name for p in work.iterdir()) == ["mlartifacts", "mlflow.db", "out"]
    assert not lock_path(database).exists()
