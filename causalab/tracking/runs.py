"""Where runs live and how they are found: tracking URI, experiment, run records, params.

Every call goes through an ``MlflowClient`` built for one explicit URI and takes explicit
run ids; nothing here touches MLflow's fluent, process-global active-run stack or sets
environment variables (they would leak into child processes) but MLflow's HTTP deadlines
(``reach.DEADLINES``), which every process talking to a store should have. A client is
made by :func:`causalab.tracking.reach.client`. URI order
(docs/platform.md §5): ``MLFLOW_TRACKING_URI``, then the configured URI, then a SQLite database
``mlflow.db`` with artifacts in ``mlartifacts/`` under the working directory; the ``./mlruns``
file store is never used.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple
from urllib.parse import urlparse

from causalab.document.names import MAX_ENTITY_KEY_LENGTH, mlflow_key
from causalab.errors import TrackingError
from causalab.tracking.moved import ROOT_TAG
from causalab.tracking.reach import client, sqlite_file

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_EXPERIMENT = "causalab"
DATABASE = "mlflow.db"
ARTIFACTS = "mlartifacts"
PARENT = "mlflow.parentRunId"
PRODUCED_BY = "causalab.produced_by"
POINT = "causalab.point"
VERSION = "causalab.version"
KIND = "causalab.kind"
ERROR = "causalab.error"
COORDINATES = "causalab.coordinates"
MODEL_KEY = "causalab.model.key"
MODEL_REVISION = "causalab.model.revision"
SWEEP = "causalab.sweep"
OVERRIDES = "causalab.overrides"
REUSED_FROM = "causalab.reused_from"
JOB = "causalab.job"
# A point claimed at its run's start: "waiting" until the run starts computing it, then
# "started" (tracking/claims.py); a dead owner's waiting claim held nothing.
CLAIM = "causalab.claim"
# MLflow 3 opens an experiment on its GenAI pages unless this tag names a training-style kind.
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

    A plain path (no scheme) names a directory and gets what the working directory gets
    without one: ``mlflow.db`` and ``mlartifacts/`` in it. To MLflow a plain path is its file
    store, which causalab never uses (MLflow 3 refuses it too).

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


def store_exists(uri: str) -> bool:
    """False only for a SQLite store whose file is not there: opening it would create it, and
    a verb that reads (``runs``, ``fetch``) must not."""
    database = sqlite_file(uri)
    return database is None or database.is_file()


def artifact_location(uri: str) -> str | None:
    """Explicit artifact root for a SQLite store (``mlartifacts`` beside the database file).

    A server decides its own (``--artifacts-destination``), so it gets ``None``.
    """
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri[len("sqlite:///"):])
    return (database.resolve().parent / ARTIFACTS).as_uri()


def runs_page(base: str, experiment_id: str | None) -> str:
    """The UI address of an experiment's runs table.

    MLflow 3.17's UI picks GenAI or model-training pages from a ``workflowType`` it keeps per
    browser (GenAI unless told), not from the experiment's kind tag; the query says which.
    """
    if experiment_id is None:
        return base.rstrip("/")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def ui_command(uri: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """The one command that shows these runs: the server's runs page, or ``causalab ui`` on
    the SQLite store (``run_id``: the sweep whose addresses it prints), spelled as this
    process's own interpreter runs it, so it works when pasted where the run was started."""
    if uri.startswith(("http://", "https://")):
        return f"open {runs_page(uri, experiment_id)}"
    command = f"{causalab_command()} ui --store {uri}"
    return f"{command} --run {run_id}" if run_id else command


def causalab_command() -> str:
    """``.venv/bin/causalab`` (relative when under the working directory), else
    ``<python> -m causalab``: a bare ``causalab`` may not be on PATH."""
    import sys

    script = Path(sys.executable).with_name("causalab")
    if not script.is_file():
        return f"{sys.executable} -m causalab"
    relative = os.path.relpath(script)
    return str(script) if relative.startswith("..") else relative


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``<package version>+<first 12 hex of the SHA-256 over the package's .py files>``."""
    import hashlib
    from importlib import metadata

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
    """The id of experiment ``name``, created (with an explicit artifact root) when absent.

    Two processes may race to create it; the loser finds the winner's experiment.
    """
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if found.tags.get(EXPERIMENT_KIND[0]) is None:
            mlflow.set_experiment_tag(found.experiment_id, *EXPERIMENT_KIND)
        return found.experiment_id
    tags = dict([EXPERIMENT_KIND])
    database = sqlite_file(uri)
    if database is not None:  # where the store is made: a move or copy is rebased (moved.py)
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
    run = mlflow.create_run(experiment, run_name=name or None, tags=_tag_values(tags))
    _ARTIFACT_URIS[run.info.run_id] = (run.info.artifact_uri, mlflow.tracking_uri)
    return run.info.run_id


# Where each run this process created keeps its files: MlflowClient looks a run up (one
# store query) before its first upload; the created run already says where.
_ARTIFACT_URIS: dict[str, tuple[str, str]] = {}


def artifact_location_of(run_id: str) -> tuple[str, str] | None:
    """``(artifact_uri, tracking_uri)`` of a run this process created, else None."""
    return _ARTIFACT_URIS.get(run_id)


def terminate(mlflow: MlflowClient, run_id: str, status: str) -> None:
    """End a run. MLflow prints a server run's URL to stdout here; it goes to stderr instead,
    because a run's stdout is the list of files it wrote."""
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):
        mlflow.set_terminated(run_id, status)


def status(mlflow: MlflowClient, run_id: str) -> str:
    return mlflow.get_run(run_id).info.status


def found_run(mlflow: MlflowClient, run_id: str) -> Any:
    """The run ``run_id`` of this store, or None when the store cannot give it (no such run,
    or not a run id)."""
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.get_run(run_id)
    except MlflowException:
        return None


def parent_of(mlflow: MlflowClient, run_id: str) -> str | None:
    return mlflow.get_run(run_id).data.tags.get(PARENT)


def metrics_of(mlflow: MlflowClient, run_id: str) -> dict[str, float]:
    return dict(mlflow.get_run(run_id).data.metrics)


def delete(mlflow: MlflowClient, run_id: str) -> None:
    mlflow.delete_run(run_id)


def withdraw(mlflow: MlflowClient, run_id: str) -> None:
    """Take back a claim that held nothing: ended (no run stays RUNNING, even in the trash),
    then deleted (no list shows it)."""
    terminate(mlflow, run_id, "KILLED")
    mlflow.delete_run(run_id)


def kill(mlflow: MlflowClient, run_id: str, reason: str) -> None:
    """End a run KILLED with ``reason`` as its ``causalab.error`` tag."""
    log_batch(mlflow, run_id, tags={ERROR: reason})
    terminate(mlflow, run_id, "KILLED")


def _param_values(params: Mapping[str, Any]) -> dict[str, str]:
    """Params MLflow accepts: keys in its character set and length, values cut to its limit.

    Two names that sanitise alike keep the last value: MLflow refuses one key twice.
    """
    return {_key(k): str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in params.items() if v is not None}


def _tag_values(tags: Mapping[str, Any]) -> dict[str, str]:
    return {_key(k): str(v)[:MAX_TAG_VAL_LENGTH] for k, v in tags.items() if v is not None}


def finished_candidates(mlflow: MlflowClient, experiment: str, produced_by: str,
                        limit: int = 20) -> list:
    """FINISHED runs in ``experiment`` whose ``causalab.produced_by`` is the digest, newest
    first: the runs that computed it and links to them (a link names its origin). Which one
    holds the point's result is :func:`causalab.tracking.stored.done_runs`'s to say."""
    query = (f"tags.`{PRODUCED_BY}` = '{produced_by}' and attributes.status = 'FINISHED'")
    return list(mlflow.search_runs([experiment], filter_string=query, max_results=limit,
                                   order_by=["attributes.start_time DESC"]))


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
    """Log in one call; MLflow's client cuts it into requests within its batch limits.

    Synchronous: MLflow 3.17's ``set_terminated`` shuts its asynchronous queue down and joins
    the queue's thread (up to a second), so a point's run logged asynchronously and then
    ended cost about 0.75 s more (``scripts/bench/tracking.py``)."""
    from mlflow.entities import Metric, Param, RunTag

    numbers = [Metric(*point) for point in metrics]
    words = [Param(k, v) for k, v in _param_values(params or {}).items()]
    labels = [RunTag(k, v) for k, v in _tag_values(tags or {}).items()]
    if numbers or words or labels:
        mlflow.log_batch(run_id, metrics=numbers, params=words, tags=labels)


def metric(key: str, value: float, step: int, timestamp: int) -> Point:
    return Point(_key(key), float(value), timestamp, int(step))


def _key(key: str) -> str:
    """A key MLflow accepts: the document room's rule, so validate saw the same keys."""
    return mlflow_key(key)


def param_value(value: Any) -> str:
    """A coordinate as its sweep label writes it: one-element list bare, scalars plain, else JSON."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text[:MAX_PARAM_VAL_LENGTH]


def flatten(config: Any) -> dict[str, str]:
    """A composed config (DictConfig or plain data) as dotted ``key -> value`` params.

    Lists are indexed (``sites.resid.layers.0``); values are cut to MLflow's length limit.
    """
    data = _plain(config)
    flat: dict[str, str] = {}
    _walk(data, "", flat)
    return flat


def _plain(config: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, (DictConfig, ListConfig)):
        return OmegaConf.to_container(config, resolve=True)
    return config


def _walk(node: Any, prefix: str, flat: dict[str, str]) -> None:
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            _walk(value, f"{prefix}.{key}" if prefix else str(key), flat)
    elif isinstance(node, (list, tuple)) and node:
        for index, value in enumerate(node):
            _walk(value, f"{prefix}.{index}" if prefix else str(index), flat)
    elif prefix:
        text = node if isinstance(node, str) else json.dumps(node)
        flat[_key(prefix)] = text[:MAX_PARAM_VAL_LENGTH]
