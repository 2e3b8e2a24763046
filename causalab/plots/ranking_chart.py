"""A method comparison as a ranking: a bar per method, best first, its control beside it,
every value written on it, a whisker for the score's 95 % interval, a zero a thin bar of its
colour. Inputs are plain numbers (:mod:`causalab.scores.summary`'s points)."""
from __future__ import annotations

import math
from typing import Sequence

from causalab.scores import summary
from causalab.plots.canvas import limit_ticks, new_figure, png
from causalab.scores.summary import Point, text

CONTROL_METHOD = "random"

def ranking_figure(points: Sequence[Point], axis: str = "method", *, title: str = ""):
    """Bars of each ``axis`` value's main test score, best first, with its control's bar
    beside it; the control method's own bar is light grey; every bar carries its value, and a
    zero is a thin bar of its colour with a cap at zero. None unless the points differ in ``axis`` and carry a score."""
    name, test, control = summary.main_keys(points)
    scored = [(text(c[axis]), summary.value(m, name, test), summary.value(m, name, control))
              for c, m in points if axis in c and summary.value(m, name, test) is not None]
    if len({method for method, _, _ in scored}) < 2:
        return None
    intervals = {text(c[axis]): summary.bounds(m, name, test) for c, m in points if axis in c}
    scored.sort(key=lambda row: (-row[1], row[0]))
    heading = f"{title or 'ranking'} · {name} by {axis}"
    # as wide as its bars need, or as its title (0.085 inch a character at 12 pt, and a margin)
    figure = new_figure((max(1.6 + 1.1 * len(scored), 0.5 + 0.09 * len(heading)), 3.8))
    axes = figure.subplots()
    heights = [v for _, score, other in scored for v in (score, other) if v is not None]
    span = (max(heights + [0.0]) - min(heights + [0.0])) or 1.0
    for x, (method, score, other) in enumerate(scored):
        floor = method == CONTROL_METHOD
        _bar(axes, x - 0.2 if other is not None else x, score, span,
             color="lightgrey" if floor else "tab:blue", interval=intervals.get(method))
        if other is not None:
            _bar(axes, x + 0.2, other, span, color="tab:grey")
    axes.axhline(0.0, color="black", linewidth=1.0)
    low, high = min(heights + [0.0]), max(heights + [0.0])
    axes.set_ylim(low - 0.12 * span, high + 0.15 * span)
    axes.set_xticks(range(len(scored)), [method for method, _, _ in scored])
    if max(len(method) for method, _, _ in scored) > 12:  # wider than its bar: slanted
        axes.tick_params(axis="x", labelrotation=25)
        for label in axes.get_xticklabels():
            label.set_horizontalalignment("right")
    axes.set_xlim(-0.6, len(scored) - 0.4)
    axes.set_ylabel(f"{name} ({test})")
    axes.set_xlabel(axis)
    limit_ticks(axes)
    _legend(figure, any(other is not None for _, _, other in scored),
            any(method == CONTROL_METHOD for method, _, _ in scored), test, control)
    figure.suptitle(heading)
    return figure


# The least height a bar is drawn with, as a share of the value axis's span: a score of zero
# is still a bar of its colour, which its legend swatch then matches.
_STUB = 0.02


def _bar(axes, x: float, height: float, span: float, *, color: str,
         interval: tuple[float, float] | None = None) -> None:
    drawn = height if abs(height) >= _STUB * span else math.copysign(_STUB * span, height)
    axes.bar(x, drawn, width=0.38, color=color, edgecolor="black", linewidth=0.8)
    if interval is not None:  # the score's 95 % interval as a whisker through the bar
        axes.vlines(x, interval[0], interval[1], color="black", linewidth=1.0)
    # A cap at the bar's value, so that a score of exactly zero is still a visible mark.
    axes.plot([x - 0.19, x + 0.19], [height, height], color="black", linewidth=2.5,
              solid_capstyle="butt")
    offset = 0.02 * span
    axes.text(x, height + offset if height >= 0 else height - offset, f"{height:.2f}",
              ha="center", va="bottom" if height >= 0 else "top", fontsize=7)


def _legend(figure, controls: bool, method: bool, test: str, control: str | None) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="tab:blue", edgecolor="black", label=test)]
    if controls:
        handles.append(Patch(facecolor="tab:grey", edgecolor="black",
                             label=f"{control} (same method, untrained)"))
    if method:
        handles.append(Patch(facecolor="lightgrey", edgecolor="black",
                             label=f"{CONTROL_METHOD} (the floor)"))
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles),
                  fontsize="small", frameon=False)


def ranking_chart(points: Sequence[Point], axis: str = "method", *, title: str = "") -> bytes | None:
    figure = ranking_figure(points, axis, title=title)
    return None if figure is None else png(figure)
