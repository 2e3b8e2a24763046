"""The team stack for real: ``causalab server`` (PostgreSQL + mlflow server), parallel and
cluster launchers writing to it, and jobs that die by SIGKILL inside their worker.

Every multirun is a real ``python -m causalab.run -m`` in its own process group (killed by
that group when it ends, and checked empty); the server is started and stopped with the
``causalab server`` command and its process groups are checked empty after the stop. Metrics
are compared with one sequential multirun (Hydra's basic launcher, a SQLite store) of the
same jobs. Run with ``make test-cluster``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow import MlflowClient

from causalab.hydra import jobs
from causalab.tracking import runs as store

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODELS = ["tiny_llama", "tiny_gpt2", "tiny_qwen2", "tiny_gemma2"]
# Jobs run in other processes with other thread counts than the baseline: float32 reductions
# may then differ by a few ulps of values of order 10, never by more than 1e-4.
TOLERANCE = 1e-4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _processes() -> list[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every live process."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            found.append((int(stat.parent.name), stat.read_text().rsplit(")", 1)[1].split()))
        except (OSError, IndexError):
            continue
    return found


def _group_members(group: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    return [pid for pid, fields in _processes() if int(fields[2]) == group and fields[0] != "Z"]


def _children_of(pid: int) -> list[int]:
    return [child for child, fields in _processes() if int(fields[1]) == pid]


def _causalab(*arguments: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "causalab", *arguments], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def team_server():
    """``causalab server start`` on a free port; ``causalab server stop`` leaves nothing."""
    # PostgreSQL runs as its own user when root starts it: the root must be reachable by it,
    # and pytest's own temporary folders are 0700.
    home = Path(tempfile.mkdtemp(prefix="causalab-pg-"))
    os.chmod(home, 0o755)
    root, port = home / "stack", _free_port()
    started = _causalab("server", "start", "--root", str(root), "--port", str(port))
    stack = json.loads((root / "server.json").read_text()) if (root / "server.json").is_file() else {}
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert started.stdout.strip() == f"http://127.0.0.1:{port}"
        workers = _children_of(stack["pg_pid"])
        yield {"url": stack["url"], "root": root, "stack": stack, "pg_workers": workers}
    finally:
        stopped = _causalab("server", "stop", "--root", str(root))
        left = [pid for group in (stack.get("pg_pid", 0), stack.get("mlflow_pid", 0))
                for pid in _group_members(group)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert left == [] and all(not Path(f"/proc/{pid}").exists() for pid in workers)


@pytest.fixture(scope="module")
def model_home(tmp_path_factory):
    """One built-in model cache for every job of this module, outside the user's."""
    return os.environ.get("CAUSALAB_TEST_HOME") or str(tmp_path_factory.mktemp("causalab-home"))


def _listening(group: int) -> set[str]:
    """Addresses that processes of ``group`` listen on (TCP), read from /proc."""
    inodes = set()
    for pid in _group_members(group):
        try:
            links = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        inodes.update(link[8:-1] for link in links if link.startswith("socket:["))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(_address(fields[1].split(":")[0]))
    return found


def _address(word: str) -> str:
    """/proc/net's little-endian hex address as text (IPv4, or IPv6 as 32 hex digits)."""
    raw = bytes.fromhex(word)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _multirun(arguments: list[str], cwd: Path, uri: str, home: str, ok: bool = True,
              listeners: set | None = None):
    """``python -m causalab.run -m`` in its own process group, which must end empty.

    ``listeners`` collects the addresses the group listens on while it runs."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, CAUSALAB_HOME=home, HF_HUB_OFFLINE="1",
               MLFLOW_DISABLE_TELEMETRY="true", RAY_AUTH_MODE="disabled",
               PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]))
    command = [sys.executable, "-m", "causalab.run", "-m", "experiment=layer_sweep", *arguments,
               f"run.data_root={REPO / 'documents' / 'data'}", f"hydra.sweep.dir={cwd}"]
    log = cwd.parent / f"{cwd.name}.log"
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=cwd.parent, env=env, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while process.poll() is None and time.monotonic() < deadline:
            if listeners is not None:
                listeners.update(_listening(process.pid))
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 20
        while _group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _group_members(process.pid)
        if left:
            os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    assert (process.returncode == 0) == ok, text[-4000:]
    assert left == [], f"processes left in the multirun's group: {left}"
    return text


def _points(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=5000)
    return [r for r in runs if r.data.tags.get(store.KIND) == "point"
            and store.REUSED_FROM not in r.data.tags]  # a link child computes nothing


def _links(uri: str, experiment: str) -> list:
    """Point runs that only link a point done earlier into a new parent."""
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=5000)
    return [r for r in runs if store.REUSED_FROM in r.data.tags]


def _key(run) -> tuple[str, str]:
    return run.data.params["model"], run.info.run_name


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, model_home):
    """Every (model, point) -> metrics of one sequential multirun on a SQLite store."""
    folder = tmp_path_factory.mktemp("sequential")
    uri = f"sqlite:///{folder}/mlflow.db"
    _multirun([f"model={','.join(MODELS)}"], folder / "multirun", uri, model_home)
    points = _points(uri, "causalab")
    assert {r.info.status for r in points} == {"FINISHED"}
    return {_key(r): dict(r.data.metrics) for r in points}


def _assert_complete(points: list, sequential: dict, models: list[str]) -> None:
    """0 lost, 0 duplicated, 0 RUNNING, and the metrics of the sequential run."""
    expected = {key for key in sequential if key[0] in models}
    finished = [r for r in points if r.info.status == "FINISHED"]
    assert not [r for r in points if r.info.status == "RUNNING"]
    assert Counter(_key(r) for r in finished) == Counter(expected)
    digests = Counter(r.data.tags[store.PRODUCED_BY] for r in finished)
    assert len(digests) == len(expected) and set(digests.values()) == {1}
    for run in finished:
        assert run.data.metrics.keys() == sequential[_key(run)].keys()
        for name, value in run.data.metrics.items():
            assert value == pytest.approx(sequential[_key(run)][name], abs=TOLERANCE), name


def test_the_server_keeps_its_runs_in_postgresql(team_server):
    import psycopg2

    client = MlflowClient(team_server["url"])
    experiment = client.create_experiment(f"probe-{time.monotonic_ns()}")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "probe", 2.5)
    stack = team_server["stack"]
    password = (team_server["root"] / "password").read_text().strip()
    with psycopg2.connect(host="127.0.0.1", port=stack["pg_port"], user="mlflow",
                          password=password, dbname="mlflow") as connection:
        with connection.cursor() as cursor:
            cursor.execute("select value from metrics where run_uuid = %s and key = 'probe'",
                           (run.info.run_id,))
            assert cursor.fetchall() == [(2.5,)]


def test_four_joblib_jobs_on_the_postgresql_server_lose_and_duplicate_nothing(
        team_server, sequential, model_home, tmp_path, experiment_name):
    sweep = tmp_path / "multirun"
    _multirun(["hydra/launcher=joblib", "hydra.launcher.n_jobs=4", f"model={','.join(MODELS)}",
               f"tracking.experiment={experiment_name}"], sweep, team_server["url"], model_home)
    points = _points(team_server["url"], experiment_name)
    _assert_complete(points, sequential, MODELS)
    # Each job got the parent inside its own config, not only through the sweep folder.
    parents = {r.data.tags[store.PARENT] for r in points}
    handed = set()
    for job in range(len(MODELS)):
        hydra = (sweep / str(job) / ".hydra" / "hydra.yaml").read_text()
        word = hydra.split(f"{jobs.ENV}: ", 1)[1].split()[0].strip("'\"")
        handed.add(jobs.decode(word)["run_id"])
    (parent,) = handed
    client = MlflowClient(team_server["url"])
    assert {client.get_run(p).data.tags[store.PARENT] for p in parents} == {parent}


LAUNCHERS = {
    "ray": ["hydra/launcher=ray"],
    "submitit_local": ["hydra/launcher=submitit_local"],
}


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=["on_ray", "on_submitit_local"])
def test_a_job_killed_in_its_worker_leaves_its_point_killed_and_a_rerun_adds_only_the_rest(
        launcher, team_server, sequential, model_home, tmp_path, experiment_name):
    url, models = team_server["url"], ["tiny_llama", "tiny_gpt2"]
    arguments = [*LAUNCHERS[launcher], f"model={','.join(models)}",
                 f"tracking.experiment={experiment_name}"]
    if launcher == "ray":
        ray_dir = Path(tempfile.mkdtemp(prefix="clray-"))  # short: Ray's socket paths
        arguments.append(f"+hydra.launcher.ray.init._temp_dir={ray_dir}")
    kill = ["+hydra.callbacks.kill._target_=kill_job.KillJob",
            "+hydra.callbacks.kill.model=tiny_gpt2"]
    listeners: set[str] = set()
    try:
        _multirun(arguments + kill, tmp_path / "first", url, model_home, ok=False,
                  listeners=listeners)
        first = _points(url, experiment_name)
        killed = [r for r in first if r.info.status != "FINISHED"]
        assert [r.info.status for r in killed] == ["KILLED"]
        assert killed[0].data.params["model"] == "tiny_gpt2"
        assert killed[0].data.tags[store.ERROR] == jobs.LOST
        assert Counter(r.data.params["model"] for r in first if r.info.status == "FINISHED") \
            == Counter({"tiny_llama": 4})
        _multirun(arguments, tmp_path / "again", url, model_home)
    finally:
        if launcher == "ray":
            shutil.rmtree(ray_dir, ignore_errors=True)
    if launcher == "ray":  # the cluster the launcher started listened on loopback only
        assert listeners and listeners <= LOOPBACK, listeners
    after = _points(url, experiment_name)
    _assert_complete(after, sequential, models)
    added = {r.info.run_id for r in after} - {r.info.run_id for r in first}
    assert sorted(_key(r) for r in after if r.info.run_id in added) == sorted(
        key for key in sequential if key[0] == "tiny_gpt2")
    # The rerun's tiny_llama job computed nothing new: its parent links the four done points.
    assert sorted(r.info.run_name for r in _links(url, experiment_name)) == sorted(
        key[1] for key in sequential if key[0] == "tiny_llama")
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name(experiment_name).experiment_id
    statuses = Counter(r.info.status for r in client.search_runs([experiment], max_results=5000))
    assert statuses["RUNNING"] == 0
