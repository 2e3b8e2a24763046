"""The canvas every causalab picture is drawn on: a figure, its PNG bytes, its tick limits.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas, never through pyplot, so
nothing here touches matplotlib's global backend; matplotlib is imported on first use. It
knows no sweep, no run and no store.
"""
from __future__ import annotations

import io
import math
from typing import Any, Sequence

MAX_TICKS = 12


def new_figure(size: tuple[float, float]):
    """A figure whose layout engine keeps titles, labels and legends apart."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawn = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(drawn)
    return drawn


def png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def ticks(values: Sequence[Any]) -> list[Any]:
    """At most :data:`MAX_TICKS` of ``values``, evenly strided from the first."""
    stride = math.ceil(len(values) / MAX_TICKS) or 1
    return list(values)[::stride]


def limit_ticks(axes, integer: bool = False) -> None:
    """Automatic tick locators that never place more than :data:`MAX_TICKS` labels (fixed
    ticks, set where a coordinate is plotted, are already at most that many)."""
    from matplotlib.ticker import MaxNLocator

    for axis in (axes.xaxis, axes.yaxis):
        if axis.get_scale() == "linear" and isinstance(axis.get_major_locator(), MaxNLocator):
            axis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10],
                                                integer=integer and axis is axes.xaxis))
