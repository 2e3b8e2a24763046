"""A tracking server that dies or stops answering mid-sweep: every MLflow call has a deadline.

A real ``mlflow server`` on 127.0.0.1 in a process group of its own (SQLite and an artifact
folder in a temporary directory), the real ``causalab run`` in a process of its own on the
DBM sweep of the corpus made to fit 200 epochs a point (four points of one to two seconds on
the tiny Llama). Once the server holds a finished point, its group is killed (SIGKILL) or
stopped (SIGSTOP: it accepts connections and answers nothing). The run must then say so in
one line and exit non-zero within 90 s, its tables kept in ``--out``; a SIGTERM sent while the
server answers nothing ends it within seconds.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
MLFLOW = Path(sys.executable).parent / "mlflow"
LIMIT_S = 90


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               OMP_WAIT_POLICY="PASSIVE", CAUSALAB_QUIET="1",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.read()
    except OSError:
        return None


def _finished_points(url: str) -> int:
    """Point runs the server holds FINISHED (0 while it has no experiment yet)."""
    found = _get(f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=causalab")
    if not found:
        return 0
    body = json.dumps({"experiment_ids": [json.loads(found)["experiment"]["experiment_id"]],
                       "filter": "attributes.status = 'FINISHED' and "
                                 "tags.`causalab.kind` = 'point'"}).encode()
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=2) as reply:
            return len(json.loads(reply.read()).get("runs", []))
    except (OSError, ValueError):
        return 0


@pytest.fixture
def server(tmp_path):
    """``(url, process group)`` of a live tracking server of this test's own."""
    port = _free_port()
    log = open(tmp_path / "server.log", "wb")
    process = subprocess.Popen(
        [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
         "--artifacts-destination", f"{tmp_path}/art"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=_env(), cwd=tmp_path)
    url, group = f"http://127.0.0.1:{port}", os.getpgid(process.pid)
    deadline = time.monotonic() + 90
    try:
        while _get(f"{url}/health") is None:
            assert process.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url, group
    finally:
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(group, signum)
            except ProcessLookupError:
                pass
        process.wait(timeout=30)
        log.close()


def _sweep(folder: Path) -> str:
    document = json.loads((REPO / "documents" / "v2" / "dbm.json").read_text())
    fit = document["steps"]["fit"]
    fit["epochs"] = fit["early_stop"]["patience"] = 200
    path = folder / "dbm.json"
    path.write_text(json.dumps(document))
    return str(path)


def _start_run(url: str, folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "causalab", "run", _sweep(folder), "--tracking-uri", url,
         "--device-map", "cpu", "--out", str(folder / "out"), "--data-root", DATA],
        cwd=folder, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _once_a_point_is_stored(url: str, run: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while _finished_points(url) < 1:
        assert run.poll() is None, "the run ended before the server was stopped"
        assert time.monotonic() < deadline, "no point reached the server"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_server_that_dies_mid_sweep_is_one_line_and_a_non_zero_exit_within_ninety_seconds(
        server, signum, tmp_path):
    url, group = server
    run = _start_run(url, tmp_path)
    try:
        _once_a_point_is_stored(url, run)
        os.killpg(group, signum)
        stopped = time.monotonic()
        _, err = run.communicate(timeout=LIMIT_S + 30)
        took = time.monotonic() - stopped
    finally:
        run.kill()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert run.returncode == 1 and took < LIMIT_S, (took, err[-3000:])
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert errors[0].startswith("error: --tracking-uri: ") and url in errors[0]
    # What the run computed stays in --out: at least the stored point's tables and masks.
    assert len(list((tmp_path / "out").glob("objective=*/mask.safetensors"))) >= 1


@pytest.mark.slow
def test_sigterm_while_the_server_answers_nothing_ends_the_run_within_seconds(server, tmp_path):
    url, group = server
    run = _start_run(url, tmp_path)
    try:
        _once_a_point_is_stored(url, run)
        os.killpg(group, signal.SIGSTOP)
        time.sleep(3)  # the run's next MLflow call is now waiting on the silent server
        run.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = run.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        run.kill()
    assert run.returncode == 143 and took < 15, (took, err[-3000:])
    assert [line for line in err.splitlines() if line.startswith("error:")] \
        == ["error: interrupted (SIGTERM)"]
