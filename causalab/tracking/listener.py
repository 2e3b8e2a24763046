"""``TrackingEvents``: the engine's progress events, logged to MLflow one run per point.

A swept document gets a parent run and one child per point (``mlflow.parentRunId``); inside
a Hydra multirun the job's runs nest under the multirun's parent instead of standing alone.
A point whose digest already has a FINISHED run in the experiment is skipped (resume) unless
``rerun``; under a parent it is linked there (:mod:`causalab.tracking.links`), so the parent
shows every point it asked for. Every MLflow call runs in the run's own process, through one
``MlflowClient`` (:meth:`TrackingEvents.call`): the run's side (events in, numbers buffered
per point in :class:`~causalab.tracking.points.PointRun`) is here, the calls themselves in
:mod:`causalab.tracking.writes`. When a point ends its files go, then its numbers in
one ``log_batch``; all are read back before it is marked FINISHED
(:mod:`causalab.tracking.stored`). A point that raises ends FAILED with the
error as the ``causalab.error`` tag; an interrupt ends it KILLED, after what it wrote is
uploaded. Never touches MLflow's fluent active-run stack.

A call that fails does not stop the ones after it (a run's end still reaches the store):
``wait`` (or leaving a ``with`` block) raises the first failure. The store is opened at the
run's first call, after its ``--out`` is claimed (a refused run touches no store). A store
that stops answering (MLflow's deadlines ran out, ``reach.DEADLINES``) is one refusal: every
later call fails at once and the run stops at its next point, its files kept in ``out``.
After an interrupt the run waits for its KILLED ends only while the store answers
(``STALL_S``); a run killed outright leaves its runs RUNNING to the next run of its document,
which ends them (:mod:`causalab.tracking.owners`).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from causalab.engine.events import Events
from causalab.errors import CausalabError, Path as JsonPath, TrackingError, UsageError, reason
from causalab.files import RUN_RECORD
from causalab.plots import curves as plots
from causalab.scores import naming
from causalab.tracking import artifacts, claims, owners, pictures, stored
from causalab.tracking import points as facts
from causalab.tracking import runs as store
from causalab.tracking.points import PointRun
from causalab.tracking.reach import StoreRefused, reach, said_once, source_of, translated
from causalab.tracking.writes import StoreWrites

# After an interrupt the run waits for its KILLED ends only while a call ends at least this
# often: a store that stopped answering would hold it for MLflow's deadlines (a later run
# ends what it left open).
STALL_S = 1.5


class Calls:
    """A run's MLflow calls, run as they are sent; the first failure is kept for ``wait``
    (the calls after it still run: a run's end still reaches the store)."""

    def __init__(self) -> None:
        self.failed: list[Exception] = []

    def send(self, call: Any, *args: Any, **kwargs: Any) -> None:
        """Run ``call(*args, **kwargs)`` now."""
        try:
            call(*args, **kwargs)
        except Exception as error:
            self.failed.append(error)

    def raise_first(self) -> None:
        failed, self.failed = self.failed, []
        if failed:
            raise failed[0]


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
        self._sweep_params: dict[str, str] = {}
        self.point_runs: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.linked: dict[str, str] = {}
        self.failed: list[str] = []
        self._experiment_id: str | None = None
        self.lane = Calls()
        self._client: Any = None
        self._swept = False
        self._done_runs: dict[str, str] = {}
        self._not_done: dict[str, str] = {}
        self._claimed: dict[str, str] = {}  # digest -> the run this run holds the point in
        self._taken: dict[str, str] = {}  # digest -> the live run elsewhere that holds it
        self.taken: dict[str, str] = {}  # label -> that run, said as the point is skipped
        self._open: dict[int, PointRun] = {}
        self._stopped: list[tuple[PointRun, list]] = []  # points an interrupt stopped
        self._answered = time.monotonic()  # when the store last answered a call
        self._stored: dict[str, Path] = {}  # run id -> its point's folder, read back whole
        self._deferred: PointRun | None = None
        self._done: list[tuple[dict, dict]] = []
        self._reattached = False
        self._reused: list[tuple[Any, str, str]] = []
        self._config_text: str | None = None
        self._title = ""

    # --- connection -------------------------------------------------------------------------

    def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """``function(client, *args, **kwargs)`` with this run's store (opened at the first
        call). Once the store stopped answering a call (MLflow's deadlines ran out), every
        later call is refused at once with that line."""
        self._check()
        try:
            if self._client is None:
                said_once()
                self._client = store.client(self.uri)
            return function(self._client, *args, **kwargs)
        except CausalabError:
            raise
        except Exception as error:
            found = translated(error, self.uri)
            if found is None:
                raise
            if isinstance(found, StoreRefused):  # named where the store came from
                raise TrackingError(source_of(self.uri_option), found.message) from None
            self._unanswered = TrackingError(source_of(self.uri_option), (
                f"{found.message}; the run's files are in {self.out}, and a rerun stores "
                "the points this one could not"))
        finally:
            self._answered = time.monotonic()
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

    def wait(self) -> None:
        """Raise the first of this run's MLflow calls that failed, as one line. Every call has
        run by the time it returns (a point's numbers were waited for at its end), so after
        it the run can be read back from the store."""
        try:
            self.lane.raise_first()
        except StoreRefused as error:
            raise TrackingError(source_of(self.uri_option), (
                f"{error.message}; the run's files are in {self.out}, and a rerun "
                "stores what this one could not")) from None
        except CausalabError:
            raise
        except Exception as error:  # any other failure of the store, still one line
            raise TrackingError(source_of(self.uri_option), (
                f"the tracking store at {self.uri} failed: {reason(error)}; the run's "
                f"files are in {self.out}, and a rerun stores what this one could not")
            ) from None

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
        self._swept = len(points) > 1 or any(getattr(p, "coordinates", None) for p in points)
        # Which points are done, and a claim on each of the others, decide what runs: the
        # one wait (tracking/claims.py). A rerun asked to compute every point again,
        # so it neither looks up nor claims, and does not wait for the store.
        if not self.rerun:
            asked = {p.digest: self._claim_of(p) for p in points if getattr(p, "digest", None)}
            found = self.call(claims.claim_points, self.experiment_id, wanted, asked)
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
        if holder:  # a live run elsewhere computes it now (tracking/claims.py)
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

    def _claim_of(self, point: Any) -> claims.Claim:
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
        return claims.Claim(name, tags)

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
        else:
            self.lane.send(self._send_sweep_params)

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
        record = Path(self.out) / RUN_RECORD
        if record.is_file() and not any(a == RUN_RECORD for _, a in files):
            files.append((str(record), RUN_RECORD))
        run.finished = True
        if isinstance(error, KeyboardInterrupt):  # ended by ``close``, bounded in time
            self._stopped.append((run, files))
            return
        run.whole = error is None and bool(getattr(point, "directory", ""))
        if run.whole:
            run.folder = str(Path(self.out) / point.directory)
        self.lane.send(self._upload, run, files)
        pictures.send_grids(self, run, point)
        self._done.append((dict(getattr(point, "coordinates", None) or {}), dict(run.means)))
        if error is not None:
            self.lane.send(self._end_point, run, error)
            if self._swept:
                self.lane.send(self._end_sweep, error)
        elif not getattr(point, "directory", ""):
            self._deferred = run
        else:
            self.lane.send(self._end_point, run, None)

    def run_end(self, written: list[str]) -> None:
        record = [(p, RUN_RECORD) for p in written if Path(p).name == RUN_RECORD][:1]
        record = [f for f in record if Path(f[0]).is_file()]
        if self._deferred is not None:
            run, self._deferred = self._deferred, None
            self.lane.send(self._end_point, run, None)
        self._drop_claims()
        if self._swept:
            self.lane.send(self._finish_sweep, written, record)

    def resolve(self, uri: str) -> str:
        """A ``runs:/<run_id>/<path>`` bundle downloaded from this listener's tracking URI."""
        return artifacts.resolve_artifact(uri, self.uri)

    def close(self, error: BaseException | None = None) -> None:
        """End whatever is still open: KILLED on an interrupt, FAILED on any other error.

        What was already sent (files of points that ended) is uploaded first. After an
        interrupt the ends run beside the caller, which waits for them only while calls keep
        ending (``STALL_S``): a store that stopped answering must not hold a stopped run.
        """
        error = error or RuntimeError("the run stopped before its end")
        if not isinstance(error, KeyboardInterrupt):
            self._close(error)
            return
        ending = threading.Thread(target=self._close, args=(error,), daemon=True,
                                  name="causalab-tracking-end")
        self._answered = time.monotonic()
        ending.start()
        while ending.is_alive() and time.monotonic() - self._answered < STALL_S:
            ending.join(0.2)

    def _close(self, error: BaseException) -> None:
        for run, files in self._stopped:
            self.lane.send(self._upload, run, files)
            self.lane.send(self._end_point, run, error)
        self._stopped = []
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
        self.lane.failed.clear()  # the run's own error is the one to report

    def __enter__(self) -> "TrackingEvents":
        """Reach the store now, in seconds, before the run compiles or loads a model; it is
        opened at the first call, once the run holds its ``--out``."""
        reach(self.uri, source_of(self.uri_option), writes=True)
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

    def _drop_claims(self) -> None:
        """Withdraw the claims on points this run never started: nothing of them was made."""
        for run_id in self._claimed.values():
            self.lane.send(lambda run_id=run_id: self.call(store.withdraw, run_id))
        self._claimed = {}

    def _label(self, point: Any) -> str:
        return getattr(point, "name", "") if self._swept else ""
