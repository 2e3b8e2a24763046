"""After any sequence of runs, reruns and kills, no run is RUNNING once the last command exits.

Real ``causalab run`` processes (and the README's ``make run`` command, ``python -m
causalab.run experiment=das model=llama``) into a real SQLite store, read back with MLflow's
own client over every run of every experiment, the deleted ones too (a run deleted while
RUNNING stays RUNNING in MLflow's trash: what a rerun of done points once left). A rerun whose
points are all done opens no parent, so it ends everything it opened. A run stopped with
SIGKILL or SIGTERM at one of five moments, each read from what the store holds (never by
sleeping), then run again: nothing RUNNING, each point FINISHED once. Processes run in their
own groups and are stopped by group.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from causalab.tracking import runs as store
from causalab.tracking.sqlite_store import lock_path
from dbm_runs import dbm_sweep, each_point_finished_once, run_env, running

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
HEADS = str(REPO / "documents" / "v2" / "head_patching.json")
POINTS = 4
LIMIT_S = 900


def _start(arguments: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *arguments], cwd=cwd, env=run_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _ended(process: subprocess.Popen) -> tuple[int, str]:
    """The exit status and stderr of ``process``, waited for; its group stopped either way."""
    try:
        _, stderr = process.communicate(timeout=LIMIT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, stderr


def _run(document: str, cwd: Path, out: str, *more: str) -> subprocess.Popen:
    return _start(["-m", "causalab", "run", document, "--device-map", "cpu", "--out", out,
                   "--data-root", DATA, *more], cwd)


def _folder_holds(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_sweep_run_twice_opens_no_second_parent_and_leaves_nothing_in_the_working_folder(
        tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    uri = f"sqlite:///{work / 'mlflow.db'}"  # the default store: ./mlflow.db
    for out in ("first", "again"):
        code, stderr = _ended(_run(HEADS, work, out))
        assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("skipped heads=") == POINTS, stderr
    assert running(uri) == []
    each_point_finished_once(uri, POINTS)
    client = MlflowClient(uri)
    from mlflow.entities import ViewType

    experiment = client.get_experiment_by_name(store.DEFAULT_EXPERIMENT).experiment_id
    parents = [r for r in client.search_runs([experiment], run_view_type=ViewType.ALL)
               if r.data.tags.get(store.KIND) == "sweep"]
    assert [r.info.status for r in parents] == ["FINISHED"]
    assert _folder_holds(work) == ["again", "first", "mlartifacts", "mlflow.db"]
    assert not lock_path(work / "mlflow.db").exists()


@pytest.mark.slow
def test_make_run_twice_leaves_no_run_running(tmp_path):
    """The README's first command, twice, as a newcomer runs it (``make run``): the second's
    points all done, nothing RUNNING after it, nothing in the working folder but the store and
    Hydra's outputs."""
    command = ["-m", "causalab.run", "experiment=das", "model=llama",
               f"run.data_root={DATA}"]
    for _ in range(2):
        code, stderr = _ended(_start(command, tmp_path))
        assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert running(uri) == []
    each_point_finished_once(uri, 3)
    assert _folder_holds(tmp_path) == ["mlartifacts", "mlflow.db", "outputs"]


def _rows(database: Path) -> list[tuple[str, str, str | None]]:
    """(kind, status, claim) of every run, read without MLflow; empty while it cannot be read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True,
                                                timeout=1)) as db:
            return list(db.execute(
                "select k.value, r.status, c.value from runs r join tags k on k.run_uuid = "
                "r.run_uuid and k.key = 'causalab.kind' left join tags c on c.run_uuid = "
                "r.run_uuid and c.key = 'causalab.claim'"))
    except sqlite3.Error:
        return []


def _points(database: Path, status: str, claim: str | None = None) -> int:
    return sum(1 for kind, found, held in _rows(database)
               if kind == "point" and found == status and (claim is None or held == claim))


def _making_the_store(database: Path) -> bool:
    """The store's first use under way: its one transaction open (a journal beside a file
    whose tables a reader does not see yet; tracking/sqlite_store.py)."""
    if not database.with_name(database.name + "-journal").exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True,
                                                timeout=0.05)) as db:
            return not db.execute("select name from sqlite_master where type = 'table'") \
                .fetchall()
    except sqlite3.Error:
        return False


def _claimed(database: Path) -> bool:
    return _points(database, "RUNNING", "waiting") > 0


def _mid_sweep(database: Path) -> bool:
    return _points(database, "FINISHED") > 0 and _points(database, "RUNNING", "started") > 0


def _last_point_computing(database: Path) -> bool:
    return _points(database, "FINISHED") == POINTS - 1 and \
        _points(database, "RUNNING", "started") == 1


def _last_point_stored(database: Path) -> bool:
    return _points(database, "FINISHED") == POINTS


MOMENTS = [_making_the_store, _claimed, _mid_sweep, _last_point_computing, _last_point_stored]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("moment", MOMENTS, ids=["making-the-store", "points-claimed",
                                                 "mid-sweep", "last-point-computing",
                                                 "last-point-stored"])
def test_a_run_stopped_at_any_of_five_moments_then_run_again_leaves_no_run_running(
        tmp_path, moment, signum):
    document = dbm_sweep(tmp_path, 200)
    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    stopped = _run(document, tmp_path, "out", "--tracking-uri", uri)
    try:
        deadline = time.monotonic() + LIMIT_S
        while not moment(database) and stopped.poll() is None:
            assert time.monotonic() < deadline, f"the run never reached {moment.__name__}"
            time.sleep(0.01)
        assert stopped.poll() is None, f"the run ended before {moment.__name__}"
        os.killpg(stopped.pid, signum)
        stopped.communicate(timeout=LIMIT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(stopped.pid, signal.SIGKILL)
    code, stderr = _ended(_run(document, tmp_path, "out", "--tracking-uri", uri))
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    each_point_finished_once(uri, POINTS)
    assert not lock_path(database).exists()
    assert not list(tmp_path.glob("mlflow.db?*"))  # no copy, lock or journal beside the store
