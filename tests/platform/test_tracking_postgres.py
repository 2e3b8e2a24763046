"""PostgreSQL killed under ``causalab server`` mid-sweep: the run says so in one line and stops.

The real team stack (``causalab server start``: PostgreSQL, ``mlflow server`` on it, each in a
process group of its own under a temporary root) and the real ``causalab run`` of the DBM sweep
made to fit 200 epochs a point (``test_tracking_deadlines``'s). Once the server holds a finished
point, the PostgreSQL postmaster's group is killed (SIGKILL) while ``mlflow server`` keeps
answering, with 500s. The run must then end within 90 s with one line naming the store, its
tables kept in ``--out``; a SIGTERM sent meanwhile ends it within 5 s. After ``server stop`` and
``start`` (PostgreSQL recovers its kept ``pgdata``) a rerun stores every point exactly once and
leaves no run RUNNING. Run with ``make test-cluster``; the one test outside it stands a plain
HTTP server answering 503 to everything in for the server whose database is gone.
"""
from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow import MlflowClient
from test_tracking_deadlines import LIMIT_S, _env, _finished_points, _free_port, _start_run

from causalab.server.stack import group_alive
from causalab.tracking import runs as store
from causalab.tracking.reach import Unanswered, translated

REPO = Path(__file__).resolve().parents[2]
# The sweep's points, read from the corpus document the run is given.
POINTS = len(json.loads((REPO / "documents" / "v2" / "dbm.json").read_text())
             ["steps"]["fit"]["objective"][1][0]["sweep"])


def _causalab(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "causalab", *arguments], env=_env(),
                          capture_output=True, text=True, timeout=300)


def _groups(root: Path) -> tuple[int, int]:
    """The process groups (their leaders' pids) of the stack started from ``root`` now."""
    stack = json.loads((root / "server.json").read_text())
    return stack["pg_pid"], stack["mlflow_pid"]


def _kill_groups(groups: set[int]) -> None:
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def stack():
    """``(root, url, groups)`` of a ``causalab server`` of this test's own; every process group
    it ever started (``groups`` grows on a restart) is gone after it."""
    # PostgreSQL runs as its own user when root starts it: pytest's 0700 folders are closed to it.
    home = Path(tempfile.mkdtemp(prefix="causalab-pg-"))
    os.chmod(home, 0o755)
    root, port = home / "stack", _free_port()
    groups: set[int] = set()
    try:
        started = _causalab("server", "start", "--root", str(root), "--port", str(port))
        if (root / "server.json").is_file():
            groups.update(_groups(root))
        assert started.returncode == 0, started.stderr[-3000:]
        yield root, f"http://127.0.0.1:{port}", groups
    finally:
        if (root / "server.json").is_file():
            groups.update(_groups(root))
            _causalab("server", "stop", "--root", str(root))
        _kill_groups({group for group in groups if group_alive(group)})
        shutil.rmtree(home, ignore_errors=True)


# MLflow's own line each time a run on a server ends (its address in the UI), by design on stderr
# (tracking/runs.py): not the run's word, so not counted.
_MLFLOW_LINKS = ("🏃 View run ", "🧪 View experiment ")


def _said(err: str) -> list[str]:
    """The run's own lines on stderr."""
    return [line for line in err.splitlines()
            if line.strip() and not line.startswith(_MLFLOW_LINKS)]


def _until_a_point_is_stored(url: str, run: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while _finished_points(url) < 1:
        assert run.poll() is None, "the run ended before PostgreSQL was killed"
        assert time.monotonic() < deadline, "no point reached the server"
        time.sleep(0.2)


def _kill_postgres(root: Path) -> None:
    """SIGKILL the postmaster's group (its backends with it); mlflow server runs on."""
    postgres, mlflow = _groups(root)
    os.killpg(postgres, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_alive(postgres):
        assert time.monotonic() < deadline, "PostgreSQL outlived SIGKILL"
        time.sleep(0.1)
    assert group_alive(mlflow)


@pytest.mark.cluster
def test_postgres_killed_mid_sweep_is_one_line_within_ninety_seconds_and_a_rerun_stores_each_point_once(
        stack, tmp_path):
    root, url, groups = stack
    run = _start_run(url, tmp_path)
    try:
        _until_a_point_is_stored(url, run)
        _kill_postgres(root)
        killed = time.monotonic()
        _, err = run.communicate(timeout=LIMIT_S + 30)
        took = time.monotonic() - killed
    finally:
        run.kill()
    lines = _said(err)
    assert run.returncode == 1 and took < LIMIT_S, (took, err[-3000:])
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith("error: --tracking-uri: ") and url in lines[0], lines
    assert "stopped answering" in lines[0], lines
    # What the run computed stays in --out: at least the stored point's tables and masks.
    assert len(list((tmp_path / "out").glob("objective=*/mask.safetensors"))) >= 1

    stopped = _causalab("server", "stop", "--root", str(root))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    restarted = _causalab("server", "start", "--root", str(root), "--port", url.rsplit(":", 1)[1])
    groups.update(_groups(root))
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("causalab").experiment_id
    # Left open by the run whose database died (its sweep's parent at least): the rerun's to end.
    left_open = {run.info.run_id for run in client.search_runs([experiment], max_results=1000)
                 if run.info.status == "RUNNING"}
    assert left_open
    again = _start_run(url, tmp_path)
    try:
        _, err = again.communicate(timeout=600)
    finally:
        again.kill()
    assert again.returncode == 0, err[-3000:]

    found = client.search_runs([experiment], max_results=1000)
    assert [run.info.run_name for run in found if run.info.status == "RUNNING"] == []
    points = [run for run in found if run.data.tags.get(store.KIND) == "point"]
    finished = Counter(run.data.tags[store.PRODUCED_BY] for run in points
                       if run.info.status == "FINISHED")
    assert len(finished) == POINTS and set(finished.values()) == {1}, finished
    # A point left open is ended KILLED by the rerun's reaping, never computed twice.
    stale = [run for run in points if run.info.status != "FINISHED"]
    assert all(run.info.status == "KILLED" and run.info.run_id in left_open
               and "died without ending it" in run.data.tags[store.ERROR] for run in stale)


@pytest.mark.cluster
def test_sigterm_while_postgres_is_dead_ends_the_run_within_five_seconds(stack, tmp_path):
    root, url, _ = stack
    run = _start_run(url, tmp_path)
    try:
        _until_a_point_is_stored(url, run)
        _kill_postgres(root)
        # The run's next MLflow call now meets a server whose database is gone; MLflow's tries
        # (reach.DEADLINES: two back-offs of at least 1 and 2 s) have not yet run out.
        time.sleep(1)
        assert run.poll() is None, "the run ended before the SIGTERM"
        run.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = run.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        run.kill()
    assert run.returncode == 143 and took < 5, (took, err[-3000:])
    assert _said(err) == ["error: interrupted (SIGTERM)"]


class _Unavailable(http.server.BaseHTTPRequestHandler):
    """Every request answered 503, as ``mlflow server`` answers once its database is gone."""

    def _answer(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def test_a_server_answering_503_to_every_try_is_a_store_that_stopped_answering_in_seconds():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as failed:
            store.client(uri).get_run("0123456789abcdef")
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - started < 30  # MLflow's tries under reach.DEADLINES, not minutes
    refused = translated(failed.value, uri)
    assert isinstance(refused, Unanswered)
    message = refused.message
    assert message.startswith(f"the tracking store at {uri} stopped answering (")
    assert "503" in message and "\n" not in message
