"""``TrackingEvents``: the engine's progress events, logged to MLflow one run per point.

A swept document gets a parent run and one child per point (``mlflow.parentRunId``); inside
a Hydra multirun the job's runs nest under the multirun's parent instead of standing alone.
A point whose digest already has a FINISHED run in the experiment is skipped (resume) unless
``rerun``; under a parent it is linked there (:mod:`causalab.tracking.links`), so the parent
shows every point it asked for. Every MLflow call runs in the tracking worker, a process of
its own (:mod:`causalab.tracking.worker`): this process never imports MLflow or matplotlib.
Everything but that lookup is sent to one background lane (:mod:`causalab.tracking.background`)
and awaited at the run's end: numbers buffered per point and sent with ``log_batch``, files
uploaded once per point, plots drawn in the worker. A point
that raises ends FAILED with the error as the ``causalab.error`` tag; an interrupt ends it
KILLED, after what it wrote is uploaded; a run is FINISHED only after its files are logged.
Never touches MLflow's fluent active-run stack.

The run's own process waits for none of it: ``run_end`` returns once the run's files are
written, and the MLflow side completes in the background. ``wait`` (or leaving a ``with``
block) blocks until it is stored and raises what failed; the CLI, a Hydra job and
:func:`causalab.results.run` wait before they report, and an exit handler drains whatever a
process leaves unsent. Only the resume lookup (which points are done) is waited for, in one
request at the run's start, and only without ``rerun``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from causalab.engine.events import Events
from causalab.errors import UsageError
from causalab.files import DOCUMENT, HYDRA_CONFIG, RUN_RECORD
from causalab.tracking import artifacts, links, naming, owners, plots
from causalab.tracking import runs as store
from causalab.tracking.background import Lane
from causalab.tracking.reach import reach, source_of
from causalab.tracking.worker import worker



@dataclass
class _PointRun:
    """One point's run: its id once the lane created it, and what the point has buffered."""

    label: str
    steps: list[str]
    fits: dict[str, str]
    title: str = ""
    run_id: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    metrics: list = field(default_factory=list)
    means: dict[str, float] = field(default_factory=dict)
    losses: dict[str, list[float]] = field(default_factory=dict)
    evals: dict[str, list[float]] = field(default_factory=dict)
    finished: bool = False

    def score(self, step: str, name: str, mean: float | None, eligible: int) -> None:
        """A step's metric mean (NaN when there is none) and its eligible row count, at the
        step's place in the document's order."""
        key = naming.metric_key(step, name)
        ordinal = self.steps.index(step) if step in self.steps else 0
        value = mean if mean is not None and math.isfinite(mean) else math.nan
        self.add(key, value, ordinal)
        if not math.isnan(value):
            self.means[key] = value
        self.add(naming.eligible_key(step, name), eligible, ordinal)

    def loss(self, step: str, update: int, loss: float) -> None:
        """A fit's loss at one update: kept for its loss plot, logged when finite."""
        self.losses.setdefault(step, []).append(loss)
        if math.isfinite(loss):
            self.add(self.fit_key(step, "train/loss"), loss, update)

    def epoch(self, step: str, epoch: int, eval_mean: float, kept: float | None) -> None:
        """A fit's epoch: its watched eval metric, and a gate's kept fraction when it has one."""
        self.evals.setdefault(step, []).append(eval_mean)
        if eval_mean is not None and math.isfinite(eval_mean):
            self.add(self.fit_key(step, f"eval/{self.fits.get(step, 'metric')}"), eval_mean,
                     epoch)
        if kept is not None:
            self.add(self.fit_key(step, "eval/kept"), kept, epoch)

    def fit_key(self, step: str, key: str) -> str:
        """A fit's metric key, prefixed by its step when the point has more than one fit."""
        return key if len(self.fits) <= 1 else f"{step}/{key}"

    def add(self, key: str, value: float, step: int) -> None:
        self.metrics.append(store.metric(key, value, step, int(time.time() * 1000)))

    def flush(self, call: Any) -> None:
        """The point's params and every number it buffered, in one request when they fit."""
        if (self.metrics or self.params) and self.run_id is not None:
            call(store.log_batch, self.run_id, metrics=naming.log_order(self.metrics),
                 params=self.params)
            self.metrics, self.params = [], {}


class TrackingEvents(Events):
    """Log a run of a document to MLflow (docs/platform.md §5).

    ``tracking_uri``: MLFLOW_TRACKING_URI wins, then this, then ./mlflow.db. ``experiment``:
    the MLflow experiment name (MLFLOW_EXPERIMENT_NAME, else ``causalab``). ``hydra_config``:
    the job's composed config, logged as ``hydra_config.yaml``. ``parent_run_id``: nest under
    this run (a multirun's parent); ``run_name``: the name of the job's top run (its
    overrides); ``job_params``: extra params (a job's swept overrides). ``out``: the run's
    output folder, the one given to ``run_document`` (or ``--out`` found in ``argv``):
    without it the listener cannot find the files it should upload, so it refuses to start.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None,
                 rerun: bool = False, hydra_config: Any = None, *, out: str | None = None,
                 parent_run_id: str | None = None, run_name: str | None = None,
                 job_params: Mapping[str, Any] | None = None, argv: list[str] | None = None):
        import os

        self.out = out or _out_from_argv(argv) or ("out" if argv is not None else None)
        if self.out is None:
            raise UsageError(("out",), "TrackingEvents needs out=<the folder run_document "
                                       "writes to>, to upload what the run writes there")
        self.uri = store.resolve_uri(tracking_uri)
        self.experiment = (experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                           or store.DEFAULT_EXPERIMENT)
        self.rerun = rerun
        self.config = hydra_config
        self.parent_run_id = parent_run_id
        self.run_name = run_name
        self.job_params = {str(k): store.param_value(v) for k, v in (job_params or {}).items()}
        self.argv = argv
        self.sweep_run_id: str | None = None
        self.point_runs: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.linked: dict[str, str] = {}
        self.failed: list[str] = []
        self._experiment_id: str | None = None
        self._lane: Lane | None = None
        self._swept = False
        self._held = False
        self._done_runs: dict[str, str] = {}
        self._open: dict[int, _PointRun] = {}
        self._ended: list[_PointRun] = []
        self._deferred: _PointRun | None = None
        self._done: list[tuple[dict, dict]] = []
        self._reattached = False
        self._reused: list[tuple[Any, str, str]] = []
        self._config_text: str | None = None
        self._title = ""

    # --- connection -------------------------------------------------------------------------

    def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """``function(client, *args, **kwargs)`` with this run's store, in the MLflow worker
        process (:mod:`causalab.tracking.worker`)."""
        return worker().call(self.uri, function, *args, **kwargs)

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self.call(store.experiment_id, self.experiment, self.uri)
        return self._experiment_id

    @property
    def lane(self) -> Lane:
        if self._lane is None:
            self._lane = Lane()
        return self._lane

    def wait(self) -> None:
        """Block until everything sent to MLflow so far is stored (raises the first failure,
        the lane then kept for what follows), then let the lane's thread go: a later call
        starts a new one. ``run_document`` does not wait: call this (or leave a ``with``
        block) before reading the run back from the store."""
        if self._lane is not None:
            self._lane.close()
            self._lane = None

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
        if self.run_name:
            tags[store.JOB] = self.run_name
        return tags

    # --- the run ----------------------------------------------------------------------------

    def run_start(self, document: dict, points: list[Any]) -> None:
        from causalab.document.digest import digest

        first = points[0] if points else None
        varied = plots.varied([getattr(p, "coordinates", None) or {} for p in points])
        self._title = plots.title_of(getattr(first, "document", None) or document, varied)
        digests = [p.digest for p in points if getattr(p, "digest", None)]
        if not self._held:  # the run computes now: its bookkeeping waits (Lane.hold)
            self.lane.hold()
            self._held = True
        if not self.rerun:  # which points are done decides what runs: the one wait
            self._done_runs = self.call(store.finished_runs, self.experiment_id, digests)
        self._swept = len(points) > 1 or any(getattr(p, "coordinates", None) for p in points)
        sweep = digest(document) if self._swept else None
        # What a killed earlier run of this document left RUNNING ends KILLED first.
        self.lane.send(lambda: self.call(owners.reap, self.experiment_id, digests, sweep))
        if self._swept:
            self.lane.send(self._open_sweep, sweep, first, _shared_params(points, self.job_params))

    def _open_sweep(self, sweep: str, first: Any, params: dict[str, str]) -> None:
        """The sweep's parent: a new run, or the killed or failed one a rerun reattaches to."""
        reattach = None if self.rerun or self.parent_run_id else self.call(
            owners.resumable_sweep, self.experiment_id, sweep)
        if reattach:  # the remaining points join the parent of the sweep they belong to
            self.call(owners.reopen, reattach, owners.owner_tags())
            self.sweep_run_id, self._reattached = reattach, True
            return
        tags = self._tags("sweep", first)
        tags[store.SWEEP] = sweep
        self.sweep_run_id = self.call(store.create_run, self.experiment_id,
                                      self.run_name or "sweep", tags, self.parent_run_id)
        self.call(store.log_batch, self.sweep_run_id, params=params)
        self._log_config(self.sweep_run_id)

    def point_start(self, point: Any) -> bool:
        label = self._label(point)
        found = self._done_runs.get(getattr(point, "digest", None))
        if found:
            self.skipped[label] = found
            self.lane.send(self._reuse, point, label, found)
            return False
        name = label if self._swept else (self.run_name or label or "point")
        tags = self._tags("point", point)
        coordinates = dict(getattr(point, "coordinates", None) or {})
        tags.update({store.PRODUCED_BY: point.digest, store.POINT: label,
                     store.COORDINATES: json.dumps(coordinates, sort_keys=True, default=str)})
        run = _PointRun(label, _steps(point), _fits(point),
                        plots.title_of(getattr(point, "document", None)) or self._title)
        run.params = naming.point_params(getattr(point, "document", None), coordinates,
                                         self.job_params)
        self._open[id(point)] = run
        self.lane.send(self._create, run, name, tags)
        return True

    def _create(self, run: _PointRun, name: str, tags: dict) -> None:
        run.run_id = self.call(store.create_run, self.experiment_id, name, tags,
                               self.sweep_run_id or self.parent_run_id)
        self.point_runs[run.label] = run.run_id
        # Params go with the run's creation, so a run whose process dies still says what it
        # was; a point already finished by now sends them with its numbers, in one request.
        if run.params and not run.finished:
            self.call(store.log_batch, run.run_id, params=run.params)
            run.params = {}

    def _reuse(self, point: Any, label: str, found: str) -> None:
        """Link a done point into this parent now (a multirun job), or at the sweep's end; a
        point already under this parent (a sweep reattached after a kill) needs no link."""
        parent = self.sweep_run_id or self.parent_run_id
        if parent is None or self.call(store.parent_of, found) == parent:
            return
        if self.parent_run_id is not None:
            self._link(point, label, found)
        elif self.sweep_run_id is not None:
            self._reused.append((point, label, found))

    def _link(self, point: Any, label: str, found: str) -> None:
        parent = self.sweep_run_id or self.parent_run_id
        name = label if self._swept else (self.run_name or label or "point")
        self.linked[label] = self.call(links.link, self.experiment_id, found, parent, name,
                                       self._tags("point", point))

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        run = self._open.get(id(point))
        if run is not None:
            run.score(step, name, mean, eligible)

    def fit_update(self, point: Any, step: str, update: int, loss: float) -> None:
        run = self._open.get(id(point))
        if run is not None:
            run.loss(step, update, loss)

    def fit_epoch(self, point: Any, step: str, epoch: int, eval_mean: float,
                  kept: float | None) -> None:
        run = self._open.get(id(point))
        if run is not None:
            run.epoch(step, epoch, eval_mean, kept)

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        run = self._open.pop(id(point), None)
        if run is None:
            return
        files = self._files(point, written, error)
        run.finished = True
        self.lane.send(self._upload, run, files)
        self._done.append((dict(getattr(point, "coordinates", None) or {}), dict(run.means)))
        if error is not None:
            self.lane.send(self._end_point, run, error)
            if self._swept:
                self.lane.send(self._end_sweep, error)
        elif not getattr(point, "directory", ""):
            self._deferred = run
        else:
            self._ended.append(run)
            self.lane.send(self._end_point, run, None)

    def _files(self, point: Any, written: list[str], error: BaseException | None) -> list:
        """``(local, artifact)`` pairs of a point: its saves, its document, the root document."""
        directory = getattr(point, "directory", "") or ""
        files = [(str(Path(self.out) / path), _inside(path, directory)) for path in written]
        if directory and not any(a == DOCUMENT for _, a in files):
            files.insert(0, (str(Path(self.out) / directory / DOCUMENT), DOCUMENT))
        if not directory and error is None:
            files.insert(0, (str(Path(self.out) / DOCUMENT), DOCUMENT))
        return files

    def _upload(self, run: _PointRun, files: list) -> None:
        """Send a point's buffered numbers, its files, its config and its loss plots."""
        run.flush(self.call)
        self.call(artifacts.log_files, run.run_id, [f for f in files if Path(f[0]).is_file()])
        self._log_config(run.run_id)
        for step, losses in run.losses.items():
            watched = f"eval/{run.fits.get(step, 'eval')}"
            self.call(artifacts.log_loss_curve, run.run_id, f"plots/{step}_loss.png", losses,
                      run.evals.get(step, []), title=f"{run.title} · {step}", eval_name=watched)

    def run_end(self, written: list[str]) -> None:
        record = [(p, RUN_RECORD) for p in written if Path(p).name == RUN_RECORD][:1]
        record = [f for f in record if Path(f[0]).is_file()]
        for run in self._ended:
            self.lane.send(lambda run=run: self.call(artifacts.log_files, run.run_id, record))
        self._ended = []
        if self._deferred is not None:
            run, self._deferred = self._deferred, None
            self.lane.send(lambda: self.call(artifacts.log_files, run.run_id, record))
            self.lane.send(self._end_point, run, None)
        if self._swept:
            self.lane.send(self._finish_sweep, written, record)
        self._release()

    def _finish_sweep(self, written: list[str], record: list) -> None:
        if self.sweep_run_id is None:
            return
        if not self.point_runs and self.parent_run_id is None and not self._reattached:
            self.call(store.delete, self.sweep_run_id)
            return
        for point, label, found in self._reused:
            self._link(point, label, found)
        roots = [p for p in written if Path(p).name == DOCUMENT]
        files = [(p, DOCUMENT) for p in sorted(roots, key=len)[:1]] + record
        self.call(artifacts.log_files, self.sweep_run_id,
                  [f for f in files if Path(f[0]).is_file()])
        done = self._done + self.call(links.means_of, list(self.linked.values()))
        self.call(artifacts.log_sweep_plots, self.sweep_run_id, done, title=self._title)
        self._end(self.sweep_run_id, RuntimeError("a point failed") if self.failed else None)

    def resolve(self, uri: str) -> str:
        """A ``runs:/<run_id>/<path>`` bundle downloaded from this listener's tracking URI."""
        return worker().call(None, artifacts.resolve_artifact, uri, self.uri)

    def close(self, error: BaseException | None = None) -> None:
        """End whatever is still open: KILLED on an interrupt, FAILED on any other error.

        What was already sent (files of points that ended) is uploaded first.
        """
        error = error or RuntimeError("the run stopped before its end")
        self._release()
        for run in list(self._open.values()):
            self.lane.send(self._upload, run, [])
            self.lane.send(self._end_point, run, error)
        self._open.clear()
        if self._deferred is not None:
            self.lane.send(self._end_point, self._deferred, error)
            self._deferred = None
        if self._swept:
            self.lane.send(self._end_sweep, error, True)
        try:
            self.wait()
        except Exception:  # the run's own error is the one to report
            pass

    def __enter__(self) -> "TrackingEvents":
        """Reach the store now, in seconds, before the run compiles or loads a model."""
        flag = ("--tracking-uri",) if self.argv is not None else ("tracking", "uri")
        reach(self.uri, source_of(flag), writes=True)
        worker().open(self.uri)  # MLflow loads and opens the store while the run compiles
        self.lane.send(worker().call, None, plots.warm)  # and matplotlib, for its plots
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None:
            self.close(error)
            return
        try:
            self.wait()
        except BaseException as stop:  # an interrupt or a failed upload while waiting
            self.close(stop)
            raise

    # --- helpers ----------------------------------------------------------------------------

    def _label(self, point: Any) -> str:
        return getattr(point, "name", "") if self._swept else ""

    def _log_config(self, run_id: str) -> None:
        if self.config is None:
            return
        if self._config_text is None:
            from omegaconf import DictConfig, OmegaConf

            config = self.config
            if not isinstance(config, DictConfig):
                config = OmegaConf.create(config)
            self._config_text = OmegaConf.to_yaml(config, resolve=True)
        self.call(artifacts.log_bytes, run_id, self._config_text.encode(), HYDRA_CONFIG)

    def _end_point(self, run: _PointRun, error: BaseException | None) -> None:
        if run.run_id is None:
            return
        if error is not None:
            self.failed.append(run.run_id)
        self._end(run.run_id, error)

    def _release(self) -> None:
        """Let the held calls go; a lane already waited out (``wait``) is not started again."""
        if self._held and self._lane is not None:
            self._lane.release()
        self._held = False

    def _end_sweep(self, error: BaseException, unless_ended: bool = False) -> None:
        """End the sweep's parent (if the lane got to open it) with ``error``."""
        run_id = self.sweep_run_id
        if run_id is None or unless_ended and self.call(store.status, run_id) != "RUNNING":
            return
        self._end(run_id, error)

    def _end(self, run_id: str, error: BaseException | None) -> None:
        if error is None:
            self.call(store.terminate, run_id, "FINISHED")
            return
        message = f"{type(error).__name__}: {error}".strip()
        self.call(store.log_batch, run_id, tags={store.ERROR: message})
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        self.call(store.terminate, run_id, status)


def _shared_params(points: list[Any], job: Mapping[str, str]) -> dict[str, str]:
    """A sweep parent's params: the job's own and the facts every point shares."""
    each = [naming.point_params(getattr(p, "document", None), {}, job) for p in points]
    if not each:
        return dict(job)
    return {k: v for k, v in each[0].items() if all(other.get(k) == v for other in each[1:])}


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
