"""Platform fixtures: a real ``mlflow server`` for the session, started and stopped by its group.

The server runs in its own process group (it forks workers) on a free port of 127.0.0.1,
backed by SQLite and an artifact folder in a temporary directory, and is stopped with
SIGTERM to the group, then SIGKILL if it lingers.
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
MLFLOW = Path(sys.executable).parent / "mlflow"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _stop(process: subprocess.Popen) -> None:
    try:
        group = os.getpgid(process.pid)
    except ProcessLookupError:
        return
    os.killpg(group, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """The URL of a live tracking server (``http://127.0.0.1:<port>``)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    log = open(root / "server.log", "wb")
    # Without job execution the server starts no huey consumers: fewer processes, and SIGTERM
    # stops it in about a second instead of needing SIGKILL.
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    process = subprocess.Popen(
        [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root}/db.sqlite",
         "--artifacts-destination", f"{root}/art"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start:\n"
                                   + (root / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        _stop(process)
        log.close()


def _rest_search(url: str, experiment_id: str, query: str) -> list[dict]:
    body = json.dumps({"experiment_ids": [experiment_id], "filter": query,
                       "max_results": 1000}).encode()
    request = urllib.request.Request(url + "/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read()).get("runs", [])


@pytest.fixture
def rest_search():
    """``POST /api/2.0/mlflow/runs/search`` with plain urllib, as any HTTP client would."""
    return _rest_search


@pytest.fixture
def experiment_name(request) -> str:
    """An MLflow experiment name no other test uses."""
    return f"{request.node.name[:40]}-{os.getpid()}-{time.monotonic_ns()}"
