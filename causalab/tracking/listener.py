"""``TrackingEvents``: the engine's progress events, logged to MLflow one run per point.

A swept document gets a parent run and one child per point (``mlflow.parentRunId``); inside
a Hydra multirun the job's runs nest under the multirun's parent instead of standing alone.
A point whose digest already has a FINISHED run in the experiment is skipped (resume) unless
``rerun``; under a parent it is linked there (:mod:`causalab.tracking.links`), so the parent
shows every point it asked for. Every MLflow call runs in the tracking worker, a process of
its own (:mod:`causalab.tracking.worker`): this process never imports MLflow or matplotlib.
This module is the run's side (events in, numbers buffered per point in
:class:`~causalab.tracking.points.PointRun`); everything but the resume lookup is sent to one
background lane (:mod:`causalab.tracking.background`), whose calls are
:mod:`causalab.tracking.writes`: numbers sent with ``log_batch``, files uploaded once per
point, plots drawn in the worker. A point that raises ends FAILED with the error as the
``causalab.error`` tag; an interrupt ends it KILLED, after what it wrote is uploaded; a run is
FINISHED only after its files are logged. Never touches MLflow's fluent active-run stack.

The run's own process waits for none of it: ``run_end`` returns once the run's files are
written, and the MLflow side completes in the background. ``wait`` (or leaving a ``with``
block) blocks until it is stored and raises what failed; the CLI, a Hydra job and
:func:`causalab.results.run` wait before they report, and an exit handler drains whatever a
process leaves unsent. Only the resume lookup (which points are done) is waited for, in one
request at the run's start, and only without ``rerun``. A store that stops answering (MLflow's
deadlines ran out, ``reach.DEADLINES``) is one refusal: every later call fails at once and the
run stops at its next point, its files kept in ``out``. After an interrupt the run waits for
its KILLED ends only while the store keeps answering (``STALL_S``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping

from causalab.engine.events import Events
from causalab.errors import CausalabError, Path as JsonPath, TrackingError, UsageError, reason
from causalab.files import RUN_RECORD
from causalab.tracking import artifacts, naming, owners, point_claims
from causalab.plots import attribution_maps as attribution_plots, canvas as figures, curves as plots
from causalab.tracking import stored
from causalab.tracking import points as facts
from causalab.tracking import runs as store
from causalab.tracking.background import Lane, Stalled
from causalab.tracking.points import PointRun
from causalab.tracking.reach import StoreRefused, Unanswered, reach, source_of
from causalab.tracking.worker import WorkerGone, worker
from causalab.tracking.writes import StoreWrites

# After an interrupt the run waits for what it sent only while the store keeps answering:
# once no call has ended for this long, it leaves (a later run ends what it left open).
STALL_S = 5.0


class TrackingEvents(StoreWrites, Events):
    """Log a run of a document to MLflow (docs/platform.md §5).

    ``tracking_uri``: MLFLOW_TRACKING_URI wins, then this, then ./mlflow.db. ``experiment``:
    the MLflow experiment name (MLFLOW_EXPERIMENT_NAME, else ``causalab``). ``hydra_config``:
    the job's composed config, logged as ``hydra_config.yaml``. ``parent_run_id``: nest under
    this run (a multirun's parent); ``run_name``: the name of the job's top run (its
    overrides); ``job_params``: extra params (a job's swept overrides). ``out``: the run's
    output folder, the one given to ``run_document`` (or ``--out`` found in ``argv``):
    without it the listener cannot find the files it should upload, so it refuses to start.
    ``uri_option``: the option that gave the tracking URI, named by a refusal about the store
    (``--tracking-uri`` with ``argv``, else ``tracking.uri``).
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None,
                 rerun: bool = False, hydra_config: Any = None, *, out: str | None = None,
                 parent_run_id: str | None = None, run_name: str | None = None,
                 job_params: Mapping[str, Any] | None = None, argv: list[str] | None = None,
                 uri_option: JsonPath | None = None):
        import os

        self.out = out or facts.out_from_argv(argv) or ("out" if argv is not None else None)
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
        self.uri_option = uri_option or (("--tracking-uri",) if argv is not None
                                         else ("tracking", "uri"))
        self._unanswered: TrackingError | None = None
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
        self._not_done: dict[str, str] = {}
        self._claimed: dict[str, str] = {}  # digest -> the run this run holds the point in
        self._taken: dict[str, str] = {}  # digest -> the live run elsewhere that holds it
        self.taken: dict[str, str] = {}  # label -> that run, said as the point is skipped
        self._open: dict[int, PointRun] = {}
        self._ended: list[PointRun] = []
        self._deferred: PointRun | None = None
        self._done: list[tuple[dict, dict]] = []
        self._reattached = False
        self._reused: list[tuple[Any, str, str]] = []
        self._config_text: str | None = None
        self._title = ""

    # --- connection -------------------------------------------------------------------------

    def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """``function(client, *args, **kwargs)`` with this run's store, in the MLflow worker
        process (:mod:`causalab.tracking.worker`). Once the store stopped answering a call
        (MLflow's deadlines ran out), every later call is refused at once with that line."""
        self._check()
        try:
            return worker().call(self.uri, function, *args, **kwargs)
        except StoreRefused as error:  # named where the store came from
            raise TrackingError(source_of(self.uri_option), error.message) from None
        except Unanswered as error:
            self._unanswered = TrackingError(source_of(self.uri_option), (
                f"{error.message}; the run's files are in {self.out}, and a rerun stores "
                "the points this one could not"))
        except WorkerGone as error:  # killed or out of memory: the user's to see, in one line
            self._unanswered = TrackingError(source_of(self.uri_option), (
                f"tracking to {self.uri} stopped: {error} (killed, or out of memory?); the "
                f"run's files are in {self.out}, and a rerun stores the points this one "
                "could not"))
        self._check()

    def _check(self) -> None:
        """Raise the store's silence, once it is known (a run stops at its next point)."""
        if self._unanswered is not None:
            raise TrackingError(self._unanswered.path, self._unanswered.message) from None

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

    def wait(self, stall_s: float | None = None) -> None:
        """Block until everything sent to MLflow so far is stored (raises the first failure,
        the lane then kept for what follows), then let the lane's thread go: a later call
        starts a new one. ``run_document`` does not wait: call this (or leave a ``with``
        block) before reading the run back from the store. ``stall_s``: raise ``Stalled``
        once no call has ended for that long."""
        if self._lane is not None:
            try:
                self._lane.close(stall_s)
            except StoreRefused as error:
                raise TrackingError(source_of(self.uri_option), (
                    f"{error.message}; the run's files are in {self.out}, and a rerun "
                    "stores what this one could not")) from None
            except (CausalabError, Stalled):
                raise
            except Exception as error:  # any other failure of the store, still one line
                raise TrackingError(source_of(self.uri_option), (
                    f"the tracking store at {self.uri} failed: {reason(error)}; the run's "
                    f"files are in {self.out}, and a rerun stores what this one could not")
                ) from None
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
        wanted = {p.digest: dict(getattr(p, "input_digests", None) or {})
                  for p in points if getattr(p, "digest", None)}
        if not self._held:  # the run computes now: its bookkeeping waits (Lane.hold)
            self.lane.hold()
            self._held = True
        self._swept = len(points) > 1 or any(getattr(p, "coordinates", None) for p in points)
        # Which points are done, and a claim on each of the others, decide what runs: the
        # one wait (tracking/point_claims.py). A rerun asked to compute every point again,
        # so it neither looks up nor claims, and does not wait for the store.
        if not self.rerun:
            asked = {p.digest: self._claim_of(p) for p in points if getattr(p, "digest", None)}
            found = self.call(point_claims.claim, self.experiment_id, wanted, asked)
            self._done_runs, self._not_done = found.done, found.why
            self._claimed, self._taken = found.mine, found.taken
        sweep = digest(document) if self._swept else None
        # What a killed earlier run of this document left RUNNING ends KILLED first.
        self.lane.send(lambda: self.call(owners.reap, self.experiment_id, digests, sweep))
        if self._swept:
            self.lane.send(self._open_sweep, sweep, first,
                           facts.shared_params(points, self.job_params))

    def point_start(self, point: Any) -> bool:
        self._check()
        label = self._label(point)
        found = self._done_runs.get(getattr(point, "digest", None))
        if found:
            self.skipped[label] = found
            self.lane.send(self._reuse, point, label, found)
            return False
        holder = self._taken.get(getattr(point, "digest", None))
        if holder:  # a live run elsewhere computes it now (tracking/point_claims.py)
            self.taken[label] = holder
            print(f"skipped {label or '<root>'}: being computed by {holder}", file=sys.stderr)
            return False
        why = self._not_done.get(getattr(point, "digest", None))
        if why:  # an earlier run of this document is not this point's result: say why
            print(f"rerunning {label or '<root>'}: {why}", file=sys.stderr)
        claim = self._claim_of(point)
        coordinates = dict(getattr(point, "coordinates", None) or {})
        run = PointRun(label, facts.steps(point), facts.fits(point),
                       plots.title_of(getattr(point, "document", None)) or self._title)
        run.run_id = self._claimed.pop(getattr(point, "digest", None), None)
        run.params = naming.point_params(getattr(point, "document", None), coordinates,
                                         self.job_params)
        self._open[id(point)] = run
        self.lane.send(self._create, run, claim.name, claim.tags)
        return True

    def _claim_of(self, point: Any) -> point_claims.Claim:
        """A point's run as it is created: its name and tags (owner, digest, place, inputs)."""
        label = self._label(point)
        tags = self._tags("point", point)
        coordinates = dict(getattr(point, "coordinates", None) or {})
        tags.update({store.PRODUCED_BY: point.digest, store.POINT: label,
                     store.COORDINATES: json.dumps(coordinates, sort_keys=True, default=str),
                     stored.INPUTS: json.dumps(dict(getattr(point, "input_digests", None) or {}),
                                               sort_keys=True, separators=(",", ":"))})
        if self.parent_run_id:  # a multirun job's claims sit under its parent from the start
            tags[store.PARENT] = self.parent_run_id
        name = label if self._swept else (self.run_name or label or "point")
        return point_claims.Claim(name, tags)

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        run = self._open.get(id(point))
        if run is not None:
            run.score(step, name, mean, eligible)

    def interval(self, point: Any, step: str, name: str, low: float, high: float) -> None:
        run = self._open.get(id(point))
        if run is not None:
            run.interval(step, name, low, high)

    def receipt(self, found: dict | None) -> None:
        if found is not None:
            self.lane.send(self._log_receipt, found)

    def fit_update(self, point: Any, step: str, update: int, loss: float) -> None:
        run = self._open.get(id(point))
        if run is not None:
            run.loss(step, update, loss)

    def fit_epoch(self, point: Any, step: str, epoch: int, eval_mean: float,
                  kept: float | None) -> None:
        self._check()
        run = self._open.get(id(point))
        if run is not None:
            run.epoch(step, epoch, eval_mean, kept)

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        run = self._open.pop(id(point), None)
        if run is None:
            return
        files = facts.files_of(self.out, point, written, error)
        run.finished = True
        run.whole = error is None and bool(getattr(point, "directory", ""))
        self.lane.send(self._upload, run, files)
        attribution_plots.send_grids(self, run, point)
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

    def run_end(self, written: list[str]) -> None:
        record = [(p, RUN_RECORD) for p in written if Path(p).name == RUN_RECORD][:1]
        record = [f for f in record if Path(f[0]).is_file()]
        for run in self._ended:
            self.lane.send(lambda run=run: self.call(artifacts.log_files, run.run_id, record))
        self._ended = []
        if self._deferred is not None:
            run, self._deferred = self._deferred, None
            self.lane.send(lambda: run.sending(self.call, artifacts.log_files, run.run_id,
                                               record))
            self.lane.send(self._end_point, run, None)
        self._drop_claims()
        if self._swept:
            self.lane.send(self._finish_sweep, written, record)
        self._release()

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
        self._drop_claims()
        if self._swept:
            self.lane.send(self._end_sweep, error, True)
        try:
            self._close_lane(STALL_S if isinstance(error, KeyboardInterrupt) else None)
        except Exception:  # the run's own error is the one to report
            pass

    def _close_lane(self, stall_s: float | None) -> None:
        """``wait``, for as long as the store keeps answering when ``stall_s`` is given: a
        lane stalled that long is abandoned and the worker dropped with the call it is in."""
        if self._lane is None:
            return
        try:
            self.wait(stall_s)
        except Stalled:
            self._lane.abandon()
            self._lane = None
            worker().drop()

    def __enter__(self) -> "TrackingEvents":
        """Reach the store now, in seconds, before the run compiles or loads a model."""
        reach(self.uri, source_of(self.uri_option), writes=True)
        worker().open(self.uri)  # MLflow loads and opens the store while the run compiles
        self.lane.send(worker().call, None, figures.warm)  # and matplotlib, for its plots
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

    def _drop_claims(self) -> None:
        """Withdraw the claims on points this run never started: nothing of them was made."""
        for run_id in self._claimed.values():
            self.lane.send(lambda run_id=run_id: self.call(store.withdraw, run_id))
        self._claimed = {}

    def _label(self, point: Any) -> str:
        return getattr(point, "name", "") if self._swept else ""

    def _release(self) -> None:
        """Let the held calls go; a lane already waited out (``wait``) is not started again."""
        if self._held and self._lane is not None:
            self._lane.release()
        self._held = False

