"""Attribution as pictures: a step's per-unit grid as sweep points, and attribution against exact.

An attribute step (docs/format.md §9.7) is one point whose table covers a whole sweep's
units. Its per-unit means (``results["grid"]`` of the plan node, plain data) are drawn with
the sweep pictures of :mod:`causalab.plots.curves`, as if each unit were a point of the
exact sweep. Against an exact sweep of the same units: one dot per unit, exact mean against
attribution mean, per metric, with their rank correlation. Knows no engine and no store: it
reads plan results and plain numbers (:mod:`causalab.tracking.pictures` logs them).
"""
from __future__ import annotations

import io
import math
from typing import Any, Mapping, Sequence

from causalab.plots import curves as plots
from causalab.scores.naming import is_score, split_score
from causalab.scores.summary import plain

_UNIT_AXES = ("layers", "heads", "units", "pos")


def grids_of(point: Any) -> dict[str, list]:
    """``{<step>: {metric: [(coordinates, mean), …]}}`` of every attribute step of a point."""
    found = {}
    for node in getattr(point, "children", ()) or ():
        grid = (getattr(node, "results", None) or {}).get("grid")
        if grid is not None and hasattr(node, "passes"):
            found[node.name] = {metric: [(dict(c), m) for c, m in cells]
                                for metric, cells in grid.items()}
    return found


def grid_points(step: str, grid: Mapping[str, list]) -> list[plots.Point]:
    """Each unit as a sweep point: its coordinates, and ``<step>/<metric>`` its mean."""
    merged: dict[str, tuple[dict, dict]] = {}
    for metric, cells in grid.items():
        for coordinates, mean in cells:
            key = repr(sorted(coordinates.items()))
            entry = merged.setdefault(key, (coordinates, {}))
            if mean is not None:
                entry[1][f"{step}/{metric}"] = mean
    return list(merged.values())


def _unit(coordinates: Mapping[str, Any]) -> tuple:
    """A unit's identity across runs: its layer, head, feature and position, as labels show them."""
    return tuple((name, plain(coordinates[name])) for name in _UNIT_AXES if name in coordinates)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Rank correlation, ties at their mean rank; NaN for fewer than two distinct values."""
    import pandas

    return float(pandas.Series(list(xs)).rank().corr(pandas.Series(list(ys)).rank()))


def pairs(exact: Sequence[plots.Point], estimated: Mapping[str, list]) -> dict[str, list]:
    """``{metric: [(exact mean, attribution mean), …]}`` over the units both runs scored."""
    found: dict[str, list] = {}
    for metric, cells in estimated.items():
        for coordinates, means in exact:
            key = _unit(coordinates)
            value = next((v for k, v in means.items()
                          if is_score(k) and split_score(k)[0] == metric), None)
            mine = _match(key, cells)
            if key and mine is not None and value is not None and math.isfinite(value):
                found.setdefault(metric, []).append((value, mine))
    return found


def _match(key: tuple, cells: list) -> float | None:
    """The one cell whose coordinates agree with ``key`` on the axes ``key`` names (an exact
    sweep at one layer names no layer); None when none or several do."""
    names = {name for name, _ in key}
    hits = [m for c, m in cells
            if m is not None and tuple(p for p in _unit(c) if p[0] in names) == key]
    return hits[0] if len(hits) == 1 else None


def comparison(found: Mapping[str, list], *, title: str = "") -> bytes | None:
    """One scatter per metric: exact patching (x) against attribution (y), the diagonal
    dashed, Spearman's rho in the panel title; None with nothing to compare."""
    found = {m: p for m, p in found.items() if len(p) >= 2}
    if not found:
        return None
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.4 * len(found) + 0.6, 4.2), layout="constrained")
    grid = figure.subplots(1, len(found), squeeze=False)
    for column, (metric, points) in enumerate(found.items()):
        axes = grid[0][column]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        axes.plot(xs, ys, "o", markersize=3.5, alpha=0.7)  # dots (the seam owns "scatter")
        low, high = min(xs + ys), max(xs + ys)
        axes.plot([low, high], [low, high], "--", color="grey", linewidth=1)
        axes.set_xlabel(f"exact patching: {metric}")
        axes.set_ylabel(f"attribution: {metric}")
        rho = spearman(xs, ys)
        axes.set_title(f"{len(points)} units, Spearman {rho:.3f}", fontsize="medium")
        axes.grid(alpha=0.3)
    figure.suptitle(title or "attribution against exact patching")
    return _png(figure)


def _png(figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


