"""How sure a score is: its 95 % interval over its rows, and who beats whom over shared rows.

Every score causalab reports is a mean over rows. A mean of 0/1 values (iia, match, an
accuracy) is a proportion, and its interval is the exact Clopper-Pearson one: never a single
point, so 12/12 reads [0.735, 1.0], not [1, 1]. Any other mean gets the percentile bootstrap,
computed over every resample rather than a sample of them: the distribution of the mean of
``n`` rows drawn with replacement is the ``n``-fold convolution of the rows' own
distribution, done by FFT on values rounded to :data:`GRID`. There is no resample count, no
seed and no Monte Carlo error, so the printed ends do not move with either; rounding moves a
resample's mean by at most half the grid. Two points scored on the same rows are compared by
the same exact paired bootstrap: the probability that one mean is above the other over every
resample of their shared rows (the mean of the per-row differences above 0). Plain numpy;
nothing here knows a model or a store.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy

LEVEL = 0.95
# A point is beaten when the probability that another one scores above it (paired bootstrap
# over their shared rows) reaches this; below it both ways, the two are tied.
BEATS = 0.95
# Values are rounded to this grid before their resamples are convolved: a resample's mean moves
# by at most half of it, a tenth of the last printed digit of an interval's end.
GRID = 0.001
# The most points a mean's distribution is computed on (n rows times the grid points the values
# span): a longer table rounds to a coarser grid, n * span / POINTS, whose error on a mean
# averages out over its rows.
POINTS = 1 << 20
METHOD = {"proportion": "Clopper-Pearson (exact binomial)",
          "mean": "percentile bootstrap over every resample (exact, by convolution)",
          "compared": "paired bootstrap over every resample (exact, by convolution)"}


def interval(values: Sequence[float] | numpy.ndarray) -> tuple[float, float] | None:
    """The 95 % interval of the mean of ``values`` (None: no value): Clopper-Pearson when every
    value is 0 or 1, else the exact percentile bootstrap.

    >>> [round(end, 3) for end in interval([1.0] * 12)]
    [0.735, 1.0]
    """
    array = numpy.asarray(values, dtype=numpy.float64).reshape(-1)
    if array.size == 0:
        return None
    if numpy.isin(array, (0.0, 1.0)).all():
        return proportion_interval(int(array.sum()), array.size)
    return bootstrap_interval(array)


def proportion_interval(successes: int, rows: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 95 % interval of ``successes`` of ``rows``: the lowest and
    highest success probability under which the count seen is in a 2.5 % tail."""
    tail = (1 - LEVEL) / 2
    low = 0.0 if successes == 0 else _solve(lambda p: _at_least(successes, rows, p) - tail)
    high = 1.0 if successes == rows else \
        _solve(lambda p: _at_least(successes + 1, rows, p) - (1 - tail))
    return low, high


def _at_least(successes: int, rows: int, p: float) -> float:
    """P(X >= successes) for X ~ Binomial(rows, p), each term summed from log space."""
    log_factorial = numpy.concatenate(([0.0], numpy.cumsum(numpy.log(numpy.arange(1, rows + 1)))))
    count = numpy.arange(successes, rows + 1)
    terms = (log_factorial[rows] - log_factorial[count] - log_factorial[rows - count]
             + count * math.log(p) + (rows - count) * math.log1p(-p))
    return float(numpy.exp(terms).sum())


def _solve(increasing) -> float:
    """The root in (0, 1) of a function increasing in p, by bisection to double precision."""
    low, high = 0.0, 1.0
    for _ in range(64):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if increasing(middle) < 0 else (low, middle)
    return (low + high) / 2


def bootstrap_interval(values: Sequence[float] | numpy.ndarray) -> tuple[float, float] | None:
    """The 95 % percentile-bootstrap interval of the mean of ``values`` over every resample: its
    low end the least mean with at least 2.5 % of resamples at or below it, its high end the
    greatest with at least 2.5 % at or above it (None: no value)."""
    array = numpy.asarray(values, dtype=numpy.float64).reshape(-1)
    if array.size == 0:
        return None
    origin = float(array.min())
    step = _step(array - origin)
    pmf = _mean_distribution(numpy.rint((array - origin) / step).astype(numpy.int64))
    tail = (1 - LEVEL) / 2 * (1 - 1e-9)  # the slack: FFT rounding near an exact 2.5 %
    low = int(numpy.argmax(numpy.cumsum(pmf) >= tail))
    high = len(pmf) - 1 - int(numpy.argmax(numpy.cumsum(pmf[::-1]) >= tail))
    return (origin + low * step / array.size, origin + high * step / array.size)


def _step(spread: numpy.ndarray) -> float:
    """The grid a table's values are rounded to: :data:`GRID`, or coarser so that the
    distribution of its mean has at most :data:`POINTS` points; whole numbers (the paired
    differences of two proportions) sit on a grid of 1, where nothing is rounded."""
    widest = float(numpy.abs(spread).max()) * spread.size
    if numpy.array_equal(spread, numpy.rint(spread)) and widest <= POINTS:
        return 1.0
    return max(GRID, widest / POINTS)


def _mean_distribution(codes: numpy.ndarray) -> numpy.ndarray:
    """``pmf[s]``: the probability that ``n`` draws with replacement from ``codes`` (``n``
    integers from 0) sum to ``s``: the rows' distribution convolved ``n`` times, by FFT."""
    n = codes.size
    single = numpy.bincount(codes) / n
    size = n * (single.size - 1) + 1
    length = 1 << max(size - 1, 1).bit_length()
    pmf = numpy.fft.irfft(numpy.fft.rfft(single, length) ** n, length)[:size]
    pmf = numpy.clip(pmf, 0.0, None)
    return pmf / pmf.sum()


def _above(differences: numpy.ndarray) -> tuple[float, float]:
    """(P(mean > 0), P(mean < 0)) over every resample of ``differences``; a mean within half a
    grid step of 0 is neither (identical rows are never above or below)."""
    step = _step(differences)
    codes = numpy.rint(differences / step).astype(numpy.int64)
    shift = int(codes.min())
    pmf = _mean_distribution(codes - shift)
    zero = -shift * codes.size  # the index of a sum of 0
    return float(pmf[zero + 1:].sum()), float(pmf[:max(zero, 0)].sum())


def beats(rows: Mapping[str, Mapping[str, float]], higher: bool = True
          ) -> dict[str, dict[str, float]]:
    """``P[a][b]``: the fraction of every paired resample of the rows every point scored in
    which ``a``'s mean is above ``b``'s (below, when lower is better). ``rows`` is point ->
    example id -> value; rows not every point scored are left out; none shared gives {}."""
    names = list(rows)
    shared = sorted(set.intersection(*(set(found) for found in rows.values()))) if names else []
    if len(names) < 2 or not shared:
        return {}
    columns = numpy.array([[rows[name][row] for name in names] for row in shared],
                          dtype=numpy.float64)
    columns = columns if higher else -columns
    probability: dict[str, dict[str, float]] = {name: {} for name in names}
    for i, a in enumerate(names):
        for j in range(i + 1, len(names)):
            above, below = _above(columns[:, i] - columns[:, j])
            probability[a][names[j]], probability[names[j]][a] = above, below
    return {a: {b: probability[a][b] for b in names if b != a} for a in names}


def tied_first(order: Sequence[str], probability: Mapping[str, Mapping[str, float]]
               ) -> list[str]:
    """Every point tied with the first of ``order`` (points sorted best first): those the
    first does not beat with probability :data:`BEATS`; without probabilities, the first."""
    if not order:
        return []
    leader = order[0]
    if not probability:
        return [leader]
    return [leader] + [name for name in order[1:]
                       if probability.get(leader, {}).get(name, 1.0) < BEATS]
