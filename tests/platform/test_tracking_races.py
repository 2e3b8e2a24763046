"""Real ``causalab run`` processes racing on one SQLite store, and runs killed outright.

Two or three runs started at once on a store that does not exist yet all exit 0 (the store's
first use, its tables and migrations, is made under a lock beside it), and each point has
exactly one FINISHED run that computed it. A run killed with SIGKILL at one of several
moments (its points claimed, the middle of its sweep, its last point stored) leaves runs
RUNNING that the next run of the document ends: after it, nothing is RUNNING and each point
is FINISHED once. Moments are reached by waiting on what the store holds, never by sleeping.
"""
from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dbm_runs import dbm_sweep, each_point_finished_once, run_env

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
POINTS = 4
LIMIT_S = 600




def _start(document: str, uri: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "causalab", "run", document, "--tracking-uri", uri,
         "--device-map", "cpu", "--out", str(out), "--data-root", DATA],
        cwd=out.parent, env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _statuses(database: Path) -> list[tuple[str, str]]:
    """(kind, status) of every run, read without MLflow; empty while the store is being made."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True,
                                                timeout=1)) as db:
            return list(db.execute(
                "select t.value, r.status from runs r join tags t on t.run_uuid = r.run_uuid "
                "and t.key = 'causalab.kind'"))
    except sqlite3.Error:
        return []


def _points(database: Path, status: str) -> int:
    return sum(1 for kind, found in _statuses(database) if kind == "point" and found == status)


@pytest.mark.parametrize("count", [2, 3], ids=["two", "three"])
def test_runs_started_at_once_on_a_fresh_store_all_exit_0_and_store_each_point_once(
        tmp_path, count):
    document = dbm_sweep(tmp_path, 30)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert not (tmp_path / "mlflow.db").exists()
    started = [_start(document, uri, tmp_path / f"out{index}") for index in range(count)]
    ended = [run.communicate(timeout=LIMIT_S) for run in started]
    for run, (_, stderr) in zip(started, ended):
        assert run.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    each_point_finished_once(uri, POINTS)


def _claimed(database: Path) -> bool:
    return _points(database, "RUNNING") > 0


def _mid_sweep(database: Path) -> bool:
    return _points(database, "FINISHED") > 0 and _points(database, "RUNNING") > 0


def _last_point_stored(database: Path) -> bool:
    return _points(database, "FINISHED") == POINTS


@pytest.mark.parametrize("moment", [_claimed, _mid_sweep, _last_point_stored],
                         ids=["points-claimed", "mid-sweep", "last-point-stored"])
def test_a_run_killed_at_any_moment_leaves_nothing_running_after_the_next_run(tmp_path, moment):
    document = dbm_sweep(tmp_path, 200)
    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    killed = _start(document, uri, tmp_path / "out")
    try:
        deadline = time.monotonic() + LIMIT_S
        while not moment(database) and killed.poll() is None:
            assert time.monotonic() < deadline, "the run never reached the moment"
            time.sleep(0.02)
    finally:
        killed.kill()
        killed.communicate(timeout=60)
    again = _start(document, uri, tmp_path / "out")
    _, stderr = again.communicate(timeout=LIMIT_S)
    assert again.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    each_point_finished_once(uri, POINTS)


def test_a_run_refused_for_its_out_touches_no_store(tmp_path):
    from causalab.tracking.claims import claim

    document = dbm_sweep(tmp_path, 5)
    database = tmp_path / "mlflow.db"
    with claim(tmp_path / "out"):
        refused = _start(document, f"sqlite:///{database}", tmp_path / "out")
        _, stderr = refused.communicate(timeout=LIMIT_S)
    assert refused.returncode != 0 and stderr.startswith("error: --out: "), stderr
    assert list(tmp_path.glob("mlflow.db*")) == []
