"""How sure a score is: a bootstrap interval over its rows, and who beats whom over shared rows.

Every score causalab reports is a mean over rows. Its interval is the percentile bootstrap:
:data:`RESAMPLES` resamples of the rows with replacement, drawn by
``numpy.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n))``, each resample's
mean, and the 2.5th and 97.5th percentiles of those means (``numpy.percentile``'s default
linear interpolation). Two points scored on the same rows are compared by the paired
bootstrap: the same resampled rows for both, and the fraction of resamples in which one mean
is above the other. Seeded, so a rerun reports the same interval. Plain numpy; nothing here
knows a model or a store.
"""
from __future__ import annotations

import functools
from typing import Mapping, Sequence

import numpy

RESAMPLES = 1000
SEED = 0
LEVEL = 0.95
# A point is beaten when the probability that another one scores above it (paired bootstrap
# over their shared rows) reaches this; below it both ways, the two are tied.
BEATS = 0.95
_CHUNK = 4_000_000  # index entries drawn at once, so a big table stays in a few tens of MB
_KEPT = 256_000  # index entries of a table small enough to keep its draws (2 MB each)


@functools.lru_cache(maxsize=16)
def _drawn(n: int) -> numpy.ndarray:
    """The resampled rows of an ``n``-row table, drawn once a process: seeded, so every
    draw is the same, and a sweep scores hundreds of tables of one size."""
    index = numpy.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n))
    index.flags.writeable = False
    return index


def _resampled_means(columns: numpy.ndarray) -> numpy.ndarray:
    """``(RESAMPLES, k)``: each resample's mean of each of ``columns``' ``k`` columns, over the
    same resampled rows (``columns`` is ``(n, k)``)."""
    n, k = columns.shape
    if RESAMPLES * n <= _KEPT:
        return columns[_drawn(n)].mean(axis=1)
    rng = numpy.random.default_rng(SEED)
    step = max(1, _CHUNK // max(n * k, 1))
    means = []
    for start in range(0, RESAMPLES, step):
        index = rng.integers(0, n, size=(min(step, RESAMPLES - start), n))
        means.append(columns[index].mean(axis=1))
    return numpy.concatenate(means, axis=0)


def interval(values: Sequence[float] | numpy.ndarray) -> tuple[float, float] | None:
    """The 95 % percentile-bootstrap interval of the mean of ``values`` (None: no value)."""
    array = numpy.asarray(values, dtype=numpy.float64).reshape(-1)
    if array.size == 0:
        return None
    means = _resampled_means(array[:, None])[:, 0]
    tail = 100 * (1 - LEVEL) / 2
    low, high = numpy.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def beats(rows: Mapping[str, Mapping[str, float]], higher: bool = True
          ) -> dict[str, dict[str, float]]:
    """``P[a][b]``: the fraction of paired resamples of the rows every point scored in which
    ``a``'s mean is above ``b``'s (below, when lower is better). ``rows`` is point -> example
    id -> value; the rows every point scored are resampled in example-id order (rows not
    every point scored are left out; none shared gives {})."""
    names = list(rows)
    shared = sorted(set.intersection(*(set(found) for found in rows.values()))) if names else []
    if len(names) < 2 or not shared:
        return {}
    columns = numpy.array([[rows[name][row] for name in names] for row in shared],
                          dtype=numpy.float64)
    means = _resampled_means(columns if higher else -columns)
    return {a: {b: float((means[:, i] > means[:, j]).mean())
                for j, b in enumerate(names) if j != i} for i, a in enumerate(names)}


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
