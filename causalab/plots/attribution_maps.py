"""Attribution runs in MLflow: their heatmaps, and a parent's plot of attribution against exact.

An attribute step (docs/format.md §9.7) is one point whose table covers a whole sweep's
units. Its per-unit means (``results["grid"]`` of the plan node, plain data) are drawn with
the sweep pictures of :mod:`causalab.plots.curves`, as if each unit were a point of the
exact sweep, and kept as ``attribution/<step>.json`` with the run tagged
``causalab.attribution``. A multirun's parent that holds both an attribution run and the
points of an exact sweep of the same units gets ``plots/attribution_vs_exact.png``: one dot
per unit, exact mean against attribution mean, per metric, with their rank correlation.
Knows no engine: it reads plan results and runs.
"""
from __future__ import annotations

import functools
import io
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from causalab.plots import curves as plots, faithfulness as edge_plots, verification as verify_plots
from causalab.tracking import runs as store
from causalab.tracking.naming import is_score, split_score
from causalab.tracking.summary import plain

TAG = "causalab.attribution"
FOLDER = "attribution"
COMPARISON = "plots/attribution_vs_exact.png"
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


def _points(step: str, grid: Mapping[str, list]) -> list[plots.Point]:
    """Each unit as a sweep point: its coordinates, and ``<step>/<metric>`` its mean."""
    merged: dict[str, tuple[dict, dict]] = {}
    for metric, cells in grid.items():
        for coordinates, mean in cells:
            key = repr(sorted(coordinates.items()))
            entry = merged.setdefault(key, (coordinates, {}))
            if mean is not None:
                entry[1][f"{step}/{metric}"] = mean
    return list(merged.values())


def log_grids(mlflow, run_id: str, grids: Mapping[str, Mapping[str, list]], *,
              title: str) -> dict[str, int]:
    """A point's attribute steps: their heatmaps or curves, their grids, and the tag; returns
    what was sent."""
    from causalab.tracking import artifacts

    prefix = len(grids) > 1
    sent: dict[str, int] = {}
    for step, grid in grids.items():
        for name, png in plots.sweep_plots(_points(step, grid), title=title).items():
            folder, file = name.rsplit("/", 1)
            sent.update(artifacts.log_bytes(mlflow, run_id, png,
                                            f"{folder}/{step}_{file}" if prefix else name))
        text = json.dumps({m: [[c, v] for c, v in cells] for m, cells in grid.items()})
        sent.update(artifacts.log_bytes(mlflow, run_id, text.encode(), f"{FOLDER}/{step}.json"))
    store.log_batch(mlflow, run_id, tags={TAG: json.dumps(sorted(grids))})
    return sent


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


def _grids(mlflow, run) -> dict[str, list]:
    """The grids an attribution run logged, merged over its steps (a metric from its last)."""
    merged: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="causalab-attribution-") as folder:
        for step in json.loads(run.data.tags[TAG]):
            local = mlflow.download_artifacts(run.info.run_id, f"{FOLDER}/{step}.json", folder)
            merged.update(json.loads(Path(local).read_text()))
    return merged


def log_comparison(mlflow, run_id: str, experiment: str, *, title: str = "") -> None:
    """On a parent: every attribution run below it against every exact point below it."""
    below = store.descendants(mlflow, experiment, run_id)
    estimated = [run for run in below if TAG in run.data.tags]
    if not estimated:
        return
    exact = [(json.loads(run.data.tags.get(store.COORDINATES) or "{}"), dict(run.data.metrics))
             for run in below if TAG not in run.data.tags]
    found: dict[str, list] = {}
    for run in estimated:
        for metric, points in pairs(exact, _grids(mlflow, run)).items():
            found.setdefault(metric, []).extend(points)
    png = comparison(found, title=title)
    if png is not None:
        from causalab.tracking import artifacts

        artifacts.log_bytes(mlflow, run_id, png, COMPARISON)


def send_grids(listener: Any, run: Any, point: Any) -> None:
    """From a tracking listener's ``point_end``: a point with attribute steps sends their
    grids to its run, in the listener's lane, after the point's files."""
    grids = grids_of(point)
    if grids:
        listener.lane.send(lambda: run.sending(listener.call, log_grids, run.run_id, grids,
                                               title=run.title))
    for module, name, numbers in ((verify_plots, "verify", None),
                                  (edge_plots, "faithfulness", edge_plots.areas)):
        reports = module.reports_of(point)
        if reports:
            listener.lane.send(functools.partial(
                run.sending, listener.call, log_step_pictures, run.run_id, reports, module.figure,
                name, title=run.title, metrics=numbers(reports) if numbers else {}))


def log_step_pictures(mlflow, run_id: str, reports: Mapping[str, Any], draw, name: str, *,
                      title: str, metrics: Mapping[str, float]) -> dict[str, int]:
    """Each step's report drawn by ``draw`` as ``plots/<step>_<name>.png`` on its run, and
    ``metrics`` (an edge step's faithfulness areas) beside them; returns what was sent."""
    from causalab.tracking import artifacts

    if metrics:
        now = int(time.time() * 1000)
        store.log_batch(mlflow, run_id, metrics=[store.metric(key, value, 0, now)
                                                 for key, value in metrics.items()])
    sent: dict[str, int] = {}
    for step, report in reports.items():
        png = draw(report, title=title)
        if png is not None:
            sent.update(artifacts.log_bytes(mlflow, run_id, png, f"plots/{step}_{name}.png"))
    return sent
