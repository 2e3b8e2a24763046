"""``causalab ui``: MLflow's own UI on the store a run used, and the addresses that open its sweep.

It starts ``mlflow ui`` on a SQLite store, bound to 127.0.0.1 on a free port (or ``--port``),
without job execution and in a process group of its own; once the UI answers it prints the
addresses of the newest sweep (or ``--run``'s): the runs page on the sweep's saved view (its
points as the rows, its coordinates and scores as the columns, in model-training
navigation) and the same view's charts (its scores against the swept coordinate first).
Ctrl-C or SIGTERM stops the group. A
server store (``http://…``) is already served: only its addresses are printed. The UI is
MLflow's with causalab's app (:mod:`causalab.server.mlflow_app`): a browser's first visit,
whatever address it opens, gets model-training navigation and no assistant pane. What MLflow
3.17 lets no server set (anything on its compare page) is said in docs/tour.md.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from causalab.errors import TrackingError, UsageError
from causalab.server.stack import HOST, answers, free_port, group_alive, stop_group

STARTUP_S = 180.0


def store_uri(store: str | None) -> str:
    """The store a run used: a tracking URI, a folder holding ``mlflow.db``, the database file
    itself, or (none given) what a run in this folder tracks to."""
    from causalab.tracking.runs import resolve_uri

    if store and Path(store).is_file():
        return f"sqlite:///{Path(store).resolve()}"
    return resolve_uri(store)


def sweep_lines(uri: str, base: str, run_id: str | None = None) -> list[str]:
    """The addresses that open ``run_id``'s sweep (else the newest one landed) in the UI at
    ``base``; the experiment's runs page when no sweep was landed."""
    from causalab.tracking import landing
    from causalab.tracking import runs as store

    mlflow = store.client(uri)
    found = landing.newest_landed(mlflow, run_id)
    if found is None:
        if run_id is not None:
            raise UsageError(("--run",), f"run {run_id} is no sweep parent with a saved view "
                                         f"in {uri}")
        experiment = mlflow.get_experiment_by_name(store.default_experiment(uri))
        page = store.runs_page(base, experiment.experiment_id if experiment else None)
        return [f"runs: {page}"]
    experiment, parent, points = found
    return landing.where(base, experiment, parent, points)


def _start(uri: str, port: int, log) -> subprocess.Popen:
    from causalab.server.mlflow_app import app_arguments

    mlflow = Path(sys.executable).with_name("mlflow")
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
               MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    app = app_arguments()
    if not app:
        print("note: causalab's MLflow app is not registered (`make setup` registers it): "
              "an address without workflowType opens MLflow's GenAI pages", file=sys.stderr)
    return subprocess.Popen(
        [str(mlflow), "ui", "--host", HOST, "--port", str(port), "--workers", "1",
         "--backend-store-uri", uri, *app],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env=env)


def _wait(url: str, process: subprocess.Popen, log_path: str, stopping: list) -> None:
    deadline = time.monotonic() + STARTUP_S
    while not answers(url) and not stopping:
        if process.poll() is not None or time.monotonic() > deadline:
            tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-3:]
            raise TrackingError(("ui",), f"mlflow ui did not answer at {url}: "
                                + " | ".join(tail))
        time.sleep(0.5)


def serve(store: str | None = None, *, port: int = 0, run_id: str | None = None) -> dict:
    """Serve the store until Ctrl-C or SIGTERM; returns what was served."""
    from causalab.tracking.runs import store_exists

    uri = store_uri(store)
    if uri.startswith(("http://", "https://")):
        return {"url": uri, "lines": sweep_lines(uri, uri, run_id), "started": False}
    if not store_exists(uri):
        raise UsageError(("--store",), f"there is no tracking store at {uri}")
    port = port or free_port()
    url = f"http://{HOST}:{port}"
    with tempfile.NamedTemporaryFile(prefix="causalab-ui-", suffix=".log") as log:
        process = _start(uri, port, log)
        stopping: list[int] = []
        lines: list[str] = []
        # By hand: a shell starts a background job with SIGINT ignored, and Python then
        # raises no KeyboardInterrupt.
        previous = {number: signal.signal(number, lambda number, _: stopping.append(number))
                    for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            _wait(url, process, log.name, stopping)
            lines = [] if stopping else sweep_lines(uri, url, run_id)
            print("\n".join([f"mlflow ui on {uri}: {url} (Ctrl-C stops it)", *lines]),
                  flush=True)
            while not stopping and group_alive(process.pid):
                time.sleep(0.5)
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            stop_group(process.pid, signal.SIGTERM, 15.0)
    return {"url": url, "lines": lines, "started": True, "store": uri}


def add_arguments(parser) -> None:
    parser.add_argument("--store", default=None,
                        help="tracking URI, folder of mlflow.db, or the file (default: what a "
                             "run here tracks to: MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--run", default=None,
                        help="the sweep's parent run id (default: the newest sweep)")


def verb(args) -> dict:
    """Start MLflow's UI on a run's store, print the addresses of its sweep, stop on Ctrl-C."""
    served = serve(args.store, port=args.port, run_id=args.run)
    text = "\n".join(served["lines"]) if not served["started"] else f"stopped {served['url']}"
    return {**served, "text": text}
