"""PNG pictures of a sweep or a fit, the kind a paper draft shows: curves, heatmaps, rankings.

Every figure is titled with the model and the site. A curve has one panel per quantity
(``iia``, ``logit_diff``) and one line per step measuring it (``test``, and ``control``
dashed beside it), labelled by the step and by any other swept coordinate, never by the
overrides; points that differ in their model get a column of panels per model. A rank axis
is log2, a layer axis has integer ticks, and no axis has more than ``figures.MAX_TICKS`` labels
(a 30-layer sweep is ticked every third layer). Layer × head and layer × position grids are
heatmaps with a colour bar. Numbers are placed by size, anything else (a position named S1,
S2, END) in the order the sweep gave it; a quantity named as a fraction (``iia``, ``p_answer``)
has an axis or colour scale from 0 to 1; a score's 95 % interval, when its point logged one,
is a shaded band behind its line, and the figure's foot says so and how many rows each point
was scored on (``n/<metric>/<step>``). A method comparison is a ranking
(:mod:`causalab.plots.ranking_chart`). Figures are drawn on :mod:`causalab.plots.canvas`' canvas. Inputs are plain numbers (coordinates and
metrics, :mod:`causalab.scores.summary`); this module knows no runs.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from causalab.scores import summary
from causalab.plots.canvas import limit_ticks, new_figure, png, ticks
from causalab.scores.naming import site_facts, writes_of
from causalab.plots.ranking_chart import ranking_chart, ranking_figure  # noqa: F401
from causalab.scores.summary import CONTROLS, Point, numeric, plain, short, text

_LAYER = ("layers", "layer")
_HEAD = ("heads", "head")
_POSITION = ("pos", "position", "positions")
_RANK = ("k", "rank")
_GROUP = ("model",)  # a coordinate that splits a figure into columns of panels
_MAX_QUANTITIES = 3
_MAX_COLUMNS = 4
_MAX_LEGEND = 8


def title_of(document: Mapping[str, Any] | None, swept: Sequence[str] = ()) -> str:
    """``causalab:weekday-llama · block_input L2 pos -1``: the model and the written site;
    a layer or position that is a ``swept`` coordinate is left out."""
    if not document:
        return ""
    model = (document.get("model") or {}).get("key") or ""
    facts = site_facts(document, writes_of(document))
    return _title(model, facts, {short(k) for k in swept})


def title_from_params(params: Sequence[Mapping[str, str]]) -> str:
    """The same title from the points' params (``model.key``, ``component``, ``layer``,
    ``position``): what every point shares; several models are counted."""
    def shared(key: str) -> str | None:
        values = {p.get(key) for p in params}
        return values.pop() if len(values) == 1 else None

    models = {p.get("model.key") for p in params if p.get("model.key")}
    model = shared("model.key") or (f"{len(models)} models" if len(models) > 1 else "")
    facts = {key: shared(key) for key in ("component", "site", "layer", "position")}
    return _title(model, facts, set())


def _title(model: str, facts: Mapping[str, str | None], swept: set) -> str:
    place = [facts.get("component") or facts.get("site") or ""]
    if facts.get("layer") and not swept & set(_LAYER):
        place.append(f"L{facts['layer']}")
    if facts.get("position") and not swept & set(_POSITION):
        place.append(f"pos {facts['position']}")
    return " · ".join(part for part in (model, " ".join(p for p in place if p)) if part)


def varied(coordinates: Sequence[Mapping[str, Any]]) -> list[str]:
    """The coordinate names whose value differs between points, in the first point's order
    (compared as their labels show them; a swept site is a mapping, hence ``repr``). A name
    for the same word that moves with an earlier one, value for value (a job's ``site.layer``
    and the ``layers`` it renders to), is that one again and left out."""
    def shown(key: str) -> list[str]:
        return [repr(plain(c.get(key))) for c in coordinates]

    found: list[str] = []
    for key in (coordinates[0] if coordinates else {}):
        values = shown(key)
        if len(set(values)) > 1 and not any(
                _word(k) == _word(key) and _together(values, shown(k)) for k in found):
            found.append(key)
    return found


def _word(key: str) -> str:
    return short(key).rstrip("s")


def _together(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two coordinates' values pair one to one across the points."""
    pairs = set(zip(a, b))
    return len(pairs) == len(set(a)) == len(set(b))


def _values(points: Sequence[Point], key: str) -> list:
    """The distinct values of ``key``: numbers (and lists of numbers) by size, anything else
    in the order the points first show it (a document's sweep order: S1, S2, END as the
    prompt reads). A list or mapping is a value too (``units=[0,1,2,3]``), told apart by its
    ``repr`` as :func:`varied` tells them."""
    found: dict[str, Any] = {}
    for coordinates, _ in points:
        value = plain(coordinates.get(key))
        found.setdefault(repr(value), value)
    values = list(found.values())
    orders = [_order(v) for v in values]
    if all(order[0] < 2 for order in orders):
        return sorted(values, key=_order)
    return values


def _order(value: Any) -> tuple:
    """Numbers by size, lists of numbers element by element, anything else after them."""
    if numeric(value):
        return (0, value, "")
    if isinstance(value, (list, tuple)) and all(numeric(v) for v in value):
        return (1, tuple(value), "")
    return (2, (), text(value))


# Quantity names whose values are fractions (a ``match`` metric, a ``token_prob``): their
# axes and colour scales span 0 to 1 whatever the points reached.
_FRACTIONS = ("iia", "top1", "match", "accuracy", "acc", "prob", "p")


def bounds(name: str, values: Sequence[float]) -> tuple[float, float] | None:
    """(0, 1) for a quantity named as a fraction (``iia``, ``top1``, ``p_answer``,
    ``prob_io``) whose values all lie in it; None (the data's own range) otherwise."""
    word = name.split("_")[0].lower()
    inside = all(0.0 <= v <= 1.0 for v in values if v is not None and math.isfinite(v))
    return (0.0, 1.0) if word in _FRACTIONS and inside else None


def log_axis(axis: str, values: Sequence[Any]) -> bool:
    """Whether a numeric axis reads better on a log scale: a rank (``k``) above zero, as these
    pictures draw it, or any grid of three or more positive values spaced by ratio rather than
    by difference (1, 4, 16; 0.001, 0.01, 0.1)."""
    numbers = sorted({float(v) for v in map(plain, values) if numeric(v)})
    if not numbers or numbers[0] <= 0:
        return False
    if short(axis) in _RANK:
        return True

    def spread(gaps: list[float]) -> float:
        return (max(gaps) - min(gaps)) / (sum(gaps) / len(gaps))

    pairs = list(zip(numbers, numbers[1:]))
    return len(numbers) >= 3 and spread([math.log(b / a) for a, b in pairs]) < \
        spread([b - a for a, b in pairs])


def _axis(keys: Sequence[str], names: Sequence[str]) -> str | None:
    return next((key for key in keys if short(key) in names), None)


def fit_title(title: str, point: str, step: str) -> str:
    """``causalab:weekday-llama · block_input L2 pos -1 · k=4 · fit``: a fit's picture by its
    model and site, its point (a sweep's points differ there alone) and its step."""
    return " · ".join(part for part in (title, point, step) if part)


def loss_figure(losses: Sequence[float], evals: Sequence[float] = (), *, title: str = "",
                eval_name: str = "eval"):
    """``train/loss`` per update and, beside it, the watched eval metric per epoch."""
    figure = new_figure((9 if evals else 5, 3.4))
    grid = figure.subplots(1, 2 if evals else 1, squeeze=False)
    axes = grid[0][0]
    axes.plot(range(len(losses)), list(losses), color="tab:blue")
    axes.set_xlabel("update")
    axes.set_ylabel("train/loss")
    axes.grid(alpha=0.3)
    limit_ticks(axes)
    if evals:
        right = grid[0][1]
        right.plot(range(len(evals)), [math.nan if e is None else e for e in evals],
                   color="tab:orange", marker="o")
        right.set_xlabel("epoch")
        right.set_ylabel(eval_name)
        right.grid(alpha=0.3)
        limit_ticks(right, integer=True)
    figure.suptitle(title or "fit")
    return figure


def loss_curve(losses: Sequence[float], evals: Sequence[float] = (), *, title: str = "",
               eval_name: str = "eval") -> bytes:
    return png(loss_figure(losses, evals, title=title, eval_name=eval_name))


def _split(points: Sequence[Point], swept: Sequence[str]) -> tuple[str | None, list]:
    """(the grouping coordinate, its values) when points differ in their model, else one group."""
    group = _axis(swept, _GROUP)
    if group is None:
        return None, [None]
    return group, _values(points, group)[:_MAX_COLUMNS]


def curve_figure(points: Sequence[Point], axis: str, *, title: str = ""):
    """One panel per quantity (and per model); one line per step and per other swept value."""
    swept = varied([c for c, _ in points])
    found = dict(list(summary.quantities(points).items())[:_MAX_QUANTITIES])
    group, columns = _split(points, swept)
    rest = [k for k in swept if k not in (axis, group)]
    figure = new_figure((1.0 + 4.6 * len(columns), 0.5 + 2.6 * len(found)))
    grid = figure.subplots(len(found), len(columns), squeeze=False)
    xs = _values(points, axis)
    banded = False
    for row, (name, steps) in enumerate(found.items()):
        for column, model in enumerate(columns):
            axes = grid[row][column]
            chosen = [p for p in points if group is None or plain(p[0].get(group)) == model]
            lines = _lines(chosen, axis, name, steps, rest)
            for label, (step, pairs) in lines.items():
                control = step in CONTROLS
                drawn, = axes.plot([x for x, _ in pairs], [y for _, y in pairs],
                                   "--" if control else "-", marker="o", label=label,
                                   color="tab:grey" if control and len(lines) <= 2 else None)
                banded |= _band(axes, chosen, axis, name, step, pairs, drawn.get_color())
            _x_axis(axes, axis, xs)
            fixed = bounds(name, [y for _, pairs in lines.values() for _, y in pairs])
            if fixed:
                axes.set_ylim(fixed[0] - 0.05, fixed[1] + 0.05)
            axes.set_ylabel(name)
            axes.grid(alpha=0.3)
            if model is not None and row == 0:
                axes.set_title(str(model), fontsize="medium")
            if lines and len(lines) <= _MAX_LEGEND:
                axes.legend(fontsize="small")
    figure.suptitle(title or "sweep")
    caption = _caption(points, found, banded)
    if caption:
        figure.supxlabel(caption, fontsize="small", color="dimgrey")
    return figure


def _caption(points: Sequence[Point], found: Mapping[str, Sequence[str]], banded: bool) -> str:
    """``each point scored on 12 rows`` / ``shaded: the mean's 95 % interval over its rows``:
    how many rows a point's means were taken over (``n/<metric>/<step>``, where the points
    logged it) and what a band is, where one is drawn (the interval of docs/format.md §7.10),
    a line each."""
    counts = sorted({int(metrics[key]) for _, metrics in points for name, steps in found.items()
                     for step in steps if (key := f"n/{name}/{step}") in metrics
                     and math.isfinite(metrics[key])})
    parts = []
    if counts:
        rows = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        parts.append(f"each point scored on {rows} rows")
    if banded:
        parts.append("shaded: the mean's 95 % interval over its rows")
    return "\n".join(parts)


def _lines(points: Sequence[Point], axis: str, name: str, steps: Sequence[str],
           rest: Sequence[str]) -> dict[str, tuple[str, list]]:
    """Label -> (step, sorted (x, y) pairs): ``test``, ``control``, or ``test pos=-1``."""
    lines: dict[str, tuple[str, list]] = {}
    for step in steps:
        for coordinates, metrics in points:
            found = summary.value(metrics, name, step)
            if found is None:
                continue
            other = " ".join(f"{short(k)}={text(coordinates.get(k))}" for k in rest)
            label = f"{_step_label(step)} {other}" if other else _step_label(step)
            lines.setdefault(label, (step, []))[1].append((plain(coordinates[axis]), found))
    for _, pairs in lines.values():
        pairs.sort()
    return lines


def _band(axes, points: Sequence[Point], axis: str, name: str, step: str, pairs: list,
          color: str) -> bool:
    """The 95 % interval of each point on a line (``<score>.lo``/``.hi``, summary.bounds) as a
    shaded band behind it, when every point of the line logged one; whether it was drawn."""
    spans = {}
    for coordinates, metrics in points:
        found = summary.bounds(metrics, name, step)
        if found is not None and axis in coordinates:
            spans[plain(coordinates[axis])] = found
    if len(pairs) < 2 or any(x not in spans for x, _ in pairs):
        return False
    axes.fill_between([x for x, _ in pairs], [spans[x][0] for x, _ in pairs],
                      [spans[x][1] for x, _ in pairs], color=color, alpha=0.15, linewidth=0)
    return True


def _step_label(step: str) -> str:
    """A step as a legend says it; a fit's series by when its value was taken."""
    last = step.rsplit(" ", 1)[-1]
    return {"eval": f"{step} (last epoch)", "train": f"{step} (last update)"}.get(last, step)


def _x_axis(axes, axis: str, xs: list) -> None:
    from matplotlib.ticker import NullFormatter

    name = short(axis)
    numbers = [x for x in xs if numeric(x)]
    if name in _RANK and numbers and min(numbers) > 0:
        axes.set_xscale("log", base=2)
        axes.xaxis.set_minor_formatter(NullFormatter())
    if numbers and all(float(x).is_integer() for x in numbers):
        shown = ticks(numbers)
        axes.set_xticks(shown, [str(int(x)) for x in shown])
        axes.set_xticks([], minor=True)
    axes.set_xlabel({"layers": "layer", "heads": "head", "pos": "position"}.get(name, name))
    limit_ticks(axes)


def heatmap_figure(points: Sequence[Point], rows: str, columns: str, *, title: str = ""):
    """The main quantity's steps (and, per model, again) on a ``rows`` × ``columns`` grid
    with a colour bar; a blank cell is a point not run."""
    from matplotlib.ticker import MaxNLocator

    swept = varied([c for c, _ in points])
    name, steps = next(iter(summary.quantities(points).items()), ("", []))
    group, models = _split(points, swept)
    panels = [(step, model) for model in models for step in steps][:4]
    ys, xs = _values(points, rows), _values(points, columns)
    height = 0.5 * len(ys) + 1.2 if len(ys) <= 12 else 0.16 * len(ys) + 1.6
    figure = new_figure((max(6.0, 2.8 + 0.4 * min(len(xs), 24)), 0.6 + height * len(panels)))
    grid = figure.subplots(len(panels), 1, squeeze=False)
    for index, (step, model) in enumerate(panels):
        cells = [[math.nan] * len(xs) for _ in ys]
        for coordinates, metrics in points:
            found = summary.value(metrics, name, step)
            if found is not None and (group is None or plain(coordinates.get(group)) == model):
                cells[ys.index(plain(coordinates[rows]))][xs.index(plain(coordinates[columns]))] = found
        axes = grid[index][0]
        scale = bounds(name, [v for row in cells for v in row]) or (None, None)
        image = axes.imshow(cells, aspect="auto", cmap="viridis", origin="lower",
                            vmin=scale[0], vmax=scale[1])
        shown_x, shown_y = ticks(range(len(xs))), ticks(range(len(ys)))
        axes.set_xticks(shown_x, [text(xs[i]) for i in shown_x])
        axes.set_yticks(shown_y, [text(ys[i]) for i in shown_y])
        axes.set_xlabel({"heads": "head", "pos": "position"}.get(short(columns), short(columns)))
        axes.set_ylabel("layer")
        axes.set_title(f"{name}/{step}" + (f" · {model}" if model is not None else ""),
                       fontsize="medium")
        bar = figure.colorbar(image, ax=axes, label=name)
        bar.locator = MaxNLocator(nbins=8)
    figure.suptitle(title or "sweep")
    caption = _caption(points, {name: [step for step, _ in panels]}, False)
    if caption:
        figure.supxlabel(caption, fontsize="small", color="dimgrey")
    return figure


def sweep_figures(points: Sequence[Point], *, title: str = "") -> dict[str, Any]:
    """The pictures a sweep deserves, by artifact name: a layer × head or layer × position
    heatmap when points differ in both, a layer curve when they differ in a layer, a curve
    against another numeric coordinate (a rank sweep, a penalty sweep), a ranking when they
    differ in their method; nothing for fewer than two scored points."""
    points = [(c, m) for c, m in points if c and summary.scores(m)]
    if len(points) < 2:
        return {}
    swept = varied([c for c, _ in points])
    layer = _axis(swept, _LAYER)
    figures: dict[str, Any] = {}
    for names, picture in ((_HEAD, "head_heatmap"), (_POSITION, "position_heatmap")):
        other = _axis(swept, names)
        if layer and other and not figures:
            figures[f"plots/{picture}.png"] = heatmap_figure(points, layer, other, title=title)
    axis = layer or _numeric_axis(points, swept)
    if axis and not figures:
        name = "layer_curve" if axis == layer else "sweep_curve"
        figures[f"plots/{name}.png"] = curve_figure(points, axis, title=title)
    method = _axis(swept, ("method",)) or (None if figures else _category(points, swept))
    ranking = ranking_figure(points, method, title=title) if method else None
    if ranking is not None:
        figures["plots/ranking.png"] = ranking
    return figures


def _category(points: Sequence[Point], swept: Sequence[str]) -> str | None:
    """A swept coordinate that is not a number (a model, a mechanism): ranked when nothing
    numeric was swept."""
    return next((k for k in swept if not all(numeric(v) for v in _values(points, k))), None)


def sweep_plots(points: Sequence[Point], *, title: str = "") -> dict[str, bytes]:
    return {name: png(figure) for name, figure in sweep_figures(points, title=title).items()}


def _numeric_axis(points: Sequence[Point], swept: Sequence[str]) -> str | None:
    for key in swept:
        if key not in _GROUP and all(numeric(v) for v in _values(points, key)):
            return key
    return None
