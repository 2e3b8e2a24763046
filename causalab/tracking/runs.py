"""Where runs live and how they are found: tracking URI, experiment, run records, params.

Every call takes an ``MlflowClient`` built for one URI (:func:`reach.client`) and explicit run
ids: no fluent run stack, no ``MLFLOW_TRACKING_URI`` set for child processes to inherit. URI
order: docs/platform.md §5.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple
from urllib.parse import urlparse

from causalab.document.names import mlflow_key
from causalab.errors import TrackingError
from causalab.tracking.reach import Bounded, client, sqlite_file
from causalab.tracking.sqlite_store import ARTIFACTS, ROOT_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_EXPERIMENT = "causalab"
DATABASE = "mlflow.db"
PARENT = "mlflow.parentRunId"
PRODUCED_BY = "causalab.produced_by"
POINT = "causalab.point"
VERSION = "causalab.version"
KIND = "causalab.kind"
ERROR = "causalab.error"
COORDINATES = "causalab.coordinates"
MODEL_KEY = "causalab.model.key"
MODEL_REVISION = "causalab.model.revision"
# The control that replaced the checkpoint's weights (random_init); absent on a trained run.
MODEL_CONTROL = "causalab.model.control"
SWEEP = "causalab.sweep"
OVERRIDES = "causalab.overrides"
REUSED_FROM = "causalab.reused_from"
JOB = "causalab.job"
# The coordinate a swept point logged its scores against as MLflow's step (points.step_axis).
STEP_AXIS = "causalab.step_axis"
# MLflow's run description: the Markdown its UI shows at the top of a run's page.
NOTE = "mlflow.note.content"
# A point claimed at its run's start: "waiting" until the run starts computing it, then
# "started" (tracking/claims.py); a dead owner's waiting claim held nothing.
CLAIM = "causalab.claim"
# The experiment's kind as MLflow names it: a model-training experiment. MLflow 3.17's UI takes
# its navigation from the address or the browser instead (causalab/server/mlflow_app.py).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# MLflow's limits (mlflow.utils.validation, checked against it in the tests), here so that
# params and keys are named before MLflow is imported.
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000


class Point(NamedTuple):
    """One metric value as a run buffers it: plain data, made an MLflow ``Metric`` when sent."""

    key: str
    value: float
    timestamp: int
    step: int


def resolve_uri(configured: str | None = None, cwd: str | None = None) -> str:
    """The URI runs go to: ``MLFLOW_TRACKING_URI``, else ``configured``, else ./mlflow.db.
    A plain path is a folder with ``mlflow.db`` in it, never MLflow's retired file store.

    >>> resolve_uri("http://127.0.0.1:5000") if "MLFLOW_TRACKING_URI" not in os.environ else ""
    'http://127.0.0.1:5000'
    >>> resolve_uri("/srv/runs") if "MLFLOW_TRACKING_URI" not in os.environ else ""
    'sqlite:////srv/runs/mlflow.db'
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI") or configured
    if uri and len(urlparse(uri).scheme) > 1:
        return uri
    folder = Path(cwd or os.getcwd()) / (uri or "")
    return f"sqlite:///{folder.resolve() / DATABASE}"


def default_experiment(uri: str) -> str:
    """The experiment a run goes to when none is named: ``causalab``, but on a tracking
    server with a login (``MLFLOW_TRACKING_USERNAME``) one of the user's own,
    ``causalab-<user>``: a server behind ``causalab server --auth`` gives each experiment's
    writes to its creator, so a shared default would refuse every user but the first (403).

    >>> default_experiment("sqlite:////tmp/mlflow.db")
    'causalab'
    """
    user = os.environ.get("MLFLOW_TRACKING_USERNAME", "").strip()
    if user and uri.startswith(("http://", "https://")):
        return f"{DEFAULT_EXPERIMENT}-{user}"
    return DEFAULT_EXPERIMENT


def store_exists(uri: str) -> bool:
    """False only for a SQLite store whose file is not there: opening it would create it, and
    a verb that reads (``runs``, ``fetch``) must not."""
    database = sqlite_file(uri)
    return database is None or database.is_file()


def artifact_location(uri: str) -> str | None:
    """A SQLite store's artifact root, beside it; None for a server, which decides its own."""
    database = sqlite_file(uri)
    return None if database is None else (database.resolve().parent / ARTIFACTS).as_uri()


def runs_page(base: str, experiment_id: str | None) -> str:
    """The UI address of an experiment's runs table. MLflow 3.17's UI picks GenAI or training
    pages by the address's ``workflowType``, else by a choice it keeps per browser, never by
    the experiment's tag: asked here."""
    if experiment_id is None:
        return base.rstrip("/")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def ui_command(uri: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """The one command that shows these runs: the server's runs page, or ``causalab ui`` on
    the SQLite store (``run_id``: the sweep whose addresses it prints). The command is this
    interpreter's (relative when under the working directory): ``causalab`` may not be on PATH."""
    if uri.startswith(("http://", "https://")):
        return f"open {runs_page(uri, experiment_id)}"
    script = Path(sys.executable).with_name("causalab")
    if not script.is_file():
        command = f"{sys.executable} -m causalab"
    else:
        relative = os.path.relpath(script)
        command = str(script) if relative.startswith("..") else relative
    command += f" ui --store {uri}"
    return f"{command} --run {run_id}" if run_id else command


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``<package version>+<first 12 hex of the SHA-256 over the package's .py files>``."""
    try:
        version = metadata.version("causalab")
    except metadata.PackageNotFoundError:
        version = "0"
    package = Path(__file__).resolve().parents[1]
    sha = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        sha.update(path.read_bytes())
    return f"{version}+{sha.hexdigest()[:12]}"


def experiment_id(mlflow: MlflowClient, name: str, uri: str) -> str:
    """The id of experiment ``name``, created when absent (of two processes racing to create
    it, the loser finds the winner's)."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if found.tags.get(EXPERIMENT_KIND[0]) is None:
            mlflow.set_experiment_tag(found.experiment_id, *EXPERIMENT_KIND)
        return found.experiment_id
    tags = dict([EXPERIMENT_KIND])
    database = sqlite_file(uri)
    if database is not None:  # where the store is made: a move or copy is rebased
        tags[ROOT_TAG] = str(database.resolve().parent)
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_location(uri),
                                        tags=tags)
    except Exception as error:
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise TrackingError(("tracking", "experiment"),
                                f"cannot create experiment {name!r} at {uri}: {error}") from None
        return found.experiment_id


def create_run(mlflow: MlflowClient, experiment: str, name: str, tags: Mapping[str, str],
               parent: str | None = None) -> str:
    """Start one run (status RUNNING) and return its id; ``parent`` nests it."""
    tags = dict(tags)
    if parent:
        tags[PARENT] = parent
    run = mlflow.create_run(experiment, run_name=name or None,
                            tags=_cut(tags, MAX_TAG_VAL_LENGTH))
    _ARTIFACT_URIS[(run.info.run_id, mlflow.tracking_uri)] = run.info.artifact_uri
    return run.info.run_id


# Where each run this process created keeps its files, so an upload needs no store lookup.
_ARTIFACT_URIS: dict[tuple[str, str], str] = {}


def repository_of(mlflow: MlflowClient, run_id: str):
    """A run's artifact repository, found without a store lookup for a run this process created
    (MLflow's client.list_artifacts looks a run up again for each folder); its calls bounded as
    the client's (:class:`~causalab.tracking.reach.Bounded`)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    location = (_ARTIFACT_URIS.get((run_id, mlflow.tracking_uri))
                or mlflow.get_run(run_id).info.artifact_uri)
    return Bounded(get_artifact_repository(location, tracking_uri=mlflow.tracking_uri))


def terminate(mlflow: MlflowClient, run_id: str, status: str, error: str | None = None) -> None:
    """End a run, ``error`` its ``causalab.error`` tag. MLflow prints a server run's URL to
    stdout here; it goes to stderr instead, because a run's stdout is the list of files it wrote."""
    if error is not None:
        log_batch(mlflow, run_id, tags={ERROR: error})
    with contextlib.redirect_stdout(sys.stderr):
        mlflow.set_terminated(run_id, status)


def found_run(mlflow: MlflowClient, run_id: str) -> Any:
    """The run ``run_id`` of this store, or None (no such run, or not a run id)."""
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.get_run(run_id)
    except MlflowException:
        return None


def metrics_of(mlflow: MlflowClient, run_id: str) -> dict[str, float]:
    return dict(mlflow.get_run(run_id).data.metrics)


def withdraw(mlflow: MlflowClient, run_id: str) -> None:
    """Take back a claim that held nothing: ended (none stays RUNNING in the trash), deleted."""
    terminate(mlflow, run_id, "KILLED")
    mlflow.delete_run(run_id)


def kill(mlflow: MlflowClient, run_id: str, reason: str) -> None:
    """End a run KILLED with ``reason`` as its ``causalab.error`` tag."""
    terminate(mlflow, run_id, "KILLED", reason)


def _cut(values: Mapping[str, Any], limit: int) -> dict[str, str]:
    """Values MLflow accepts: keys sanitised (two alike keep the last: MLflow refuses one key
    twice), values cut to ``limit``."""
    return {mlflow_key(k): str(v)[:limit] for k, v in values.items() if v is not None}


def children(mlflow: MlflowClient, experiment: str, parent: str) -> list:
    """Every run nested directly under ``parent``."""
    query = f"tags.`{PARENT}` = '{parent}'"
    return list(mlflow.search_runs([experiment], filter_string=query, max_results=5000))


def descendants(mlflow: MlflowClient, experiment: str, parent: str) -> list:
    """Every run nested under ``parent`` at any depth, a level at a time."""
    found, frontier = [], [parent]
    while frontier:
        below = [run for run_id in frontier for run in children(mlflow, experiment, run_id)]
        frontier = [run.info.run_id for run in below]
        found += below
    return found


def log_batch(mlflow: MlflowClient, run_id: str, *, metrics: Iterable[Point] = (),
              params: Mapping[str, str] | None = None,
              tags: Mapping[str, str] | None = None) -> None:
    """Log in one call, which MLflow's client cuts into requests within its batch limits.
    Synchronous, for speed: docs/platform.md §5."""
    from mlflow.entities import Metric, Param, RunTag

    numbers = [Metric(*point) for point in metrics]
    words = [Param(k, v) for k, v in _cut(params or {}, MAX_PARAM_VAL_LENGTH).items()]
    labels = [RunTag(k, v) for k, v in _cut(tags or {}, MAX_TAG_VAL_LENGTH).items()]
    if numbers or words or labels:
        mlflow.log_batch(run_id, metrics=numbers, params=words, tags=labels)


def metric(key: str, value: float, step: int = 0, timestamp: int | None = None) -> Point:
    """One value under a key MLflow accepts (validate's rule), at ``timestamp`` ms, else now."""
    when = int(time.time() * 1000) if timestamp is None else timestamp
    return Point(mlflow_key(key), float(value), when, int(step))


def param_value(value: Any) -> str:
    """A coordinate as its sweep label writes it: one element bare, scalars plain, else JSON."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        value = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return value[:MAX_PARAM_VAL_LENGTH]
