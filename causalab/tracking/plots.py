"""PNG pictures of a sweep or a fit, the kind a paper draft shows: curves, heatmaps, losses.

Every figure is titled with the model and the site; a step's score and its control share one
axis (``test/iia`` beside ``control/iia``); a rank axis is log2, a layer axis has integer
ticks; layer × head and layer × position grids are heatmaps with a colour bar. Figures are
built on ``matplotlib.figure.Figure`` with the Agg canvas, never through pyplot, so nothing
here touches matplotlib's global backend; matplotlib is imported on first use (``warm``).
Inputs are plain numbers (coordinates and metric means); this module knows no runs.
"""
from __future__ import annotations

import io
import math
from typing import Any, Mapping, Sequence

from causalab.tracking.naming import is_score, site_facts, writes_of

Point = tuple[Mapping[str, Any], Mapping[str, float]]  # (coordinates, metric means)
_LAYER = ("layers", "layer")
_HEAD = ("heads", "head")
_POSITION = ("pos", "position", "positions")
_RANK = ("k", "rank")
_MAX_GROUPS = 4
_PANEL_GAP = 0.9  # inches between stacked heatmaps (a panel's title and axis labels)


def warm() -> None:
    """Import matplotlib now (about 0.3 s), off the caller's path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401


def _figure(size: tuple[float, float]):
    from matplotlib.figure import Figure

    # Fixed margins, not a layout engine: constrained layout doubles the drawing time.
    figure = Figure(figsize=size)
    figure.subplots_adjust(left=0.14, right=0.95, bottom=0.16 / max(1.0, size[1] / 3.4),
                           top=1 - 0.65 / size[1], hspace=0.55, wspace=0.3)
    return figure


def _png(figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def title_of(document: Mapping[str, Any] | None, swept: Sequence[str] = ()) -> str:
    """``causalab:weekday-llama · block_input L2 pos -1``: the model and the written site;
    a layer or position that is a ``swept`` coordinate is left out (a sweep's parent is
    titled by one point's document, and that point's layer is not the sweep's)."""
    if not document:
        return ""
    model = (document.get("model") or {}).get("key") or ""
    facts = site_facts(document, writes_of(document))
    place = [facts.get("component") or facts.get("site") or ""]
    if facts.get("layer") and not set(swept) & set(_LAYER):
        place.append(f"L{facts['layer']}")
    if facts.get("position") and not set(swept) & set(_POSITION):
        place.append(f"pos {facts['position']}")
    return " · ".join(part for part in (model, " ".join(p for p in place if p)) if part)


def _scalar(value: Any) -> Any:
    """A coordinate value as its label shows it: a one-element list is its element."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, Mapping) and "index" in value:
        value = value["index"]
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def _axis(coordinates: Mapping[str, Any], names: Sequence[str]) -> str | None:
    for key in coordinates:
        if key.rsplit(".", 1)[-1] in names:
            return key
    return None


def _values(points: Sequence[Point], key: str) -> list:
    return sorted({_scalar(c.get(key)) for c, _ in points}, key=lambda v: (str(type(v)), v))


def varied(coordinates: Sequence[Mapping[str, Any]]) -> list[str]:
    """The coordinate names whose value differs between points, in the first point's order
    (compared as their labels show them; a swept site is a mapping, hence ``repr``)."""
    return [key for key in (coordinates[0] if coordinates else {})
            if len({repr(_scalar(c.get(key))) for c in coordinates}) > 1]


def _groups(points: Sequence[Point]) -> dict[str, list[str]]:
    """Metric name -> the step keys scoring it: ``iia`` -> [``test/iia``, ``control/iia``]."""
    groups: dict[str, list[str]] = {}
    for _, means in points:
        for key in means:
            name = key.rsplit("/", 1)[-1]
            if key not in groups.setdefault(name, []):
                groups[name].append(key)
    return dict(list(groups.items())[:_MAX_GROUPS])


def loss_curve(losses: Sequence[float], evals: Sequence[float] = (), *, title: str = "",
               eval_name: str = "eval") -> bytes:
    """``train/loss`` per update and, beside it, the watched eval metric per epoch."""
    figure = _figure((9 if evals else 5, 3.4))
    grid = figure.subplots(1, 2 if evals else 1, squeeze=False)
    axes = grid[0][0]
    axes.plot(range(len(losses)), list(losses), color="tab:blue")
    axes.set_xlabel("update")
    axes.set_ylabel("train/loss")
    axes.grid(alpha=0.3)
    if evals:
        right = grid[0][1]
        right.plot(range(len(evals)), [math.nan if e is None else e for e in evals],
                   color="tab:orange", marker="o")
        right.set_xlabel("epoch")
        right.set_ylabel(eval_name)
        right.xaxis.get_major_locator().set_params(integer=True)
        right.grid(alpha=0.3)
    figure.suptitle(title or "fit")
    return _png(figure)


def curve(points: Sequence[Point], axis: str, *, title: str = "") -> bytes:
    """One panel per metric; each step (score and control) and each other-axis combination is a
    line on it. A rank axis is log2; a layer axis has integer ticks."""
    groups = _groups(points)
    figure = _figure((6.4, 2.9 * len(groups) + 0.4))
    grid = figure.subplots(len(groups), 1, squeeze=False)
    xs = _values(points, axis)
    for row, (name, keys) in enumerate(groups.items()):
        axes = grid[row][0]
        for key in keys:
            for rest, pairs in _lines(points, axis, key).items():
                pairs.sort()
                style = "--" if key.split("/", 1)[0] in ("control", "random") else "-"
                label = key if not rest else f"{key} {rest}"
                axes.plot([p[0] for p in pairs], [p[1] for p in pairs], style, marker="o",
                          label=label)
        _x_axis(axes, axis, xs)
        axes.set_ylabel(name)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.suptitle(title or "sweep")
    return _png(figure)


def _x_axis(axes, axis: str, xs: list) -> None:
    short = axis.rsplit(".", 1)[-1]
    numeric = [x for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if short in _RANK and numeric and min(numeric) > 0:
        axes.set_xscale("log", base=2)
    if numeric and all(float(x).is_integer() for x in numeric):
        axes.set_xticks(numeric, [str(int(x)) for x in numeric])
    axes.set_xlabel({"layers": "layer", "heads": "head"}.get(short, short))


def _lines(points: Sequence[Point], axis: str, key: str) -> dict[str, list]:
    lines: dict[str, list] = {}
    for coordinates, means in points:
        value = means.get(key)
        if value is None or not math.isfinite(value):
            continue
        rest = ",".join(f"{k}={_scalar(v)}" for k, v in coordinates.items() if k != axis)
        lines.setdefault(rest, []).append((_scalar(coordinates[axis]), value))
    return lines


def heatmap(points: Sequence[Point], rows: str, columns: str, *, title: str = "") -> bytes:
    """Each metric key's mean on a ``rows`` × ``columns`` grid (layer × head, layer × position),
    with a colour bar; a blank cell is a point not run."""
    keys = [k for keys in _groups(points).values() for k in keys][:_MAX_GROUPS]
    ys, xs = _values(points, rows), _values(points, columns)
    panel = 0.25 * len(ys) + 0.6 if len(ys) > 12 else 0.4 * len(ys) + 1.0
    height = 1.2 + (panel + _PANEL_GAP) * len(keys)
    figure = _figure((max(6.0, 2.8 + 0.45 * len(xs)), height))
    # Margins and gaps in inches, so a 30-layer grid is as tight as a 4-layer one.
    figure.subplots_adjust(top=1 - 0.9 / height, bottom=0.7 / height,
                           hspace=_PANEL_GAP / panel)
    grid = figure.subplots(len(keys), 1, squeeze=False)
    for row, key in enumerate(keys):
        cells = [[math.nan] * len(xs) for _ in ys]
        for coordinates, means in points:
            value = means.get(key)
            if value is not None:
                cells[ys.index(_scalar(coordinates[rows]))][xs.index(_scalar(coordinates[columns]))] = value
        axes = grid[row][0]
        image = axes.imshow(cells, aspect="auto", cmap="viridis", origin="lower")
        axes.set_xticks(range(len(xs)), [str(x) for x in xs])
        axes.set_yticks(range(len(ys)), [str(y) for y in ys])
        axes.set_xlabel({"heads": "head", "pos": "position"}.get(columns.rsplit(".", 1)[-1],
                                                                  columns))
        axes.set_ylabel("layer")
        axes.set_title(key, fontsize="medium")
        figure.colorbar(image, ax=axes, label=key.rsplit("/", 1)[-1])
    figure.suptitle(title or "sweep")
    return _png(figure)


def sweep_plots(points: Sequence[Point], *, title: str = "") -> dict[str, bytes]:
    """The pictures a sweep deserves: a layer × head or layer × position heatmap when points
    differ in both, a layer curve when they differ in a layer, else a curve against the first
    numeric coordinate (a rank sweep, a penalty sweep), nothing otherwise."""
    points = [(c, {k: v for k, v in m.items() if is_score(k)}) for c, m in points if c]
    if len(points) < 2 or not any(m for _, m in points):
        return {}
    coordinates = points[0][0]
    varies = set(varied([c for c, _ in points]))
    layer = _axis(coordinates, _LAYER)
    layer = layer if layer in varies else None
    for names, picture in ((_HEAD, "head_heatmap"), (_POSITION, "position_heatmap")):
        other = _axis(coordinates, names)
        if layer and other in varies:
            return {f"plots/{picture}.png": heatmap(points, layer, other, title=title)}
    if layer:
        return {"plots/layer_curve.png": curve(points, layer, title=title)}
    numeric = _numeric_axis(points, varies)
    if numeric:
        return {"plots/sweep_curve.png": curve(points, numeric, title=title)}
    return {}


def _numeric_axis(points: Sequence[Point], varies: set) -> str | None:
    for key in points[0][0]:
        values = _values(points, key)
        if key in varies and all(isinstance(v, (int, float)) and not isinstance(v, bool)
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
    from matplotlib.figure import Figure

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
