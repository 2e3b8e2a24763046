"""``TrackingEvents``: the engine's progress events, logged to MLflow one run per point.

A swept document gets a parent run and one child per point (``mlflow.parentRunId``); inside
a Hydra multirun the job's runs nest under the multirun's parent instead of standing alone.
A point whose digest already has a FINISHED run in the experiment is skipped (resume) unless
``rerun``. Numbers are buffered and sent with ``log_batch``. A point that raises ends FAILED
with the error as the ``causalab.error`` tag; an interrupt ends it KILLED; a run is marked
FINISHED only after its files are logged. Never touches MLflow's fluent active-run stack.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from causalab.engine.events import Events
from causalab.files import DEFAULT_OUT, DOCUMENT, HYDRA_CONFIG, RUN_RECORD
from causalab.tracking import artifacts, owners, plots
from causalab.tracking import runs as store
from causalab.tracking.reach import reach, source_of

_FLUSH_AT = 1000


@dataclass
class _PointRun:
    """What one open point run has buffered."""

    run_id: str
    steps: list[str]
    fits: dict[str, str]
    metrics: list = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)
    losses: dict[str, list[float]] = field(default_factory=dict)
    evals: dict[str, list[float]] = field(default_factory=dict)


class TrackingEvents(Events):
    """Log a run of a document to MLflow (PLATFORM §5).

    ``tracking_uri``: MLFLOW_TRACKING_URI wins, then this, then ./mlflow.db. ``experiment``:
    the MLflow experiment name (MLFLOW_EXPERIMENT_NAME, else ``causalab``). ``hydra_config``:
    the job's composed config, logged as ``hydra_config.yaml`` and flattened into params.
    ``parent_run_id``: nest under this run (a multirun's parent); ``run_name``: the name of the
    job's top run (its overrides); ``job_params``: extra params (a job's swept overrides).
    ``out``: the run's output folder (default: ``--out`` found in ``argv``, else ``out``).
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None,
                 rerun: bool = False, hydra_config: Any = None, *, out: str | None = None,
                 parent_run_id: str | None = None, run_name: str | None = None,
                 job_params: Mapping[str, Any] | None = None, argv: list[str] | None = None):
        import os

        self.uri = store.resolve_uri(tracking_uri)
        self.experiment = (experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                           or store.DEFAULT_EXPERIMENT)
        self.rerun = rerun
        self.config = hydra_config
        self.out = out or _out_from_argv(argv) or DEFAULT_OUT
        self.parent_run_id = parent_run_id
        self.run_name = run_name
        self.job_params = {str(k): store.param_value(v) for k, v in (job_params or {}).items()}
        self.argv = argv
        self.sweep_run_id: str | None = None
        self.point_runs: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.failed: list[str] = []
        self._client = None
        self._experiment_id: str | None = None
        self._open: dict[int, _PointRun] = {}
        self._deferred: _PointRun | None = None
        self._done: list[tuple[dict, dict]] = []
        self._common: dict[str, str] | None = None
        self._reattached = False

    # --- connection -------------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            self._client = store.client(self.uri)
            self._experiment_id = store.experiment_id(self._client, self.experiment, self.uri)
        return self._client

    @property
    def experiment_id(self) -> str:
        self.client
        return self._experiment_id

    def _params(self, document: dict | None) -> dict[str, str]:
        """The flattened composed config (else the document) plus the job's own params."""
        if self.config is None:
            params = store.flatten(document or {})
        else:
            if self._common is None:
                self._common = store.flatten(self.config)
            params = dict(self._common)
        params.update(self.job_params)
        return params

    def _tags(self, kind: str, point: Any = None) -> dict[str, str]:
        tags = {store.KIND: kind, store.VERSION: store.code_version(), **owners.owner_tags()}
        model = getattr(point, "model", None)
        if model is not None:
            tags[store.MODEL_KEY] = model.key
            tags[store.MODEL_REVISION] = model.revision
        if self.argv is not None:
            tags["causalab.argv"] = " ".join(self.argv)
        if self.job_params:
            tags[store.OVERRIDES] = json.dumps(self.job_params, sort_keys=True)
        return tags

    # --- the run ----------------------------------------------------------------------------

    def run_start(self, document: dict, points: list[Any]) -> None:
        from causalab.document.digest import digest

        swept = len(points) > 1 or any(getattr(p, "coordinates", None) for p in points)
        sweep = digest(document) if swept else None
        # What a killed earlier run of this document left RUNNING ends KILLED first.
        owners.reap(self.client, self.experiment_id,
                    [p.digest for p in points if getattr(p, "digest", None)], sweep)
        if not swept:
            return
        reattach = None if self.rerun or self.parent_run_id else owners.resumable_sweep(
            self.client, self.experiment_id, sweep)
        if reattach:  # the remaining points join the parent of the sweep they belong to
            owners.reopen(self.client, reattach)
            self.sweep_run_id, self._reattached = reattach, True
            return
        tags = self._tags("sweep", points[0] if points else None)
        tags[store.SWEEP] = sweep
        self.sweep_run_id = store.create_run(self.client, self.experiment_id,
                                             self.run_name or "sweep", tags, self.parent_run_id)
        store.log_batch(self.client, self.sweep_run_id, params=self._params(document))
        self._log_config(self.sweep_run_id)

    def point_start(self, point: Any) -> bool:
        label = self._label(point)
        if not self.rerun:
            found = store.finished_run(self.client, self.experiment_id, point.digest)
            if found:
                self.skipped[label] = found
                return False
        name = label if self.sweep_run_id else (self.run_name or label or "point")
        tags = self._tags("point", point)
        coordinates = dict(getattr(point, "coordinates", None) or {})
        tags.update({store.PRODUCED_BY: point.digest, store.POINT: label,
                     store.COORDINATES: json.dumps(coordinates, sort_keys=True, default=str)})
        run_id = store.create_run(self.client, self.experiment_id, name, tags,
                                  self.sweep_run_id or self.parent_run_id)
        # Open before anything else is sent, so a failure from here on still ends it.
        self._open[id(point)] = _PointRun(run_id, _steps(point), _fits(point))
        self.point_runs[label] = run_id
        params = self._params(point.document)
        params.update({str(k): store.param_value(v) for k, v in coordinates.items()})
        store.log_batch(self.client, run_id, params=params)
        return True

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        run = self._open.get(id(point))
        if run is None:
            return
        first = run.keys.setdefault(name, step)
        key = name if first == step else f"{step}/{name}"
        ordinal = run.steps.index(step) if step in run.steps else 0
        if mean is not None and math.isfinite(mean):
            self._add(run, key, mean, ordinal)
            run.means[key] = mean
        self._add(run, f"{key}/eligible", eligible, ordinal)

    def fit_update(self, point: Any, step: str, update: int, loss: float) -> None:
        run = self._open.get(id(point))
        if run is None:
            return
        run.losses.setdefault(step, []).append(loss)
        if math.isfinite(loss):
            self._add(run, self._fit_key(run, step, "train/loss"), loss, update)

    def fit_epoch(self, point: Any, step: str, epoch: int, eval_mean: float,
                  kept: float | None) -> None:
        run = self._open.get(id(point))
        if run is None:
            return
        watched = run.fits.get(step, "metric")
        run.evals.setdefault(step, []).append(eval_mean)
        if eval_mean is not None and math.isfinite(eval_mean):
            self._add(run, self._fit_key(run, step, f"eval/{watched}"), eval_mean, epoch)
        if kept is not None:
            self._add(run, self._fit_key(run, step, "eval/kept"), kept, epoch)

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        run = self._open.get(id(point))
        if run is None:
            return
        try:
            self._upload(point, run, written, error)
        except BaseException as failure:
            self._end(run.run_id, error or failure)
            self._open.pop(id(point), None)
            self.failed.append(run.run_id)
            raise
        self._done.append((dict(getattr(point, "coordinates", None) or {}), dict(run.means)))
        if error is not None:
            self._end(run.run_id, error)
            self.failed.append(run.run_id)
            if self.sweep_run_id:
                self._end(self.sweep_run_id, error)
        elif not getattr(point, "directory", ""):
            self._deferred = run
        else:
            self._end(run.run_id, None)
        self._open.pop(id(point), None)

    def _upload(self, point: Any, run: _PointRun, written: list[str],
                error: BaseException | None) -> None:
        """Send a point's buffered numbers, its files, its config and its loss plots."""
        self._flush(run)
        directory = getattr(point, "directory", "") or ""
        files = [(str(Path(self.out) / path), _inside(path, directory)) for path in written]
        if directory and not any(a == DOCUMENT for _, a in files):
            files.insert(0, (str(Path(self.out) / directory / DOCUMENT), DOCUMENT))
        artifacts.log_files(self.client, run.run_id, [f for f in files if Path(f[0]).is_file()])
        if not directory and error is None:
            self._log_root_document(run.run_id)
        self._log_config(run.run_id)
        self._log_losses(run)

    def run_end(self, written: list[str]) -> None:
        record = [p for p in written if Path(p).name == RUN_RECORD]
        if self._deferred is not None:
            run, self._deferred = self._deferred, None
            artifacts.log_files(self.client, run.run_id,
                                [(p, RUN_RECORD) for p in record[:1] if Path(p).is_file()])
            self._end(run.run_id, None)
        if self.sweep_run_id:
            self._finish_sweep(written, record)

    def _finish_sweep(self, written: list[str], record: list[str]) -> None:
        if not self.point_runs and not self._reattached:
            self.client.delete_run(self.sweep_run_id)
            return
        roots = [p for p in written if Path(p).name == DOCUMENT]
        files = [(p, DOCUMENT) for p in sorted(roots, key=len)[:1]] + [(p, RUN_RECORD) for p in record[:1]]
        artifacts.log_files(self.client, self.sweep_run_id, [f for f in files if Path(f[0]).is_file()])
        for name, png in plots.sweep_plots(self._done).items():
            artifacts.log_bytes(self.client, self.sweep_run_id, png, name)
        self._end(self.sweep_run_id, RuntimeError("a point failed") if self.failed else None)

    def resolve(self, uri: str) -> str:
        """A ``runs:/<run_id>/<path>`` bundle downloaded from this listener's tracking URI."""
        return artifacts.resolve_artifact(uri, self.uri)

    def close(self, error: BaseException | None = None) -> None:
        """End whatever is still open: KILLED on an interrupt, FAILED on any other error."""
        error = error or RuntimeError("the run stopped before its end")
        for run in list(self._open.values()):
            self._end(run.run_id, error)
        self._open.clear()
        if self._deferred is not None:
            self._end(self._deferred.run_id, error)
            self._deferred = None
        if self.sweep_run_id and self._status(self.sweep_run_id) == "RUNNING":
            self._end(self.sweep_run_id, error)

    def __enter__(self) -> "TrackingEvents":
        """Reach the store now, in seconds, before the run compiles or loads a model."""
        flag = ("--tracking-uri",) if self.argv is not None else ("tracking", "uri")
        reach(self.uri, source_of(flag))
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None:
            self.close(error)

    # --- helpers ----------------------------------------------------------------------------

    def _label(self, point: Any) -> str:
        return getattr(point, "name", "") if self.sweep_run_id else ""

    def _fit_key(self, run: _PointRun, step: str, key: str) -> str:
        return key if len(run.fits) <= 1 else f"{step}/{key}"

    def _add(self, run: _PointRun, key: str, value: float, step: int) -> None:
        run.metrics.append(store.metric(key, value, step, int(time.time() * 1000)))
        if len(run.metrics) >= _FLUSH_AT:
            self._flush(run)

    def _flush(self, run: _PointRun) -> None:
        if run.metrics:
            store.log_batch(self.client, run.run_id, metrics=run.metrics)
            run.metrics = []

    def _log_config(self, run_id: str) -> None:
        if self.config is None:
            return
        from omegaconf import DictConfig, OmegaConf

        config = self.config if isinstance(self.config, DictConfig) else OmegaConf.create(self.config)
        self.client.log_text(run_id, OmegaConf.to_yaml(config, resolve=True), HYDRA_CONFIG)

    def _log_root_document(self, run_id: str) -> None:
        path = Path(self.out) / DOCUMENT
        if path.is_file():
            artifacts.log_files(self.client, run_id, [(str(path), DOCUMENT)])

    def _log_losses(self, run: _PointRun) -> None:
        for step, losses in run.losses.items():
            watched = run.fits.get(step, "eval")
            png = plots.loss_curve(losses, run.evals.get(step, []), title=step,
                                   eval_name=f"eval/{watched}")
            artifacts.log_bytes(self.client, run.run_id, png, f"plots/{step}_loss.png")

    def _status(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.status

    def _end(self, run_id: str, error: BaseException | None) -> None:
        if error is None:
            store.terminate(self.client, run_id, "FINISHED")
            return
        message = f"{type(error).__name__}: {error}".strip()
        store.log_batch(self.client, run_id, tags={store.ERROR: message})
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        store.terminate(self.client, run_id, status)


def _steps(point: Any) -> list[str]:
    document = getattr(point, "document", None) or {}
    return list(document.get("steps", {}))


def _fits(point: Any) -> dict[str, str]:
    """Fit step name -> the metric its early stop watches."""
    document = getattr(point, "document", None) or {}
    return {name: step.get("early_stop", {}).get("metric", "metric")
            for name, step in document.get("steps", {}).items()
            if isinstance(step, dict) and step.get("kind") == "fit"}


def _inside(path: str, directory: str) -> str:
    """The artifact path of a file written under the point's directory (relative to --out)."""
    parts = Path(path).parts
    prefix = Path(directory).parts if directory else ()
    if prefix and parts[:len(prefix)] == prefix:
        parts = parts[len(prefix):]
    return str(Path(*parts)) if parts else Path(path).name


def _out_from_argv(argv: list[str] | None) -> str | None:
    if not argv:
        return None
    for index, word in enumerate(argv):
        if word == "--out" and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith("--out="):
            return word.split("=", 1)[1]
    return None
