"""Which of a sweep's points come first, and which of them are tied: no "best" by a hair.

Points are ordered by their main test score (``iia/test``; a loss: lowest first), ties in the
mean broken as before by the lower control, then by coordinates. Whether the first one
really beats another is the exact paired bootstrap over the rows both scored (every
resample, :func:`causalab.uncertainty.beats`, the same one its intervals use): the rows of each point's saved table of that score,
read back from its run (a reused point's from the run it reuses,
:func:`causalab.tracking.landing.table_rows`). Every point the first does
not beat with probability :data:`causalab.uncertainty.BEATS` is tied for first; points with
no saved table are compared by their means alone, tied when equal. The parent gets
``ranking.json`` (order, tied first, each score's interval, every pairwise probability) and
the tags ``causalab.first`` (the labels tied for first, a JSON list) and
``causalab.first_beats`` (the probability that the first beats each other point).
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from causalab import uncertainty
from causalab.scores import summary

FILE = "ranking.json"
FIRST = "causalab.first"
BEATS = "causalab.first_beats"  # {point: P(the first point beats it)}, a JSON object


def rank(points: Sequence[summary.Point], swept: Sequence[str],
         rows: Sequence[Mapping[str, float] | None]) -> dict[str, Any]:
    """The ranking of ``points`` (``rows[i]``: point i's rows of the main score, or None)."""
    name, test, _ = summary.main_keys(points)
    ordered = summary.ranked(points)
    labels = [summary.label(points[i][0], swept) for i in ordered]
    found = {labels[k]: rows[i] for k, i in enumerate(ordered) if i < len(rows) and rows[i]}
    probability = uncertainty.beats(found, higher=name != "loss") if len(found) == len(ordered) \
        else {}
    if probability:
        tied = uncertainty.tied_first(labels, probability)
    else:
        means = [summary.value(points[i][1], name, test) for i in ordered]
        tied = [label for label, mean in zip(labels, means) if means and mean == means[0]]
    return {"score": summary.stored_key(name, test) if test else name, "order": labels,
            "first": tied, "threshold": uncertainty.BEATS,
            "method": uncertainty.METHOD["compared"] if probability else "means",
            "compared": "paired bootstrap" if probability else "means",
            "intervals": {labels[k]: _interval(points[i][1], name, test)
                          for k, i in enumerate(ordered)},
            "beats": probability, "indices": [ordered[labels.index(t)] for t in tied]}


def _interval(metrics: Mapping[str, float], name: str, test: str | None) -> list | None:
    score = summary.value(metrics, name, test)
    ends = summary.bounds(metrics, name, test)
    return None if score is None else [score, *(ends or (None, None))]


def line(ranking: Mapping[str, Any]) -> str:
    """``first on iia/test: k=16`` or ``tied first on iia/test (P(beats) < 0.95): a, b``."""
    first = ranking.get("first") or []
    if len(first) <= 1:
        return f"first on {ranking['score']}: {', '.join(first)}"
    how = (f"P(beats) < {ranking['threshold']:g}" if ranking["compared"] == "paired bootstrap"
           else "equal means")
    return f"tied first on {ranking['score']} ({how}): {', '.join(first)}"


def record(ranking: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
    """``ranking.json``'s bytes and the parent's tags (who is tied first; how likely the
    first beats each other point)."""
    shown = {k: v for k, v in ranking.items() if k != "indices"}
    text = json.dumps(shown, indent=1, sort_keys=True)
    leader = (ranking.get("order") or [None])[0]
    against = {k: round(v, 3) for k, v in (ranking.get("beats") or {}).get(leader, {}).items()}
    return text.encode(), {FIRST: json.dumps(ranking["first"]),
                           **({BEATS: json.dumps(against)} if against else {})}
