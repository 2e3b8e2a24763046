"""The MLflow worker process: a tracked run's main process never imports MLflow, a refusal
made there crosses back whole, an interrupt stops only the caller's wait, a dropped worker ends
mid-call and the next call gets a new one, and the worker ends with the process that started
it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from causalab.errors import CausalabError, RunError, TrackingError, UsageError
from causalab.tracking import artifacts, worker as workers
from causalab.tracking import runs as store

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(HF_HUB_OFFLINE="1", CAUSALAB_QUIET="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **extra)
    return env


_TRACKED_RUN = """
import sys
from causalab.cli.main import main
status = main(["run", sys.argv[1], "--out", sys.argv[2], "--data-root", sys.argv[3],
               "--tracking-uri", sys.argv[4]])
import os
print(os.getpid(), status, "mlflow" in sys.modules, "matplotlib" in sys.modules)
"""


def test_a_tracked_run_s_process_never_imports_mlflow_and_its_runs_are_whole(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    document = REPO / "documents" / "v2" / "head_patching.json"
    done = subprocess.run([sys.executable, "-c", _TRACKED_RUN, str(document), str(tmp_path / "out"),
                           DATA, uri], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pid, *rest = done.stdout.split()[-4:]
    # No mlflow in the run's process; matplotlib draws the sweep's pictures into its folder.
    assert rest == ["0", "False", "True"]
    assert (tmp_path / "out" / "plots").is_dir()
    client = MlflowClient(uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == store.DEFAULT_EXPERIMENT]
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get(store.KIND) == "sweep"]
    points = [r for r in runs if r.data.tags.get(store.KIND) == "point"]
    assert {r.info.status for r in runs} == {"FINISHED"} and len(points) == 4
    # The owner named is the run's own process, not the worker that wrote the tags.
    assert {json.loads(r.data.tags["causalab.owner"])["pid"] for r in runs} == {int(pid)}
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "plots")] \
        == ["plots/sweep_curve.png"]


@pytest.mark.parametrize("error", [TrackingError(("tracking", "uri"), "no store there"),
                                   RunError(("steps", "fit", 0), "a refusal"),
                                   UsageError(("--out",), "a usage line")])
def test_a_refusal_pickles_as_itself(error):
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert (again.path, again.message) == (error.path, error.message)


def test_a_refusal_raised_in_the_worker_is_the_same_refusal_in_the_caller(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store.client(uri)  # the store exists, the run does not
    with pytest.raises(CausalabError) as here:
        artifacts.resolve_artifact("runs:/0123456789abcdef/weights.safetensors", uri)
    with pytest.raises(CausalabError) as there:
        workers.worker().call(None, artifacts.resolve_artifact,
                              "runs:/0123456789abcdef/weights.safetensors", uri)
    assert type(there.value) is type(here.value) and str(there.value) == str(here.value)


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt here: Python keeps it ignored when it starts that way
    (a test run sent to the background by a non-interactive shell)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupt_while_a_call_is_awaited_stops_the_wait_and_the_worker_runs_on(
        sigint_raises):
    first = workers.worker()
    pid = first.call(None, os.getpid)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        first.call(None, time.sleep, 3)  # the worker itself ignores the SIGINT
    timer.join()
    assert time.monotonic() - started < 2.5
    # The call ran on; the next one is served after it, by the same process.
    assert workers.worker() is first and first.call(None, os.getpid) == pid


def test_a_dropped_worker_ends_at_once_mid_call_and_the_next_call_gets_a_new_one():
    first = workers.worker()
    pid = first.call(None, os.getpid)
    answered: list = []

    def sleep() -> None:
        try:
            first.call(None, time.sleep, 60)
        except workers.WorkerGone as gone:
            answered.append(gone)
    caller = threading.Thread(target=sleep)
    caller.start()
    time.sleep(0.5)
    started = time.monotonic()
    first.drop()
    caller.join(timeout=15)
    assert len(answered) == 1 and time.monotonic() - started < 15
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)
    second = workers.worker()
    assert second is not first and second.call(None, os.getpid) not in (pid, os.getpid())


_STARTS_A_WORKER = """
import os, threading, time
from causalab.tracking import worker
print(worker.worker().call(None, os.getpid), flush=True)
threading.Thread(target=worker.worker().call, args=(None, time.sleep, 120), daemon=True).start()
time.sleep(1)
os._exit(0)  # as an interrupted run leaves: no exit handler, a call still running
"""


def test_the_worker_ends_when_the_process_that_started_it_ends_even_mid_call():
    done = subprocess.run([sys.executable, "-c", _STARTS_A_WORKER], env=_env(),
                          capture_output=True, text=True, timeout=100)
    # The worker shares the stderr pipe: had it outlived its process by the 120 s call,
    # reading the pipe to its end would have timed out above.
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() \
            and "Z" not in _state(pid):
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_mlflow_s_limits_are_the_ones_causalab_names_keys_by():
    from mlflow.utils import validation

    for name in ("MAX_ENTITY_KEY_LENGTH", "MAX_PARAM_VAL_LENGTH", "MAX_TAG_VAL_LENGTH",
                 "MAX_METRICS_PER_BATCH", "MAX_PARAMS_TAGS_PER_BATCH"):
        assert getattr(store, name) == getattr(validation, name), name
