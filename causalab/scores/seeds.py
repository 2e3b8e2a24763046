"""A sweep over seeds, summarised: how much a score moves with the seed alone.

When a coordinate named ``seed`` (a fit's ``steps.<fit>.seed``, a featurizer's ``seed``) is
swept, the points that differ only by it are one group: its main test score's mean, standard
deviation (``ddof=1``) and 95 % interval across the seeds (the percentile bootstrap of
:func:`causalab.uncertainty.bootstrap_interval` over the seeds' scores, which are means
even when each is 0 or 1). The parent gets ``seeds.json``
(every group), and, when there is one group, the metrics ``<score>.seeds.mean``,
``.seeds.sd``, ``.seeds.lo`` and ``.seeds.hi`` (``iia/test.seeds.mean``) beside its scores.
"""
from __future__ import annotations

import json
import statistics
from typing import Any, Sequence

from causalab import uncertainty
from causalab.scores import summary

FILE = "seeds.json"
SEED = "seed"


def groups(points: Sequence[summary.Point], swept: Sequence[str]) -> list[dict[str, Any]]:
    """Every group of points that differ only by a swept ``seed`` (none: no seed swept)."""
    seeded = [key for key in swept if summary.short(key) == SEED]
    if not seeded:
        return []
    name, test, _ = summary.main_keys(points)
    rest = [key for key in swept if key not in seeded]
    found: dict[str, dict[str, Any]] = {}
    for coordinates, metrics in points:
        score = summary.value(metrics, name, test)
        if score is None:
            continue
        at = {summary.short(k): summary.text(coordinates.get(k)) for k in rest}
        group = found.setdefault(json.dumps(at, sort_keys=True), {"at": at, "seeds": [],
                                                                  "scores": []})
        group["seeds"].append(summary.text(coordinates.get(seeded[0])))
        group["scores"].append(score)
    score_key = summary.stored_key(name, test) if test else name
    return [_summed(group, score_key) for group in found.values()]


def _summed(group: dict[str, Any], score_key: str) -> dict[str, Any]:
    scores = group["scores"]
    low, high = uncertainty.bootstrap_interval(scores)
    return {**group, "score": score_key, "n": len(scores), "mean": statistics.fmean(scores),
            "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0, "lo": low, "hi": high}


def metrics(found: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The parent's metrics of a single group (several: ``seeds.json`` alone says them)."""
    if len(found) != 1:
        return {}
    group = found[0]
    return {f"{group['score']}.seeds.{part}": float(group[part])
            for part in ("mean", "sd", "lo", "hi")}


def line(found: Sequence[dict[str, Any]]) -> str:
    """``across seeds: k=4: iia/test 0.667 ± 0.118 [0.50, 0.83] (3 seeds)``, one per group."""
    parts = []
    for group in found:
        at = ",".join(f"{k}={v}" for k, v in group["at"].items())
        parts.append(f"{at + ': ' if at else ''}{group['score']} {group['mean']:.3f} ± "
                     f"{group['sd']:.3f} [{group['lo']:.2f}, {group['hi']:.2f}] "
                     f"({group['n']} seeds)")
    return "across seeds: " + "; ".join(parts) if parts else ""
