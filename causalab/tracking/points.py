"""What a tracked point buffers in the run's process, and the facts read off a point for it.

Plain data only: nothing here imports MLflow or talks to a store.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from causalab.errors import reason
from causalab.files import DOCUMENT
from causalab.scores import naming, summary
from causalab.tracking import runs as store, stored


@dataclass
class PointRun:
    """One point's run: its id once created, and what the point has buffered."""

    label: str
    steps: list[str]
    fits: dict[str, str]
    title: str = ""
    at: int | None = None  # the step its scores are logged at: its sweep axis' value
    run_id: str | None = None
    folder: str | None = None  # where the point's files are in ``out`` (a swept point)
    params: dict[str, str] = field(default_factory=dict)
    metrics: list = field(default_factory=list)
    losses: dict[str, list[float]] = field(default_factory=dict)
    evals: dict[str, list[float]] = field(default_factory=dict)
    # Whether its files are all sent before its numbers (a swept point that ended well), so
    # the ``causalab.stored`` record rides with them; the record sent, once sent.
    whole: bool = False
    recorded: str | None = None
    # What reached the store (stored path -> size; metric keys), read back before it ends
    # FINISHED (tracking/stored.py); why it could not all be sent, once known.
    sent: dict[str, int] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    lost: str | None = None

    @classmethod
    def of(cls, label: str, document: dict | None, title: str) -> PointRun:
        """A point's run: its document's steps, and the metric each fit's early stop watches."""
        steps = (document or {}).get("steps", {})
        return cls(label, list(steps), naming.fits_watched(document), title)

    def ordinal(self, step: str) -> int:
        """The MLflow step a score of ``step`` is logged at: the point's value of its sweep's
        axis (:func:`step_axis`), so MLflow charts a sweep's scores against it; else the
        step's place in the document."""
        if self.at is not None:
            return self.at
        return self.steps.index(step) if step in self.steps else 0

    def score(self, step: str, name: str, mean: float | None, eligible: int) -> None:
        """A step's metric mean (NaN when none) and eligible row count (:meth:`ordinal`)."""
        ordinal = self.ordinal(step)
        value = mean if mean is not None and math.isfinite(mean) else math.nan
        self.add(naming.metric_key(step, name), value, ordinal)
        self.add(naming.eligible_key(step, name), eligible, ordinal)

    def interval(self, step: str, name: str, low: float, high: float) -> None:
        """The ends of a score's 95 % interval, logged beside it (``iia/test.lo``, ``.hi``)."""
        ordinal = self.ordinal(step)
        for key, value in zip(naming.bound_keys(naming.metric_key(step, name)), (low, high)):
            if math.isfinite(value):
                self.add(key, value, ordinal)

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
        point = store.metric(key, value, step)
        self.metrics.append(point)
        self.keys.add(point.key)

    def sending(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``call(*args)``, an upload that returns what it sent: kept for the read-back. A
        failure is kept as the reason the run cannot end FINISHED; the run's end says it."""
        try:
            self.sent.update(call(*args, **kwargs) or {})
        except Exception as error:
            self.lost = self.lost or getattr(error, "message", None) or reason(error)

    def flush(self, call: Callable[..., Any]) -> None:
        """The point's params and every number it buffered, in one request when they fit;
        with its description (:func:`~causalab.scores.summary.description`) and the record
        of what was stored when all of it was sent (:attr:`whole`)."""
        text = stored.record(self.sent, self.keys) if self.whole and self.lost is None else None
        note = summary.description({p.key: p.value for p in self.metrics}, title=self.title)
        tags = {key: value for key, value in ((stored.STORED, text), (store.NOTE, note))
                if value}
        if (self.metrics or self.params or text) and self.run_id is not None:
            call(store.log_batch, self.run_id, metrics=naming.log_order(self.metrics),
                 params=self.params, tags=tags or None)
            self.metrics, self.params = [], {}
            self.recorded = text


def step_axis(coordinates: Sequence[Mapping[str, Any]]) -> str | None:
    """The coordinate a sweep's scores are logged against as MLflow's step (the x axis MLflow
    draws on a log scale): the first that varies between its points and is a whole number
    at each (``k``, ``layers``, ``pos``); None when none is."""
    from causalab.plots.curves import varied

    return next((key for key in varied(coordinates)
                 if all(step_at(c, key) is not None for c in coordinates)), None)


def step_at(coordinates: Mapping[str, Any], axis: str | None) -> int | None:
    """A point's value of ``axis`` as an MLflow step, when it is a whole number."""
    value = summary.plain(coordinates.get(axis)) if axis else None
    return value if summary.numeric(value) and isinstance(value, int) else None


def shared_params(points: list[Any], job: Mapping[str, str]) -> dict[str, str]:
    """A sweep parent's params: the job's own and the facts every point shares."""
    each = [naming.point_params(getattr(p, "document", None), {}, job) for p in points]
    return {k: v for k, v in each[0].items() if all(other.get(k) == v for other in each[1:])}


def files_of(out: str, point: Any, written: list[str], error: BaseException | None) -> list:
    """``(local, artifact)`` pairs of a point: its saves, its document, the root document."""
    directory = getattr(point, "directory", "") or ""
    files = [(str(Path(out) / path), _inside(path, directory)) for path in written]
    if directory and not any(a == DOCUMENT for _, a in files):
        files.insert(0, (str(Path(out) / directory / DOCUMENT), DOCUMENT))
    if not directory and error is None:
        files.insert(0, (str(Path(out) / DOCUMENT), DOCUMENT))
    return files


def _inside(path: str, directory: str) -> str:
    """The artifact path of a file written under the point's directory (relative to --out)."""
    found = Path(path)
    under = bool(directory) and found.is_relative_to(directory)
    relative = found.relative_to(directory) if under else found
    return str(relative) if relative.parts else found.name

