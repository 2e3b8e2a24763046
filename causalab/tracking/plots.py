"""PNG pictures of a sweep or a fit, for the MLflow run page: layer curves, head heatmaps, losses.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas, never through pyplot,
so nothing here touches matplotlib's global backend or figure registry. Inputs are plain
numbers (coordinates and metric means); this module knows nothing of runs or documents.
"""
from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Point = tuple[Mapping[str, Any], Mapping[str, float]]  # (coordinates, metric means)
_LAYER = ("layers", "layer")
_HEAD = ("heads", "head")
_MAX_METRICS = 4


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _scalar(value: Any) -> Any:
    """A coordinate value as its label shows it: a one-element list is its element."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return value[0]
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def _axis(coordinates: Mapping[str, Any], names: Sequence[str]) -> str | None:
    for key in coordinates:
        if key.rsplit(".", 1)[-1] in names:
            return key
    return None


def loss_curve(losses: Sequence[float], evals: Sequence[float] = (), *, title: str = "",
               eval_name: str = "eval") -> bytes:
    """``train/loss`` per update and, beside it, the watched eval metric per epoch."""
    figure = Figure(figsize=(9 if evals else 5, 3.2), layout="constrained")
    grid = figure.subplots(1, 2 if evals else 1, squeeze=False)
    axes = grid[0][0]
    axes.plot(range(len(losses)), list(losses), color="tab:blue")
    axes.set_xlabel("update")
    axes.set_ylabel("train/loss")
    axes.set_title(title)
    if evals:
        right = grid[0][1]
        right.plot(range(len(evals)), list(evals), color="tab:orange", marker="o")
        right.set_xlabel("epoch")
        right.set_ylabel(eval_name)
    return _png(figure)


def layer_curve(points: Sequence[Point], layer_key: str) -> bytes:
    """Each metric's mean against the layer (or any numeric axis: a rank, a weight); one line
    per combination of the other axes."""
    metrics = _metric_names(points)
    figure = Figure(figsize=(6, 2.6 * len(metrics)), layout="constrained")
    grid = figure.subplots(len(metrics), 1, squeeze=False)
    for row, metric in enumerate(metrics):
        axes = grid[row][0]
        for group, pairs in _grouped(points, layer_key, metric).items():
            pairs.sort()
            axes.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o",
                      label=group or metric)
        axes.set_xlabel("layer" if layer_key in _LAYER else layer_key)
        axes.set_ylabel(metric)
        axes.legend(fontsize="small")
    return _png(figure)


def _grouped(points: Sequence[Point], layer_key: str, metric: str) -> dict[str, list]:
    groups: dict[str, list] = {}
    for coordinates, means in points:
        if metric not in means or means[metric] is None:
            continue
        rest = ",".join(f"{k}={_scalar(v)}" for k, v in coordinates.items() if k != layer_key)
        groups.setdefault(rest, []).append((_scalar(coordinates[layer_key]), means[metric]))
    return groups


def head_heatmap(points: Sequence[Point], layer_key: str, head_key: str) -> bytes:
    """Each metric's mean on a layer x head grid."""
    metrics = _metric_names(points)
    layers = sorted({_scalar(c[layer_key]) for c, _ in points})
    heads = sorted({_scalar(c[head_key]) for c, _ in points})
    size = (1.2 + 0.35 * len(heads), 0.6 + 1.2 * len(layers) * len(metrics))
    figure = Figure(figsize=size, layout="constrained")
    grid = figure.subplots(len(metrics), 1, squeeze=False)
    for row, metric in enumerate(metrics):
        cells = [[float("nan")] * len(heads) for _ in layers]
        for coordinates, means in points:
            if means.get(metric) is not None:
                i = layers.index(_scalar(coordinates[layer_key]))
                cells[i][heads.index(_scalar(coordinates[head_key]))] = means[metric]
        axes = grid[row][0]
        image = axes.imshow(cells, aspect="auto", cmap="viridis")
        axes.set_xticks(range(len(heads)), [str(h) for h in heads])
        axes.set_yticks(range(len(layers)), [str(layer) for layer in layers])
        axes.set_xlabel("head")
        axes.set_ylabel("layer")
        axes.set_title(metric)
        figure.colorbar(image, ax=axes)
    return _png(figure)


def _metric_names(points: Sequence[Point]) -> list[str]:
    names: list[str] = []
    for _, means in points:
        names.extend(name for name in means if name not in names)
    return names[:_MAX_METRICS] or ["(none)"]


def sweep_plots(points: Sequence[Point]) -> dict[str, bytes]:
    """The pictures a sweep deserves: a head heatmap when points differ in layers and heads,
    a layer curve when they differ in a layer coordinate, else a curve against the first
    numeric coordinate (a rank sweep, a penalty sweep), nothing otherwise."""
    points = [(c, {k: v for k, v in m.items() if _scored(k)}) for c, m in points if c]
    if len(points) < 2 or not any(m for _, m in points):
        return {}
    layer = _axis(points[0][0], _LAYER)
    head = _axis(points[0][0], _HEAD)
    if layer and head and len({_scalar(c[layer]) for c, _ in points}) > 1:
        return {"plots/head_heatmap.png": head_heatmap(points, layer, head)}
    if layer and len({_scalar(c[layer]) for c, _ in points}) > 1:
        return {"plots/layer_curve.png": layer_curve(points, layer)}
    numeric = _numeric_axis(points)
    if numeric:
        return {"plots/sweep_curve.png": layer_curve(points, numeric)}
    return {}


def _scored(name: str) -> bool:
    """A point's final score, not a count or a per-update/per-epoch series."""
    return not (name.endswith("/eligible") or name.startswith(("train/", "eval/")))


def _numeric_axis(points: Sequence[Point]) -> str | None:
    for key in points[0][0]:
        values = {_scalar(c.get(key)) for c, _ in points}
        if len(values) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                   for v in values):
            return key
    return None


RANKED = ("test/iia", "iia")  # the score a ranking sorts by, in the naming of either era
CONTROL = ("control/iia",)
CONTROL_METHOD = "random"


def _first(means: Mapping[str, float], keys: Sequence[str]) -> float | None:
    return next((means[key] for key in keys if means.get(key) is not None), None)


def ranking_chart(points: Sequence[Point], axis: str = "method") -> bytes | None:
    """Bars of each ``axis`` value's held-out score, best first, for a method comparison;
    the control method's bar is hatched and each method's own control score is a black tick.
    None unless the points differ in ``axis`` and carry a score."""
    scored = [(str(_scalar(c[axis])), _first(m, RANKED), _first(m, CONTROL))
              for c, m in points if axis in c and _first(m, RANKED) is not None]
    if len({name for name, _, _ in scored}) < 2:
        return None
    scored.sort(key=lambda row: (-row[1], row[0]))
    figure = Figure(figsize=(1.2 + 0.8 * len(scored), 3.4), layout="constrained")
    axes = figure.subplots()
    ticked = False
    for x, (name, score, control) in enumerate(scored):
        is_control = name == CONTROL_METHOD
        axes.bar(x, score, color="lightgrey" if is_control else "tab:blue",
                 hatch="//" if is_control else None, edgecolor="black",
                 label="control (random subspace)" if is_control else None)
        if control is not None:
            axes.plot([x - 0.4, x + 0.4], [control, control], color="black", linewidth=3,
                      clip_on=False, label=None if ticked else "its rank-matched control")
            ticked = True
        axes.text(x, score + 0.02, f"{score:.2f}", ha="center", fontsize="small")
    axes.set_xticks(range(len(scored)), [name for name, _, _ in scored])
    axes.set_ylim(-0.03, 1.35)
    axes.set_ylabel("held-out IIA (test/iia)")
    axes.set_title(f"ranking by {axis}")
    axes.legend(fontsize="small", loc="upper right")
    return _png(figure)
