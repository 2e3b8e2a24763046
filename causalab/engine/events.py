"""Progress events a run emits: the seam between the engine and whoever watches it.

The engine never imports MLflow or rich; it calls these methods. ``Events`` does nothing;
``causalab.tracking`` subclasses it to log to MLflow, and the CLI wraps it with a progress
bar. A point-level hook may veto a point (resume: the point already has a finished run).
"""
from __future__ import annotations

from typing import Any


class Events:
    """No-op listener. Subclass and override what you need."""

    def run_start(self, document: dict, points: list[Any]) -> None:
        """Before the first point; ``points`` are the compiled point plans in order."""

    def point_start(self, point: Any) -> bool:
        """Before a point runs. Return False to skip it (it is already done elsewhere)."""
        return True

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        """After a point: the files it wrote (relative to --out); ``error`` if it raised."""

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        """A saved or computed metric table of a point: mean over eligible rows and count."""

    def fit_update(self, point: Any, step: str, update: int, loss: float) -> None:
        """One optimizer update of a fit (0-based over the whole fit)."""

    def fit_epoch(self, point: Any, step: str, epoch: int, eval_mean: float, kept: float | None) -> None:
        """End of an epoch's eval pass: the watched metric's mean; a gate's kept fraction."""

    def run_end(self, written: list[str]) -> None:
        """After the last point."""

    def resolve(self, uri: str) -> str:
        """A local path for a bundle ``file_path`` that is a URI (``runs:/<run_id>/<path>``).

        The base listener knows no store and returns ``uri`` unchanged; the tracking listener
        downloads the artifact. The engine passes this as the bundle resolver.
        """
        return uri
