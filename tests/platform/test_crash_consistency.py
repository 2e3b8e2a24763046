"""Runs end cleanly whatever stops them: SIGKILL then a rerun, SIGTERM, Ctrl-C, no server.

A real SQLite tracking store in a temporary folder, the real CLI (in this process where the
test needs no process of its own, a subprocess where it kills one) and the DBM sweep of the
corpus made to fit 200 epochs a point (``_sweep``): four points of one to two seconds each on
the tiny Llama, long enough to stop mid-point.
What the store holds is read back through MlflowClient and, while a run is alive, with plain
sqlite3 so the test never takes MLflow's own locks.
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

from causalab.cli import main as cli
from causalab.tracking import owners
from causalab.tracking import runs as store

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
SWEEP = str(REPO / "documents" / "v2" / "dbm.json")
POINTS = 4
# A point runs one to two seconds: stop it once its run is open and its numbers are being made,
# not in the middle of the store write that opened it.
SETTLE_S = 0.3


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               OMP_WAIT_POLICY="PASSIVE",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _statuses(database: Path) -> list[tuple[str, str]]:
    """(name, status) of every run, read without MLflow; empty while the store is being made.
    A point claimed at the run's start but not started yet (``causalab.claim`` waiting) is
    listed as ``WAITING``: it is not computing."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True,
                                                timeout=1)) as db:
            return [(name, "WAITING" if status == "RUNNING" and claim == "waiting" else status)
                    for name, status, claim in db.execute(
                        "select r.name, r.status, t.value from runs r left join tags t on "
                        "t.run_uuid = r.run_uuid and t.key = 'causalab.claim'")]
    except sqlite3.Error:
        return []


def _point_running(database: Path) -> bool:
    return any(name != "sweep" and status == "RUNNING" for name, status in _statuses(database))


def _mid_point(database: Path) -> bool:
    """A point is running and an earlier one has finished: the sweep is in its middle."""
    found = _statuses(database)
    return (any(name != "sweep" and status == "RUNNING" for name, status in found)
            and any(name != "sweep" and status == "FINISHED" for name, status in found))


def _inside_a_point(out: Path) -> bool:
    """The run's own thread is inside a point after an earlier one ended: a point's folder
    gets its document.json when the point starts and its mask (the last save) when it ends.
    The store follows it: a point's run ends once its files are written."""
    started = [folder for folder in out.glob("objective=*") if (folder / "document.json").is_file()]
    ended = [folder for folder in started if (folder / "mask.safetensors").is_file()]
    return bool(ended) and len(ended) < len(started)


def _wait_for(condition, process: subprocess.Popen | None = None, limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert process is None or process.poll() is None, "the run ended before it was stopped"
        assert time.monotonic() < deadline, "the sweep never reached the middle of a point"
        time.sleep(0.05)


def _store(database: Path) -> str:
    """A made SQLite store: MLflow logs its table creation to stderr, which is not the run's."""
    uri = f"sqlite:///{database}"
    MlflowClient(uri).search_experiments()
    return uri


def _sweep(folder: Path) -> str:
    """The corpus DBM sweep written in ``folder``, each fit running 200 epochs with no early
    stop: as shipped a point stops after about 20 and takes under 0.2 s, and a signal sent
    once one point has ended could find every later one ended too before it lands."""
    document = json.loads(Path(SWEEP).read_text())
    fit = document["steps"]["fit"]
    fit["epochs"] = fit["early_stop"]["patience"] = 200
    path = folder / "dbm.json"
    path.write_text(json.dumps(document))
    return str(path)


def _run_args(uri: str, out: Path) -> list[str]:
    return ["run", _sweep(out.parent), "--tracking-uri", uri, "--device-map", "cpu",
            "--out", str(out), "--data-root", DATA]


def _interrupt(command: list[str], cwd: Path, ready, signum: int) -> tuple[int, list[str]]:
    """Start ``command``, send ``signum`` once ``ready()`` holds (and the point has settled):
    its exit status and the non-blank lines of its stderr."""
    job = subprocess.Popen(command, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready, job)
        time.sleep(SETTLE_S)
        job.send_signal(signum)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    return job.returncode, [line for line in err.splitlines() if line.strip()]


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(store.DEFAULT_EXPERIMENT)
    return list(client.search_runs([experiment.experiment_id], max_results=1000))


def test_a_sweep_killed_mid_point_then_run_again_finishes_each_point_once_under_one_parent(
        tmp_path, monkeypatch):
    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    killed = subprocess.Popen([sys.executable, "-m", "causalab", *_run_args(uri, tmp_path / "out")],
                              cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _mid_point(database), killed)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    left = dict(_statuses(database))
    assert left["sweep"] == "RUNNING" and "RUNNING" in [s for n, s in left.items() if n != "sweep"]

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(_run_args(uri, tmp_path / "out")) == 0

    runs = _runs(uri)
    (parent,) = [r for r in runs if r.data.tags.get(store.KIND) == "sweep"]
    points = [r for r in runs if r.data.tags.get(store.KIND) == "point"]
    assert [r for r in runs if r.info.status == "RUNNING"] == []
    assert parent.info.status == "FINISHED"
    assert {r.data.tags[store.PARENT] for r in points} == {parent.info.run_id}
    finished = [r.data.tags[store.PRODUCED_BY] for r in points if r.info.status == "FINISHED"]
    assert len(finished) == len(set(finished)) == POINTS
    stale = [r for r in points if r.info.status != "FINISHED"]
    assert [r.info.status for r in stale] == ["KILLED"]
    assert "died without ending it" in stale[0].data.tags[store.ERROR]
    assert str(killed.pid) in stale[0].data.tags[owners.OWNER]


def test_sigterm_ends_every_open_run_killed_and_exits_143_with_one_line(tmp_path):
    # A process of its own: an interrupted trace leaves nnsight's worker thread mid-forward,
    # which the causalab command leaves behind at once but a test process would finalise.
    database = tmp_path / "mlflow.db"
    uri = _store(database)
    # A later point open while an earlier one is done, and the run inside that point's
    # compute (its folder started, its last save not yet written).
    status, lines = _interrupt([sys.executable, "-m", "causalab", *_run_args(uri, tmp_path / "out")],
                               tmp_path, lambda: _mid_point(database)
                               and _inside_a_point(tmp_path / "out"), signal.SIGTERM)
    assert (status, lines) == (143, ["error: interrupted (SIGTERM)"])
    runs = _runs(uri)
    assert [r for r in runs if r.info.status == "RUNNING"] == []
    statuses = [r.info.status for r in runs if r.data.tags.get(store.KIND) == "point"]
    assert statuses.count("KILLED") == 1 and set(statuses) <= {"KILLED", "FINISHED"}
    (parent,) = [r for r in runs if r.data.tags.get(store.KIND) == "sweep"]
    assert parent.info.status == "KILLED"


def test_ctrl_c_under_python_m_causalab_run_is_one_line_exit_130_and_no_run_left_running(
        tmp_path):
    database = tmp_path / "mlflow.db"
    _store(database)
    status, lines = _interrupt(
        [sys.executable, "-m", "causalab.run", "experiment=dbm", "model=tiny_llama",
         f"tracking.uri=sqlite:///{database}", f"run.data_root={DATA}",
         f"hydra.run.dir={tmp_path / 'job'}"],
        tmp_path, lambda: _point_running(database), signal.SIGINT)
    assert (status, lines) == (130, ["error: interrupted (SIGINT)"])
    assert "RUNNING" not in [state for _, state in _statuses(database)]


def test_ctrl_c_in_a_sequential_multirun_ends_its_parent_killed_too(tmp_path):
    # The interrupted process leaves by os._exit, which runs no exit handler: the multirun's
    # parent used to stay RUNNING until the next multirun in the experiment reaped it.
    database = tmp_path / "mlflow.db"
    _store(database)
    status, lines = _interrupt(
        [sys.executable, "-m", "causalab.run", "-m", "experiment=dbm", "model=tiny_llama,tiny_gpt2",
         f"tracking.uri=sqlite:///{database}", f"run.data_root={DATA}",
         f"hydra.sweep.dir={tmp_path / 'multirun'}"],
        tmp_path, lambda: _mid_point(database), signal.SIGINT)
    assert status == 130 and lines[-1] == "error: interrupted (SIGINT)"
    runs = _runs(_store(database))
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    (parent,) = [r for r in runs if r.data.tags.get(store.KIND) == "multirun"]
    assert parent.info.status == "KILLED"
    assert parent.data.tags[store.ERROR] == "interrupted (SIGINT)"


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("verb", ["run", "runs"])
def test_an_unreachable_tracking_server_is_one_line_naming_it_in_seconds_before_any_weight(
        verb, tmp_path, monkeypatch, capfd):
    import causalab.engine.weights

    def no_weights(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the tracking server was reached")
    monkeypatch.setattr(causalab.engine.weights, "load_model", no_weights)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"http://127.0.0.1:{_closed_port()}"
    args = _run_args(uri, tmp_path / "out") if verb == "run" else ["runs", "--tracking-uri", uri]
    started = time.monotonic()
    status = cli.main(args)
    took = time.monotonic() - started
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert status == 1
    assert len(lines) == 1 and lines[0].startswith("error: --tracking-uri: ") and uri in lines[0]
    assert took < 10  # three refused connections and two short pauses, not MLflow's minutes
    assert not (tmp_path / "out").exists()
