"""A progress bar over the points of a run, drawn on stderr while a sweep runs.

Only on a terminal, never with ``CAUSALAB_QUIET=1``, and only when there is more than one
point (a fit draws its own bar). It listens to engine events and never touches results.
MLflow's artifact download bar follows the same rule (:func:`mlflow_bars`), and under
``CAUSALAB_QUIET=1`` MLflow's notes on making a SQLite store's tables are left out too
(:func:`mlflow_notes`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Iterator

from causalab.engine.events import Events


def quiet() -> bool:
    """``CAUSALAB_QUIET=1``: no bar and no library chatter, terminal or not."""
    return os.environ.get("CAUSALAB_QUIET") == "1"


def wanted() -> bool:
    """Draw bars only for a person watching a terminal."""
    return not quiet() and sys.stderr.isatty()


_MLFLOW_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@contextlib.contextmanager
def mlflow_bars() -> Iterator[None]:
    """MLflow's download bar under the rule causalab's own bars follow (:func:`wanted`).

    MLflow reads its switch from the environment at each download and has no other; it is
    turned off for the block alone and put back as it was.
    """
    if wanted():
        yield
        return
    before = os.environ.get(_MLFLOW_BAR)
    os.environ[_MLFLOW_BAR] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_MLFLOW_BAR, None)
        else:
            os.environ[_MLFLOW_BAR] = before


# The logger MLflow writes "Creating initial MLflow database tables..." to.
_MLFLOW_STORE_LOGGER = "mlflow.store.db.utils"


@contextlib.contextmanager
def mlflow_notes() -> Iterator[None]:
    """Under ``CAUSALAB_QUIET=1``, MLflow's INFO lines while it opens a store (a new SQLite
    store's tables) are dropped: that one logger of MLflow's own is raised to WARNING for the
    block alone and put back as it was; everything else a user logs is left alone."""
    if not quiet():
        yield
        return
    logger = logging.getLogger(_MLFLOW_STORE_LOGGER)
    before = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)


class PointProgress(Events):
    """One bar: points done out of points planned, with the current point's label."""

    def __init__(self) -> None:
        self._bar = None
        self._task = None

    def run_start(self, document: dict, points: list[Any]) -> None:
        if len(points) < 2 or not wanted():
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("points"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.description}"),
                             console=Console(stderr=True), transient=False)
        self._bar.start()
        self._task = self._bar.add_task("", total=len(points))

    def point_start(self, point: Any) -> bool:
        if self._bar is not None:
            self._bar.update(self._task, description=getattr(point, "name", ""))
        return True

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def run_end(self, written: list[str]) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class Summary(Events):
    """The metric means of every point, kept to print once the run ends.

    One line per (point, step), each mean with its 95 % interval and its row count:
    ``layers=1,pos=-1  test: iia=1.000 [0.74, 1.00] (12) logit_diff=9.610 [8.91, 10.27] (12)``.
    """

    def __init__(self) -> None:
        self.lines: dict[tuple[str, str], dict[str, list[str]]] = {}

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        label = getattr(point, "name", "") or "<root>"
        shown = "--" if mean is None else f"{mean:.3f}"
        self.lines.setdefault((label, step), {})[name] = [f"{name}={shown}", f"({eligible})"]

    def interval(self, point: Any, step: str, name: str, low: float, high: float) -> None:
        entry = self.lines.get((getattr(point, "name", "") or "<root>", step), {}).get(name)
        if entry is not None:
            entry.insert(1, f"[{low:.2f}, {high:.2f}]")

    def render(self) -> str:
        width = max((len(label) for label, _ in self.lines), default=0)
        return "\n".join(f"{label:<{width}}  {step}: "
                         + " ".join(" ".join(entry) for entry in values.values())
                         for (label, step), values in self.lines.items())
