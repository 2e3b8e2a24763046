"""``causalab server --auth`` for real: MLflow's basic-auth app in front of the PostgreSQL
store. A write without credentials is refused (401); a causalab run with the admin's
credentials, read from the 0600 file beside the database's password into the environment
MLflow's client reads, stores its point FINISHED. ``server status`` exits 0 only while both
PostgreSQL and MLflow answer. Run with ``make test-cluster``."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from causalab.server.auth import credentials
from test_cluster import _causalab, _free_port, _group_members

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def auth_server():
    """``causalab server start --auth`` on a free port; stopped by its command, groups empty."""
    home = Path(tempfile.mkdtemp(prefix="causalab-pg-auth-"))
    os.chmod(home, 0o755)  # PostgreSQL runs as its own user when root starts it
    root, port = home / "stack", _free_port()
    started = _causalab("server", "start", "--auth", "--root", str(root), "--port", str(port))
    stack = json.loads((root / "server.json").read_text()) if (root / "server.json").is_file() else {}
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        yield {"url": stack["url"], "root": root, "stdout": started.stdout}
    finally:
        stopped = _causalab("server", "stop", "--root", str(root))
        left = [pid for group in (stack.get("pg_pid", 0), stack.get("mlflow_pid", 0))
                for pid in _group_members(group)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        after = _causalab("server", "status", "--root", str(root))
        shutil.rmtree(home, ignore_errors=True)
    assert stopped.returncode == 0 and left == []
    assert after.returncode == 1 and "not answering" in after.stderr


def _create_experiment(url: str, headers: dict) -> int:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/create",
                                     data=json.dumps({"name": "intruder"}).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_printed_uri_and_the_admin_password_file(auth_server):
    root = auth_server["root"]
    line = auth_server["stdout"].strip()
    assert line.startswith(auth_server["url"]) and str(root / "admin_password") in line
    secret = (root / "admin_password").read_text().strip()
    assert secret and secret not in line
    assert stat.S_IMODE((root / "admin_password").stat().st_mode) == 0o600
    assert (root / "password").is_file()  # beside the database's
    assert _causalab("server", "status", "--root", str(root)).returncode == 0


def test_an_unauthenticated_write_gets_401(auth_server):
    assert _create_experiment(auth_server["url"], {}) == 401


def test_a_causalab_run_with_the_credentials_stores_its_point_and_one_without_is_refused(
        auth_server, tmp_path, monkeypatch):
    url, root = auth_server["url"], auth_server["root"]
    env = dict(os.environ, PYTHONPATH=str(REPO), MLFLOW_EXPERIMENT_NAME="auth",
               HF_HUB_OFFLINE="1")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    command = [sys.executable, "-m", "causalab", "run", str(REPO / "documents" / "v2" /
                                                             "patching.json"),
               "--tracking-uri", url, "--data-root", str(REPO / "documents" / "data")]
    refused = subprocess.run(command + ["--out", str(tmp_path / "anonymous")], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 1 and len(lines) == 1 and "Traceback" not in refused.stderr
    assert lines[0].startswith("error: --tracking-uri: ") and "MLFLOW_TRACKING_PASSWORD" in lines[0]
    assert "--debug" not in lines[0], lines[0]
    done = subprocess.run(command + ["--out", str(tmp_path / "admin")],
                          env={**env, **credentials(root)}, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    from mlflow import MlflowClient

    for key, value in credentials(root).items():
        monkeypatch.setenv(key, value)
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("auth")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.status for run in runs] == ["FINISHED"]
    assert "iia/patch" in runs[0].data.metrics


def _run(url: str, tmp_path: Path, name: str, login: dict, experiment: str | None = None):
    """``causalab run`` of the patching document against ``url`` as ``login``."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", **login)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(key, None)
    if experiment:
        env["MLFLOW_EXPERIMENT_NAME"] = experiment
    command = [sys.executable, "-m", "causalab", "run",
               str(REPO / "documents" / "v2" / "patching.json"), "--tracking-uri", url,
               "--data-root", str(REPO / "documents" / "data"), "--out", str(tmp_path / name)]
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def _create_user(url: str, admin: dict, username: str, password: str) -> int:
    import base64

    token = base64.b64encode(f"{admin['MLFLOW_TRACKING_USERNAME']}:"
                             f"{admin['MLFLOW_TRACKING_PASSWORD']}".encode()).decode()
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/users/create",
        data=json.dumps({"username": username, "password": password}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.status


def test_a_second_user_s_first_run_goes_to_an_experiment_of_their_own_and_a_403_says_whose(
        auth_server, tmp_path, monkeypatch):
    """With no experiment named, each login's runs go to ``causalab-<user>``, which its first
    run creates and so owns: the first user's does not refuse the second (HTTP 403)."""
    import secrets

    url, admin = auth_server["url"], credentials(auth_server["root"])
    bob = {"MLFLOW_TRACKING_USERNAME": "bob",
           "MLFLOW_TRACKING_PASSWORD": secrets.token_urlsafe(18)}
    assert _create_user(url, admin, bob["MLFLOW_TRACKING_USERNAME"],
                        bob["MLFLOW_TRACKING_PASSWORD"]) == 200
    first = _run(url, tmp_path, "admin", admin)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _run(url, tmp_path, "bob", bob)
    assert second.returncode == 0, second.stderr[-3000:]
    # Into the first user's experiment, by name: refused in one line that says why.
    refused = _run(url, tmp_path, "bob-into-admin", bob, experiment="causalab-admin")
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 1 and len(lines) == 1 and "Traceback" not in refused.stderr
    assert "HTTP 403: user 'bob' has no permission on experiment 'causalab-admin'" in lines[0]
    from mlflow import MlflowClient

    for key, value in bob.items():
        monkeypatch.setenv(key, value)
    client = MlflowClient(url)
    mine = client.get_experiment_by_name("causalab-bob")
    assert [run.info.status for run in client.search_runs([mine.experiment_id])] == ["FINISHED"]


def test_the_secrets_are_0600_and_no_other_user_reads_the_artifacts(auth_server):
    """Run after the runs above stored their files through the server."""
    root = auth_server["root"]
    for name in ("password", "admin_password", "flask_secret", "basic_auth.ini",
                 "basic_auth.db", "mlflow.log", "postgres.log"):
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o600, name
    artifacts = root / "artifacts"
    assert stat.S_IMODE(artifacts.stat().st_mode) == 0o700
    stored = [path for path in artifacts.rglob("*")]
    assert any(path.is_file() for path in stored)
    assert [path for path in stored if path.stat().st_mode & 0o077] == []
