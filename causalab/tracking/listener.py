"""``TrackingEvents``: the engine's progress events, logged to MLflow one run per point.

The events come in above (a point's numbers buffered in
:class:`~causalab.tracking.points.PointRun`), the store calls they make below, each through
:meth:`TrackingEvents.call`. What is stored, when a point is skipped, claimed or ended, and
what a store that stops answering does to a run: docs/platform.md §5.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from causalab.document.digest import digest as document_digest
from causalab.engine.events import Events
from causalab.errors import CausalabError, Path as JsonPath, TrackingError, UsageError, reason
from causalab.files import DOCUMENT, HYDRA_CONFIG, LOSS_PICTURE, RUN_RECORD
from causalab.plots import curves as plots
from causalab.scores import naming
from causalab.tracking import artifacts, claims, landing, owners, pictures, stored
from causalab.tracking import points as facts, runs as store
from causalab.tracking.points import PointRun
from causalab.tracking.reach import StoreRefused, reach, said_once, source_of, translated

# After an interrupt the run waits for its KILLED ends only while a call ends at least this
# often: a store that stopped answering would hold it for MLflow's deadlines.
STALL_S = 1.5


class IncompleteStore(RuntimeError):
    """What a point's run lacks in the store; it ends FAILED with this as its reason."""


class TrackingEvents(Events):
    """Log a run of a document to MLflow (docs/platform.md §5).

    ``tracking_uri``: as :func:`~causalab.tracking.runs.resolve_uri`. ``hydra_config``: the
    job's composed config, logged as ``hydra_config.yaml``. ``parent_run_id``: nest under this
    run (a multirun's parent); ``run_name``: the name of the job's top run (its overrides);
    ``job_params``: extra params (a job's swept overrides); ``job_label``: what tells this
    job's points from its multirun's other jobs' points (``model=gpt2``), put before each
    point's run name (``model=gpt2 k=4``). ``out``: the folder given to ``run_document``,
    whose files it uploads. ``uri_option``: the option a refusal about the store names."""

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None,
                 rerun: bool = False, hydra_config: Any = None, *, out: str | None = None,
                 parent_run_id: str | None = None, run_name: str | None = None,
                 job_params: Mapping[str, Any] | None = None, argv: list[str] | None = None,
                 uri_option: JsonPath | None = None, job_label: str = ""):
        self.out = out
        if out is None:
            raise UsageError(("out",), "TrackingEvents needs out=<the folder run_document "
                                       "writes to>, to upload what the run writes there")
        self.uri = store.resolve_uri(tracking_uri)
        self.experiment = (experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                           or store.default_experiment(self.uri))
        self.rerun = rerun
        self.config = hydra_config
        self.parent_run_id = parent_run_id
        self.run_name = run_name
        self.job_params = {str(k): store.param_value(v) for k, v in (job_params or {}).items()}
        self.job_label = job_label
        self._axis: str | None = None  # the coordinate its points' scores are logged against
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
        self._failures: list[Exception] = []  # the calls that failed, for ``wait``
        self._client: Any = None
        self._swept = False
        self._computes = True  # whether this run computes any point (run_start decides)
        self._claims = claims.Claims()  # by digest: done, why not, mine, taken elsewhere
        self.taken: dict[str, str] = {}  # label -> the live run elsewhere that computes it
        self._open: dict[int, PointRun] = {}
        self._stopped: list[tuple[PointRun, list]] = []  # points an interrupt stopped
        self._answered = time.monotonic()  # when the store last answered a call
        self._stored: dict[str, Path] = {}  # run id -> its point's folder, read back whole
        self._deferred: PointRun | None = None
        self._reattached = False
        self._reused: list[tuple[Any, str, str]] = []
        self._config_text: str | None = None
        self._title = ""

    # --- connection -------------------------------------------------------------------------

    def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """``function(client, *args, **kwargs)`` on this run's store; refused at once after
        the store stopped answering."""
        self._check()
        try:
            if self._client is None:
                said_once()
                self._client = store.client(self.uri)
            return function(self._client, *args, **kwargs)
        except CausalabError:
            raise
        except Exception as error:
            found = translated(error, self.uri, self.experiment)
            if found is None:
                raise
            if isinstance(found, StoreRefused):  # named where the store came from
                raise TrackingError(source_of(self.uri_option), found.message) from None
            self._unanswered = self._lost(found.message)
        finally:
            self._answered = time.monotonic()
        self._check()

    def _check(self) -> None:
        """Raise the store's silence, once it is known (a run stops at its next point)."""
        if self._unanswered is not None:
            raise TrackingError(self._unanswered.path, self._unanswered.message) from None

    @functools.cached_property
    def experiment_id(self) -> str:
        return self.call(store.experiment_id, self.experiment, self.uri)

    def send(self, call: Any, *args: Any, **kwargs: Any) -> None:
        """``call(*args, **kwargs)``; a failure is kept for :meth:`wait`, the calls after it run."""
        try:
            call(*args, **kwargs)
        except Exception as error:
            self._failures.append(error)

    def wait(self) -> None:
        """Raise the first of this run's calls that failed, as one line."""
        failed, self._failures = self._failures, []
        if not failed:
            return
        if isinstance(failed[0], CausalabError):
            raise failed[0]
        why = f"the tracking store at {self.uri} failed: {reason(failed[0])}"  # still one line
        raise self._lost(why) from None

    def _lost(self, why: str) -> TrackingError:
        """``why`` the store has not all of the run, at the option that named the store."""
        return TrackingError(source_of(self.uri_option), (
            f"{why}; the run's files are in {self.out}, and a rerun stores what this one "
            "could not"))

    def _tags(self, kind: str, point: Any = None) -> dict[str, str | None]:
        """A new run's tags: those None are not sent (runs.create_run drops them)."""
        model = getattr(point, "model", None)
        overrides = json.dumps(self.job_params, sort_keys=True) if self.job_params else None
        return {store.KIND: kind, store.VERSION: store.code_version(), **owners.owner_tags(),
                store.MODEL_KEY: getattr(model, "key", None),
                store.MODEL_REVISION: getattr(model, "revision", None),
                store.MODEL_CONTROL: getattr(model, "control", None),
                "causalab.argv": None if self.argv is None else " ".join(self.argv),
                store.OVERRIDES: overrides, store.JOB: self.run_name or None}

    # --- the run ----------------------------------------------------------------------------

    def run_start(self, document: dict, points: list[Any]) -> None:
        first = points[0] if points else None
        varied = plots.varied([getattr(p, "coordinates", None) or {} for p in points])
        self._title = plots.title_of(getattr(first, "document", None) or document, varied)
        wanted = {p.digest: dict(getattr(p, "input_digests", None) or {})
                  for p in points if getattr(p, "digest", None)}
        self._swept = len(points) > 1 or any(getattr(p, "coordinates", None) for p in points)
        if self._swept:
            self._axis = facts.step_axis([getattr(p, "coordinates", None) or {} for p in points])
        # Which points are done, and a claim on each of the others, decide what runs: the
        # one wait (tracking/claims.py). A rerun asked to compute every point again,
        # so it neither looks up nor claims, and does not wait for the store.
        if not self.rerun:
            asked = {p.digest: self._claim_of(p) for p in points if getattr(p, "digest", None)}
            self._claims = self.call(claims.claim_points, self.experiment_id, wanted, asked)
        elsewhere = set(self._claims.done) | set(self._claims.taken)
        self._computes = self.rerun or any(getattr(p, "digest", None) not in elsewhere
                                           for p in points)
        sweep = document_digest(document) if self._swept else None
        # What a killed earlier run of this document left RUNNING ends KILLED first.
        self.send(lambda: self.call(owners.reap, self.experiment_id, wanted, sweep))
        if self._swept:
            self.send(self._open_sweep, sweep, first, facts.shared_params(points, self.job_params))

    def point_start(self, point: Any) -> bool:
        self._check()
        label, digest = self._label(point), getattr(point, "digest", None)
        found = self._claims.done.get(digest)
        if found:
            self.skipped[label] = found
            self.send(self._reuse, point, label, found)
            return False
        holder = self._claims.taken.get(digest)
        if holder:  # a live run elsewhere computes it now (tracking/claims.py)
            self.taken[label] = holder
            print(f"skipped {label or '<root>'}: being computed by {holder}", file=sys.stderr)
            return False
        why = self._claims.why.get(digest)
        if why:  # an earlier run of this document is not this point's result: say why
            print(f"rerunning {label or '<root>'}: {why}", file=sys.stderr)
        document = getattr(point, "document", None)
        run = PointRun.of(label, document, plots.title_of(document) or self._title)
        run.run_id = self._claims.mine.pop(digest, None)
        coordinates = getattr(point, "coordinates", None) or {}
        run.at = facts.step_at(coordinates, self._axis)
        run.params = naming.point_params(document, coordinates, self.job_params)
        self._open[id(point)] = run
        self.send(self._create, run, *self._claim_of(point))
        return True

    def _claim_of(self, point: Any) -> tuple[str, dict[str, str]]:
        """A point's run as it is created: its name and tags (owner, digest, place, inputs)."""
        label = self._label(point)
        coordinates = dict(getattr(point, "coordinates", None) or {})
        return self._run_name(label), {
            **self._tags("point", point), store.PRODUCED_BY: point.digest, store.POINT: label,
            store.COORDINATES: json.dumps(coordinates, sort_keys=True, default=str),
            stored.INPUTS: json.dumps(dict(getattr(point, "input_digests", None) or {}),
                                      sort_keys=True, separators=(",", ":")),
            store.STEP_AXIS: self._axis if facts.step_at(coordinates, self._axis) is not None
            else None,
            # a multirun job's claims sit under its parent from the start
            store.PARENT: self.parent_run_id or None}

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        if (run := self._open.get(id(point))) is not None:
            run.score(step, name, mean, eligible)

    def interval(self, point: Any, step: str, name: str, low: float, high: float) -> None:
        if (run := self._open.get(id(point))) is not None:
            run.interval(step, name, low, high)

    def receipt(self, found: dict | None) -> None:
        self.send(self._log_receipt, found)

    def fit_update(self, point: Any, step: str, update: int, loss: float) -> None:
        if (run := self._open.get(id(point))) is not None:
            run.loss(step, update, loss)

    def fit_epoch(self, point: Any, step: str, epoch: int, eval_mean: float,
                  kept: float | None) -> None:
        self._check()
        if (run := self._open.get(id(point))) is not None:
            run.epoch(step, epoch, eval_mean, kept)

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        run = self._open.pop(id(point), None)
        if run is None:
            return
        files = facts.files_of(self.out, point, written, error)
        record = Path(self.out) / RUN_RECORD
        if record.is_file() and not any(a == RUN_RECORD for _, a in files):
            files.append((str(record), RUN_RECORD))
        if isinstance(error, KeyboardInterrupt):  # ended by ``close``, bounded in time
            self._stopped.append((run, files))
            return
        run.whole = error is None and bool(getattr(point, "directory", ""))
        if run.whole:
            run.folder = str(Path(self.out) / point.directory)
        self.send(self._upload, run, files)
        pictures.send_grids(self, run, point)
        if error is None and not run.whole:  # the root point: ended at the run's end
            self._deferred = run
            return
        self.send(self._end_point, run, error)
        if error is not None and self._swept:
            self.send(self._end_sweep, error)

    def run_end(self, written: list[str]) -> None:
        if self._deferred is not None:
            run, self._deferred = self._deferred, None
            self.send(self._end_point, run, None)
        self._drop_claims()
        if self._swept:
            self.send(self._finish_sweep, written)

    def resolve(self, uri: str) -> str:
        """A ``runs:/<run_id>/<path>`` bundle downloaded from this listener's tracking URI."""
        return artifacts.resolve_artifact(uri, self.uri)

    def close(self, error: BaseException) -> None:
        """End whatever is still open: KILLED on an interrupt (ended beside the caller, waited
        for only while calls keep ending: ``STALL_S``), FAILED on any other error."""
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
        for run, files in self._stopped + [(run, []) for run in self._open.values()]:
            self.send(self._upload, run, files)
            self.send(self._end_point, run, error)
        self._stopped = []
        self._open.clear()
        if self._deferred is not None:
            self.send(self._end_point, self._deferred, error)
            self._deferred = None
        self._drop_claims()
        if self._swept:
            self.send(self._end_sweep, error, True)
        self._failures.clear()  # the run's own error is the one to report

    def __enter__(self) -> "TrackingEvents":
        """Reach the store now, in seconds, before the run compiles or loads a model."""
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
        for run_id in self._claims.mine.values():
            self.send(self.call, store.withdraw, run_id)
        self._claims.mine = {}

    def _label(self, point: Any) -> str:
        return getattr(point, "name", "") if self._swept else ""

    def _run_name(self, label: str) -> str:
        """A point's run name: its sweep label after the job's (``model=gpt2 k=4``), or, a
        job's one point, the job's name."""
        if self._swept:
            return " ".join(part for part in (self.job_label, label) if part)
        return self.run_name or label or "point"

    # --- the store's side -------------------------------------------------------------------

    def _open_sweep(self, sweep: str, first: Any, params: dict[str, str]) -> None:
        """The sweep's parent: a new run, or the killed or failed one a rerun reattaches to."""
        reattach = None if self.rerun or self.parent_run_id else self.call(
            owners.resumable_sweep, self.experiment_id, sweep)
        if reattach:  # the remaining points join the parent of the sweep they belong to
            self.call(owners.reopen, reattach, owners.owner_tags())
            self.sweep_run_id, self._reattached = reattach, True
            return
        if not self._computes and self.parent_run_id is None:
            return  # every point done or computed elsewhere: no parent opened, none left open
        tags = {**self._tags("sweep", first), store.SWEEP: sweep}
        self.sweep_run_id = self.call(store.create_run, self.experiment_id,
                                      self.run_name or "sweep", tags, self.parent_run_id)
        self._sweep_params = params  # sent with the receipt, once the model is in
        self._log_config(self.sweep_run_id)

    def _send_sweep_params(self, tags: dict[str, str] | None = None) -> None:
        """The parent's params not sent yet, with ``tags`` (the receipt), in one request."""
        params, self._sweep_params = self._sweep_params, {}
        if self.sweep_run_id is not None and (params or tags):
            self.call(store.log_batch, self.sweep_run_id, params=params, tags=tags)

    def _create(self, run: PointRun, name: str, tags: dict) -> None:
        """The point's run: the claim made at the run's start, nested now, or a new one."""
        parent = self.sweep_run_id or self.parent_run_id or None  # a None tag is not sent
        if run.run_id is None:
            run.run_id = self.call(store.create_run, self.experiment_id, name, tags, parent)
        else:  # the claim made at the run's start, started and nested now (params with it)
            tags = {store.CLAIM: "started", store.PARENT: parent}
            self.call(store.log_batch, run.run_id, tags=tags, params=run.params)
            run.params = {}
        self.point_runs[run.label] = run.run_id

    def _reuse(self, point: Any, label: str, found: str) -> None:
        """Link a done point into this parent now (a multirun job), or at the sweep's end; a
        point already under this parent (a sweep reattached after a kill) needs no link."""
        parent = self.sweep_run_id or self.parent_run_id
        if parent is None or self.call(
                lambda mlflow: mlflow.get_run(found).data.tags.get(store.PARENT)) == parent:
            return
        if self.parent_run_id is not None:
            self._link(point, label, found)
        elif self.sweep_run_id is not None:
            self._reused.append((point, label, found))

    def _link(self, point: Any, label: str, found: str) -> None:
        parent = self.sweep_run_id or self.parent_run_id
        at = facts.step_at(getattr(point, "coordinates", None) or {}, self._axis)
        tags = {**self._tags("point", point), store.STEP_AXIS: None if at is None else self._axis}
        self.linked[label] = self.call(stored.link, self.experiment_id, found, parent,
                                       self._run_name(label), tags, at or 0)

    def _upload(self, run: PointRun, files: list) -> None:
        """Send a point's files, config, loss plots, then its buffered numbers; what reached
        the store is kept on ``run`` for the read-back at its end."""
        # A fit's picture drawn beside the point's tables (plots.sweep_files.FitPictures) is
        # its run's plots/<step>_loss.png; a fit with none there is drawn here.
        pictures = {LOSS_PICTURE.format(step=step): f"plots/{LOSS_PICTURE.format(step=step)}"
                    for step in run.losses}
        files = [(local, pictures.get(artifact, artifact)) for local, artifact in files]
        run.sending(self.call, artifacts.log_files, run.run_id,
                    [f for f in files if Path(f[0]).is_file()])
        run.sending(self._log_config, run.run_id)
        sent = {artifact for local, artifact in files if Path(local).is_file()}
        for step, losses in run.losses.items():
            artifact = pictures[LOSS_PICTURE.format(step=step)]
            if artifact in sent:
                continue
            watched = f"eval/{run.fits.get(step, 'eval')}"
            run.sending(self.call, artifacts.log_loss_curve, run.run_id, artifact, losses,
                        run.evals.get(step, []), title=plots.fit_title(run.title, run.label, step),
                        eval_name=watched)
        run.sending(run.flush, self.call)

    def _log_receipt(self, found: dict | None) -> None:
        """The fidelity receipt as tags of the run's top run: its parent, else its point's."""
        tags = None
        if found is not None:  # .max_abs_dlogit, .rows, .dtype, and one tag a library (.torch, …)
            facts = {key: found[key] for key in ("max_abs_dlogit", "rows", "dtype")}
            facts.update(found["versions"])
            tags = {f"causalab.receipt.{key}": str(value) for key, value in facts.items()}
        if self.sweep_run_id is not None:
            self._send_sweep_params(tags)
            return
        run_id = next(iter(self.point_runs.values()), None)
        if tags and run_id is not None:
            self.call(store.log_batch, run_id, tags=tags)

    def _finish_sweep(self, written: list[str]) -> None:
        if self.sweep_run_id is None:
            return
        self._send_sweep_params()
        if not self.point_runs and self.parent_run_id is None and not self._reattached:
            self.call(store.withdraw, self.sweep_run_id)  # ended, then deleted: none RUNNING
            return
        for point, label, found in self._reused:
            self._link(point, label, found)
        roots = sorted((p for p in written if Path(p).name == DOCUMENT), key=len)[:1]
        records = [p for p in written if Path(p).name == RUN_RECORD][:1]
        self.call(artifacts.log_files, self.sweep_run_id,
                  [(p, Path(p).name) for p in roots + records if Path(p).is_file()])
        # The parent's pictures are the output folder's too, when this run computed points:
        # drawn once (SweepPictures then finds them among ``written``).
        landed = self.call(landing.land, self.sweep_run_id, title=self._title,
                           folder=self.out if self.point_runs else None,
                           local=self._stored) or {}
        written += [p for p in landed.get("pictures", []) if p not in written]
        self._end(self.sweep_run_id, RuntimeError("a point failed") if self.failed else None)

    def _log_config(self, run_id: str) -> dict[str, int]:
        if self.config is None:
            return {}
        if self._config_text is None:  # a DictConfig, or a plain dict
            from omegaconf import OmegaConf

            self._config_text = OmegaConf.to_yaml(self.config, resolve=True)
        return self.call(artifacts.log_bytes, run_id, self._config_text.encode(), HYDRA_CONFIG)

    def _end_point(self, run: PointRun, error: BaseException | None) -> None:
        """End a point's run: FINISHED only once all it sent reads back from the store
        (:func:`causalab.tracking.stored.finish`), else FAILED with what is missing."""
        if run.run_id is None:
            return
        why = None if run.lost is None else f"not all of the point was stored: {run.lost}"
        if error is None and why is None:
            why = self.call(stored.finish, run.run_id, run.sent, sorted(run.keys), run.recorded)
            if why is None:
                if run.folder is not None:
                    self._stored[run.run_id] = Path(run.folder)
                return
        self.failed.append(run.run_id)
        if error is not None:
            self._end(run.run_id, error)
            return
        # A store that stopped answering already said where the files are: once is enough.
        tail = ("" if "files are in" in why else
                f"; its files are in {self.out}, and a rerun computes it again")
        with contextlib.suppress(Exception):  # a store that takes nothing more: left RUNNING
            self._end(run.run_id, IncompleteStore(why))
        raise TrackingError(source_of(self.uri_option), (
            f"point {run.label or '<root>'} (run {run.run_id}) is not FINISHED: {why}{tail}"))

    def _end_sweep(self, error: BaseException, unless_ended: bool = False) -> None:
        """End the sweep's parent (if it was opened) with ``error``."""
        run_id = self.sweep_run_id
        if run_id is None or unless_ended and self.call(
                lambda mlflow: mlflow.get_run(run_id).info.status) != "RUNNING":
            return
        self._send_sweep_params()
        self._end(run_id, error)

    def _end(self, run_id: str, error: BaseException | None) -> None:
        if error is None:
            self.call(store.terminate, run_id, "FINISHED")
            return
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        self.call(store.terminate, run_id, status, f"{type(error).__name__}: {error}".strip())

