"""MIB's circuit scores (Mueller et al. 2025, the circuit localization track) and the floor
under a faithfulness ratio (docs/format.md §9.7, "Circuit scores").

MIB evaluates a ranking of edges at fixed **budgets**, fractions of the graph's edges; the
circuit at budget ``p`` is the top ``int(p · |edges|)`` edges. Its faithfulness
``f = (m(circuit) − m(∅)) / (m(model) − m(∅))`` (``m(∅)``: every edge patched, the
counterfactual's forward) is integrated by the trapezoid rule over the nominal fractions
``x = 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1`` (linear, no point at 0; the
last point is the whole model): **CPR** is the area under ``f`` (higher is better), **CMD**
the area under ``|1 − f|`` (lower is better). MIB's table reads CPR off the edges ranked by
their signed score and CMD off the edges ranked by ``|score|``; the signed ranking here puts
first the edges whose patching moves the metric furthest towards the counterfactual's
(``score · sign(m(cf) − m(base))``), which is MIB's positive score under its loss.

A ratio whose denominator is noise is no faithfulness: :func:`floor` flags a curve whose gap
``m(base) − m(cf)`` is below its metric kind's ``gap_floor`` (``causalab.document.vocab``) or
within ``FLOOR_SE`` standard errors of 0 (the per-row gap's spread over the rows).

Plain numbers only: no torch, no model. The export to MIB's submission layout is
:mod:`causalab.engine.attribution.mib_export`.
"""
from __future__ import annotations

import math
from typing import Sequence

from causalab.document.vocab import METRIC_KINDS

# MIB's circuit budgets: a submission's 9 circuits hold at most these fractions of the edges.
BUDGETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
# The x of MIB's integration: the budgets and the whole model.
POINTS = BUDGETS + (1.0,)
# A gap within this many standard errors of 0 is flagged (about 95 % two-sided).
FLOOR_SE = 2.0


def sizes(total: int) -> list[int]:
    """The circuit size at each of ``POINTS`` for a graph of ``total`` edges, as MIB counts
    it: ``int(p · total)`` (floor; the same float product MIB's evaluation takes).

    >>> sizes(32491)
    [32, 64, 162, 324, 649, 1624, 3249, 6498, 16245, 32491]
    """
    return [int(p * total) for p in POINTS]


def trapezoid(xs: Sequence[float], ys: Sequence[float]) -> float:
    """``Σ (x₂ − x₁) · (y₁ + y₂) / 2`` over consecutive points."""
    return sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(xs) - 1))


def cpr(faithfulness: Sequence[float]) -> float:
    """The area under ``faithfulness`` (one value per point of ``POINTS``)."""
    return trapezoid(POINTS, faithfulness)


def cmd(faithfulness: Sequence[float]) -> float:
    """The area between ``faithfulness`` (one value per point of ``POINTS``) and 1."""
    return trapezoid(POINTS, [abs(1.0 - f) for f in faithfulness])


def floor(kind: str, gap: float, gap_se: float | None) -> dict:
    """Whether the gap ``m(base) − m(cf)`` is too small to divide by: ``below`` when
    ``|gap|`` is under the metric kind's ``gap_floor`` or under ``FLOOR_SE`` standard errors
    (``gap_se``, None with one row); ``why`` says which, empty when neither."""
    least = METRIC_KINDS[kind]["gap_floor"]
    why = []
    if not abs(gap) >= least:  # a NaN gap is below every floor
        why.append(f"|gap| {abs(gap):.3g} < {least:g} {METRIC_KINDS[kind]['unit']}")
    if gap_se is not None and not abs(gap) >= FLOOR_SE * gap_se:
        why.append(f"|gap| {abs(gap):.3g} < {FLOOR_SE:g} standard errors ({gap_se:.3g})")
    return {"gap": gap, "gap_se": gap_se, "floor": least, "se_multiple": FLOOR_SE,
            "below": bool(why), "why": "; ".join(why)}


def scores(faithfulness: dict[str, Sequence[float | None]], metric: dict[str, Sequence[float]],
           ks: Sequence[int], direction: float) -> dict:
    """The step's ``mib`` report from the faithfulness at ``POINTS`` of the two rankings
    (``signed``, ``absolute``): CPR off the signed one, CMD off the absolute one (None where
    a faithfulness is undefined: a zero gap)."""
    def area(of, values):
        return None if any(v is None or math.isnan(v) for v in values) else of(values)
    return {"points": list(POINTS), "ks": list(ks), "direction": direction,
            "signed": {"metric": list(metric["signed"]),
                       "faithfulness": list(faithfulness["signed"])},
            "absolute": {"metric": list(metric["absolute"]),
                         "faithfulness": list(faithfulness["absolute"])},
            "cpr": area(cpr, faithfulness["signed"]),
            "cmd": area(cmd, faithfulness["absolute"])}
