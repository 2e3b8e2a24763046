"""A run's pictures as files in its output folder, beside its results, tracked or not.

The same PNGs a sweep's parent run carries (:func:`causalab.plots.curves.sweep_plots`),
written under ``<out>/plots/``, and each fit's loss and eval curves beside its point's tables
(``<out>/k=4/fit_loss.png``, titled with the point): an untracked run has them too. Imports
no mlflow.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from causalab.engine.events import Events
from causalab.files import LOSS_PICTURE
from causalab.plots.curves import fit_title, loss_curve, sweep_plots, title_of, varied
from causalab.scores.naming import bound_keys, eligible_key, fits_watched
from causalab.scores.summary import Point


def write_plots(points: Sequence[Point], folder: str | Path, *, title: str = "") -> list[str]:
    """The sweep's pictures as PNG files under ``folder`` (``plots/layer_curve.png``, …), the
    same the parent run carries; returns their paths."""
    written = []
    for name, data in sweep_plots(points, title=title).items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(str(path))
    return written


class SweepPictures(Events):
    """The pictures of a document's sweep written into its output folder at the run's end,
    tracked or not: each point's means as they are scored, plotted as the parent's are."""

    def __init__(self, out: str | Path) -> None:
        self.out = out
        self.title = ""
        self.points: dict[int, tuple[dict, dict]] = {}

    def run_start(self, document: dict, points: list[Any]) -> None:
        places = [dict(getattr(p, "coordinates", None) or {}) for p in points]
        first = points[0] if points else None
        self.title = title_of(getattr(first, "document", None) or document, varied(places))
        self.points = {id(p): (place, {}) for p, place in zip(points, places)}

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        if id(point) in self.points and mean is not None:
            self.points[id(point)][1][f"{name}/{step}"] = mean
            self.points[id(point)][1][eligible_key(step, name)] = eligible

    def interval(self, point: Any, step: str, name: str, low: float, high: float) -> None:
        if id(point) in self.points:
            low_key, high_key = bound_keys(f"{name}/{step}")
            self.points[id(point)][1].update({low_key: low, high_key: high})

    def run_end(self, written: list[str]) -> None:
        """Draw the sweep's pictures, unless the tracked parent's were written into the folder
        already (a listener ahead in the chain put them in ``written``): drawn once."""
        points = [(c, m) for c, m in self.points.values() if m]
        folder = Path(self.out, "plots").resolve()
        if any(Path(p).suffix == ".png" and Path(p).resolve().parent == folder for p in written):
            return
        if len(points) > 1:
            written += write_plots(points, self.out, title=self.title)



class FitPictures(Events):
    """Each fit's loss (per update) and watched eval metric (per epoch) drawn beside its
    point's tables when the point ends, tracked or not: ``<out>/<point>/<step>_loss.png``,
    titled with the model, the site, the point and the step. Ahead of the tracking listener
    in a chain, so the point's run uploads this file (as ``plots/<step>_loss.png``) rather
    than drawing it again; the files are added to the run's ``written`` at its end."""

    def __init__(self, out: str | Path) -> None:
        self.out = out
        self.title = ""
        self.fits: dict[int, dict[str, tuple[list, list]]] = {}
        self.drawn: list[str] = []

    def run_start(self, document: dict, points: list[Any]) -> None:
        first = points[0] if points else None
        places = [dict(getattr(p, "coordinates", None) or {}) for p in points]
        self.title = title_of(getattr(first, "document", None) or document, varied(places))

    def fit_update(self, point: Any, step: str, update: int, loss: float) -> None:
        self.fits.setdefault(id(point), {}).setdefault(step, ([], []))[0].append(loss)

    def fit_epoch(self, point: Any, step: str, epoch: int, eval_mean: float,
                  kept: float | None) -> None:
        self.fits.setdefault(id(point), {}).setdefault(step, ([], []))[1].append(eval_mean)

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        fits = self.fits.pop(id(point), None)
        if error is not None or not fits:
            return
        document = getattr(point, "document", None)
        watched = fits_watched(document)
        directory = getattr(point, "directory", "") or ""
        title = title_of(document) or self.title
        for step, (losses, evals) in fits.items():
            name = Path(directory) / LOSS_PICTURE.format(step=step)
            path = Path(self.out) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            watching = f"eval/{watched.get(step, 'eval')}"
            path.write_bytes(loss_curve(losses, evals, eval_name=watching,
                                        title=fit_title(title, getattr(point, "name", ""), step)))
            written.append(name.as_posix())
            self.drawn.append(str(path))

    def run_end(self, written: list[str]) -> None:
        written += [p for p in self.drawn if p not in written]
        self.drawn = []
