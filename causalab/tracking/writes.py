"""What a tracked run does with the store: its MLflow side, call by call.

:class:`StoreWrites` is the half of :class:`~causalab.tracking.listener.TrackingEvents` that
writes: the sweep's parent opened (or reattached), a point's run created, its numbers, files,
config and loss plots uploaded, a done point linked into a new parent, the sweep's plots
drawn, every run ended FINISHED, FAILED or KILLED. Every call goes through ``self.call`` (the
run's client, its store's deadlines); the state it reads and fills (run ids, buffered
points) is the listener's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from causalab.errors import TrackingError
from causalab.files import DOCUMENT, HYDRA_CONFIG
from causalab.tracking import artifacts, landing, links, owners, stored
from causalab.tracking import runs as store
from causalab.tracking.points import PointRun
from causalab.tracking.reach import source_of


class IncompleteStore(RuntimeError):
    """What a point's run lacks in the store; it ends FAILED with this as its reason."""


class StoreWrites:
    """The store calls of a tracking listener (mixed into ``TrackingEvents``)."""

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
        self._sweep_params = params  # sent with the receipt, once the model is in
        self._log_config(self.sweep_run_id)

    def _send_sweep_params(self, tags: dict[str, str] | None = None) -> None:
        """The parent's params not sent yet, with ``tags`` (the receipt), in one request."""
        params, self._sweep_params = self._sweep_params, {}
        if self.sweep_run_id is not None and (params or tags):
            self.call(store.log_batch, self.sweep_run_id, params=params, tags=tags)

    def _create(self, run: PointRun, name: str, tags: dict) -> None:
        """The point's run: the claim made at the run's start, nested now, or a new one."""
        parent = self.sweep_run_id or self.parent_run_id
        if run.run_id is None:
            run.run_id = self.call(store.create_run, self.experiment_id, name, tags, parent)
        else:  # the claim made at the run's start, started and nested now (params with it)
            params = {} if run.finished else run.params
            tags = {store.CLAIM: "started", **({store.PARENT: parent} if parent else {})}
            self.call(store.log_batch, run.run_id, tags=tags, params=params)
            if params:
                run.params = {}
        # A new run's params go with its numbers when it ends, in one request; what it is
        # (its coordinates, digest, inputs) is in its tags from its creation, so a run whose
        # process dies still says so.
        self.point_runs[run.label] = run.run_id

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

    def _upload(self, run: PointRun, files: list) -> None:
        """Send a point's files, its config, its loss plots, then its buffered numbers (with
        the record of what was sent, when that is all of it); what reached the store is kept
        on ``run`` for the read-back at its end."""
        run.sending(self.call, artifacts.log_files, run.run_id,
                    [f for f in files if Path(f[0]).is_file()])
        run.sending(self._log_config, run.run_id)
        for step, losses in run.losses.items():
            watched = f"eval/{run.fits.get(step, 'eval')}"
            run.sending(self.call, artifacts.log_loss_curve, run.run_id,
                        f"plots/{step}_loss.png", losses, run.evals.get(step, []),
                        title=f"{run.title} · {step}", eval_name=watched)
        run.sending(run.flush, self.call)

    def _log_receipt(self, found: dict) -> None:
        """The fidelity receipt as tags of the run's top run: its sweep's parent, else its
        point's run (``causalab.receipt.*``, docs/platform.md §5)."""
        if self.sweep_run_id is not None:
            self._send_sweep_params(receipt_tags(found))
            return
        run_id = next(iter(self.point_runs.values()), None)
        if run_id is not None:
            self.call(store.log_batch, run_id, tags=receipt_tags(found))

    def _finish_sweep(self, written: list[str], record: list) -> None:
        if self.sweep_run_id is None:
            return
        self._send_sweep_params()
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
        # The parent's pictures are the output folder's too, when this run computed points:
        # drawn once (SweepPictures then finds them among ``written``).
        landed = self.call(landing.land, self.sweep_run_id, done, title=self._title,
                           folder=self.out if self.point_runs else None,
                           local=self._stored) or {}
        written += [p for p in landed.get("pictures", []) if p not in written]
        self._end(self.sweep_run_id, RuntimeError("a point failed") if self.failed else None)

    def _log_config(self, run_id: str) -> dict[str, int]:
        if self.config is None:
            return {}
        if self._config_text is None:
            from omegaconf import DictConfig, OmegaConf

            config = self.config
            if not isinstance(config, DictConfig):
                config = OmegaConf.create(config)
            self._config_text = OmegaConf.to_yaml(config, resolve=True)
        return self.call(artifacts.log_bytes, run_id, self._config_text.encode(), HYDRA_CONFIG)

    def _end_point(self, run: PointRun, error: BaseException | None) -> None:
        """End a point's run: FINISHED only once all it sent reads back from the store
        (:func:`causalab.tracking.stored.finish`), else FAILED with what is missing."""
        if run.run_id is None:
            return
        if error is None and run.lost is None:
            why = self.call(stored.finish, run.run_id, run.sent, sorted(run.keys),
                            run.recorded)
            if why is None:
                if run.folder is not None:
                    self._stored[run.run_id] = Path(run.folder)
                return
            error = IncompleteStore(why)
        elif error is None:
            error = IncompleteStore(f"not all of the point was stored: {run.lost}")
        self.failed.append(run.run_id)
        if isinstance(error, IncompleteStore):
            # A store that stopped answering already said where the files are: once is enough.
            tail = ("" if "files are in" in str(error) else
                    f"; its files are in {self.out}, and a rerun computes it again")
            refusal = TrackingError(source_of(self.uri_option), (
                f"point {run.label or '<root>'} (run {run.run_id}) is not FINISHED: {error}"
                f"{tail}"))
            try:
                self._end(run.run_id, error)
            except Exception:  # a store that takes nothing more leaves it RUNNING: not done
                pass
            raise refusal
        self._end(run.run_id, error)

    def _end_sweep(self, error: BaseException, unless_ended: bool = False) -> None:
        """End the sweep's parent (if it was opened) with ``error``."""
        run_id = self.sweep_run_id
        if run_id is None or unless_ended and self.call(store.status, run_id) != "RUNNING":
            return
        self._send_sweep_params()
        self._end(run_id, error)

    def _end(self, run_id: str, error: BaseException | None) -> None:
        if error is None:
            self.call(store.terminate, run_id, "FINISHED")
            return
        message = f"{type(error).__name__}: {error}".strip()
        self.call(store.log_batch, run_id, tags={store.ERROR: message})
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        self.call(store.terminate, run_id, status)


RECEIPT = "causalab.receipt"


def receipt_tags(found: dict) -> dict[str, str]:
    """``causalab.receipt.max_abs_dlogit``, ``.rows``, ``.dtype`` and one tag a library
    (``causalab.receipt.torch``, …)."""
    tags = {f"{RECEIPT}.{key}": str(found[key]) for key in ("max_abs_dlogit", "rows", "dtype")}
    tags.update({f"{RECEIPT}.{name}": version for name, version in found["versions"].items()})
    return tags
