"""Progress events a run emits: the seam between the engine and whoever watches it.

The engine never imports MLflow; it calls these methods. ``Events`` does nothing;
``causalab.tracking`` subclasses it to log to MLflow and ``causalab.progress`` draws the
points of a sweep; ``Chain`` hands every event to several listeners. A point-level hook may
veto a point (resume: the point already has a finished run).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from causalab.compile.plan import Plan


class Events:
    """No-op listener. Subclass and override what you need."""

    def run_start(self, document: dict, points: list[Plan]) -> None:
        """Before the first point; ``points`` are the compiled point plans in order."""

    def point_start(self, point: Plan | None) -> bool:
        """Before a point runs. Return False to skip it (it is already done elsewhere)."""
        return True

    def point_end(self, point: Plan | None, written: list[str], error: BaseException | None) -> None:
        """After a point: the files it wrote (relative to --out); ``error`` if it raised."""

    def metric(self, point: Plan | None, step: str, name: str, mean: float | None, eligible: int) -> None:
        """A saved or computed metric table of a point: mean over eligible rows and count."""

    def interval(self, point: Plan | None, step: str, name: str, low: float, high: float) -> None:
        """The 95 % interval of the mean just reported by :meth:`metric` (Clopper-Pearson
        for a proportion, else the exact bootstrap: ``causalab.uncertainty``)."""

    def receipt(self, found: dict | None) -> None:
        """The fidelity receipt of the loaded model (``causalab.engine.fidelity``), before
        the first point computes; None when the run has no observed metric to compare."""

    def fit_update(self, point: Plan | None, step: str, update: int, loss: float) -> None:
        """One optimizer update of a fit (0-based over the whole fit)."""

    def fit_epoch(self, point: Plan | None, step: str, epoch: int, eval_mean: float, kept: float | None) -> None:
        """End of an epoch's eval pass: the watched metric's mean; a gate's kept fraction."""

    def run_end(self, written: list[str]) -> None:
        """After the last point."""

    def note(self, line: str) -> None:
        """A check compile could not make (``<path>: <why>``), said before the run starts."""

    def resolve(self, uri: str) -> str:
        """A local path for a bundle ``file_path`` that is a URI (``runs:/<run_id>/<path>``).

        The base listener knows no store and returns ``uri`` unchanged; the tracking listener
        downloads the artifact. The engine passes this as the bundle resolver.
        """
        return uri


class Chain(Events):
    """Several listeners as one: each event goes to each, in order; a point runs only if
    every listener agrees."""

    def __init__(self, *listeners: Events):
        self.listeners = tuple(listener for listener in listeners if listener is not None)

    def run_start(self, document: dict, points: list[Plan]) -> None:
        for listener in self.listeners:
            listener.run_start(document, points)

    def point_start(self, point: Plan | None) -> bool:
        return all([listener.point_start(point) for listener in self.listeners])

    def point_end(self, point: Plan | None, written: list[str], error: BaseException | None) -> None:
        for listener in self.listeners:
            listener.point_end(point, written, error)

    def metric(self, point: Plan | None, step: str, name: str, mean: float | None, eligible: int) -> None:
        for listener in self.listeners:
            listener.metric(point, step, name, mean, eligible)

    def interval(self, point: Plan | None, step: str, name: str, low: float, high: float) -> None:
        for listener in self.listeners:
            listener.interval(point, step, name, low, high)

    def receipt(self, found: dict | None) -> None:
        for listener in self.listeners:
            listener.receipt(found)

    def fit_update(self, point: Plan | None, step: str, update: int, loss: float) -> None:
        for listener in self.listeners:
            listener.fit_update(point, step, update, loss)

    def fit_epoch(self, point: Plan | None, step: str, epoch: int, eval_mean: float, kept: float | None) -> None:
        for listener in self.listeners:
            listener.fit_epoch(point, step, epoch, eval_mean, kept)

    def run_end(self, written: list[str]) -> None:
        for listener in self.listeners:
            listener.run_end(written)

    def note(self, line: str) -> None:
        for listener in self.listeners:
            listener.note(line)

    def resolve(self, uri: str) -> str:
        """The first listener that knows the URI's store turns it into a local path."""
        for listener in self.listeners:
            local = listener.resolve(uri)
            if local != uri:
                return local
        return uri
