"""Which of a sweep's points come first, and which of them are tied: no "best" by a hair.

Points are ordered by their main test score (``iia/test``; a loss: lowest first), ties in the
mean broken as before by the lower control, then by coordinates. Whether the first one
really beats another is the paired bootstrap over the rows both scored
(:func:`causalab.uncertainty.beats`): the rows of each point's saved table of that score,
read back from its run (a reused point's from the run it reuses). Every point the first does
not beat with probability :data:`causalab.uncertainty.BEATS` is tied for first; points with
no saved table are compared by their means alone, tied when equal. The parent gets
``ranking.json`` (order, tied first, each score's interval, every pairwise probability) and
the tags ``causalab.first`` (the labels tied for first, a JSON list) and
``causalab.first_beats`` (the probability that the first beats each other point).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from causalab import uncertainty
from causalab.files import DOCUMENT
from causalab.tracking import runs as store
from causalab.tracking import summary

FILE = "ranking.json"
FIRST = "causalab.first"
BEATS = "causalab.first_beats"  # {point: P(the first point beats it)}, a JSON object


def table_rows(mlflow, run, name: str, step: str | None,
               local: Path | None = None) -> dict[str, float] | None:
    """example id -> value of the eligible rows of the table ``run`` saved for ``name`` at
    ``step`` (None: no such table; the point's order is :func:`summary.ranked`'s). A linked
    point's files are on the run it reuses. ``local``: the folder this process uploaded the
    run's files from, their stored sizes read back (the same bytes): read there, not
    downloaded again."""
    from mlflow.exceptions import MlflowException

    from causalab.progress import mlflow_bars

    source = run.data.tags.get(store.REUSED_FROM) or run.info.run_id
    try:
        with tempfile.TemporaryDirectory(prefix="causalab-ranking-") as folder, mlflow_bars():
            def read(path: str) -> Any:
                found = Path(local, path) if local is not None else \
                    Path(mlflow.download_artifacts(source, path, folder))
                return json.loads(found.read_text(encoding="utf-8"))

            document = read(DOCUMENT)
            saves = ((document.get("steps") or {}).get(step or "") or {}).get("saves") or []
            path = next((s["file_path"] for s in saves
                         if str(s.get("value", "")).rsplit("/", 1)[-1] == name), None)
            if path is None:
                return None
            table = read(path)
    except (OSError, ValueError, KeyError, MlflowException):  # none stored: means alone
        return None
    return {str(row["example_id"]): float(row["value"]) for row in table
            if row.get("eligible") and row.get("value") is not None}


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
            "first": tied, "threshold": uncertainty.BEATS, "resamples": uncertainty.RESAMPLES,
            "seed": uncertainty.SEED, "compared": "paired bootstrap" if probability else "means",
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
