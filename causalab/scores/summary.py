"""What a sweep's parent run says first: its points' scores as quantities, their order and a
small HTML table.

A point's stored metrics (``iia/test``, ``iia/control``, ``n/iia/test``, ``train/loss``,
``eval/iia``) are read here as *quantities* (``iia``) measured by *steps* (``test``,
``control``); a point that only fits is read by the final value of its fit's series
(``eval/iia`` is ``iia`` measured by ``eval``). The main quantity is ``iia`` where a point has
one, else the first scored; its test step is ``test`` (else the first step that is not a
control) and its control ``control`` (else ``random``). Plain data in, plain data out; this
module knows no runs and no MLflow client (the view that opens a sweep in MLflow's UI is
:mod:`causalab.tracking.landing`).
"""
from __future__ import annotations

import html
import json
import math
from typing import Any, Mapping, Sequence

from causalab.document.sweep import shown
from causalab.scores.naming import (BOUNDS, CONTROLS, COUNT, MAIN, SERIES, bound_keys,
                                      is_score, split_score)

INTERVAL = ("[lo, hi]: 95 % interval over the rows: Clopper-Pearson for a proportion (iia, "
            "match), the exact percentile bootstrap for any other mean")

Point = tuple[Mapping[str, Any], Mapping[str, float]]  # (coordinates, metrics)
FIRST = "first"  # a parent's coordinates of the one point first (``first/k``)
TABLE = "summary.html"
MAX_COLUMNS = 8


def fit_finals(metrics: Mapping[str, float]) -> dict[tuple[str, str], float]:
    """(quantity, step) of each fit series' final value: ``eval/iia`` -> (``iia``, ``eval``),
    ``das/train/loss`` -> (``loss``, ``das train``)."""
    found = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if parts[0] == COUNT or len(parts) not in (2, 3):
            continue
        series, name = parts[-2], parts[-1]
        if series in SERIES:
            step = series if len(parts) == 2 else f"{parts[0]} {series}"
            found[(name, step)] = value
    return found


def scores(metrics: Mapping[str, float]) -> dict[tuple[str, str], float]:
    """(quantity, step) -> value of a point: its final scores, else its fit's final values."""
    found = {split_score(k): v for k, v in metrics.items() if is_score(k)}
    return found or fit_finals(metrics)


def quantities(points: Sequence[Point]) -> dict[str, list[str]]:
    """Quantity -> the steps measuring it, main quantity first, each test step before its
    control; a loss comes last (it is what a fit minimised, not what it found)."""
    found: dict[str, list[str]] = {}
    for _, metrics in points:
        for name, step in scores(metrics):
            if step not in found.setdefault(name, []):
                found[name].append(step)
    order = sorted(found, key=lambda name: (name != MAIN, name == "loss"))
    return {name: sorted(found[name], key=_step_order) for name in order}


def _step_order(step: str) -> tuple:
    return (step in CONTROLS, step != "test")


def main_keys(points: Sequence[Point]) -> tuple[str, str | None, str | None]:
    """(quantity, test step, control step) a sweep is ranked by; steps None when absent."""
    found = quantities(points)
    if not found:
        return MAIN, None, None
    name, steps = next(iter(found.items()))
    tests = [s for s in steps if s not in CONTROLS]
    controls = [s for s in CONTROLS if s in steps]
    return name, (tests or [None])[0], (controls or [None])[0]


def value(metrics: Mapping[str, float], name: str, step: str | None) -> float | None:
    found = scores(metrics).get((name, step)) if step else None
    return found if found is not None and math.isfinite(found) else None


def bounds(metrics: Mapping[str, float], name: str, step: str | None
           ) -> tuple[float, float] | None:
    """The 95 % interval a point logged beside a score (``iia/test.lo``, ``.hi``), if any."""
    if not step:
        return None
    found = [metrics.get(key) for key in bound_keys(stored_key(name, step))]
    return None if None in found else (float(found[0]), float(found[1]))


def ranked(points: Sequence[Point]) -> list[int]:
    """The indices of the scored points by their main test score, highest first (a loss:
    lowest); equal means go to the point whose control scores lower, then to the first by
    its coordinates, so the order does not hang on which of a multirun's jobs stored its
    runs first. Whether the first really beats the next is :mod:`causalab.scores.ranking`'s."""
    name, test, control = main_keys(points)
    sign = 1 if name == "loss" else -1
    scored = []
    for index, (coordinates, metrics) in enumerate(points):
        score = value(metrics, name, test)
        if score is not None:
            against = value(metrics, name, control) if control else None
            place = json.dumps(coordinates, sort_keys=True, default=str)
            scored.append(((sign * score, sign * -(against or 0.0), place), index))
    return [index for _, index in sorted(scored)]


def best(points: Sequence[Point]) -> int | None:
    """The index of the first point of :func:`ranked` (None: no point is scored)."""
    found = ranked(points)
    return found[0] if found else None


def label(coordinates: Mapping[str, Any], swept: Sequence[str]) -> str:
    """``k=16`` or ``model=causalab:weekday-gpt2,k=16``: a point by what was swept."""
    return ",".join(f"{short(k)}={text(coordinates.get(k))}" for k in swept) or "point"


def short(key: str) -> str:
    """``site.layer`` -> ``layer``, ``featurizers.rot.k`` -> ``k``: a coordinate's last word."""
    return key.rsplit(".", 1)[-1]


def plain(value: Any) -> Any:
    """A coordinate value as a label shows it: a one-element list is its element, a position
    its index, a string of digits its integer."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, Mapping) and "index" in value:
        value = value["index"]
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def text(value: Any) -> str:
    """A coordinate value as a picture or table labels it: as the command line prints it
    (:func:`causalab.document.sweep.shown`: ``16``, ``das``, ``[0,1,2,3]``), but a long list
    as its ends (``[0,…,63] (64)``) and a swept site by its values (``block_output,1``)."""
    value = plain(value)
    if isinstance(value, Mapping):
        return ",".join(text(v) for v in value.values())
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"[{text(value[0])},…,{text(value[-1])}] ({len(value)})"
    return shown(value)


def numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parent_metrics(points: Sequence[Point], swept: Sequence[str],
                   first: Sequence[int] | None = None) -> dict[str, float]:
    """A sweep parent's own metrics: the first point's main test and control scores and their
    intervals under the points' keys (``iia/test``, ``iia/test.lo``, ``iia/control``) and,
    when no other point is tied with it (``first``: the indices tied first), its numeric
    coordinates (``first/k``)."""
    first = list(first) if first is not None else [i for i in [best(points)] if i is not None]
    if not first:
        return {}
    coordinates, metrics = points[first[0]]
    name, test, control = main_keys(points)
    found = {}
    for step in (test, control):
        score = value(metrics, name, step)
        if score is not None:
            found[stored_key(name, step)] = score
            found.update(zip(bound_keys(stored_key(name, step)), bounds(metrics, name, step) or ()))
    for key in swept if len(first) == 1 else ():
        number = plain(coordinates.get(key))
        if numeric(number):
            found[f"{FIRST}/{short(key)}"] = float(number)
    return found


def stored_key(name: str, step: str) -> str:
    """The stored key of a quantity's step: a score (``iia/test``) or a fit's series
    (``eval/iia``)."""
    if step in SERIES:
        return f"{step}/{name}"
    if " " in step:
        fit, series = step.split(" ", 1)
        return f"{fit}/{series}/{name}"
    return f"{name}/{step}"


def table_columns(points: Sequence[Point]) -> list[tuple[str, str]]:
    """(quantity, step) columns of the summary table: every step of the main quantity, then
    the test step of each other quantity, at most :data:`MAX_COLUMNS`."""
    found = quantities(points)
    columns = []
    for index, (name, steps) in enumerate(found.items()):
        columns += [(name, step) for step in (steps if index == 0 else steps[:1])]
    return columns[:MAX_COLUMNS]


def html_table(points: Sequence[Point], swept: Sequence[str], *, title: str = "",
               names: Sequence[str] = (), first: Sequence[int] | None = None,
               note: str = "") -> str:
    """The sweep as one small HTML page: a row per point (its run name, what was swept, the
    scores with their intervals), every point tied first in bold, ``note`` saying so."""
    columns = table_columns(points)
    first = set(first if first is not None else [i for i in [best(points)] if i is not None])
    head = ["point", *[short(k) for k in swept], *[stored_key(n, s) for n, s in columns]]
    rows = []
    for index, (coordinates, metrics) in enumerate(points):
        name = names[index] if index < len(names) else label(coordinates, swept)
        cells = [name, *[text(coordinates.get(k)) for k in swept]]
        cells += [_number(value(metrics, n, s), bounds(metrics, n, s)) for n, s in columns]
        style = ' style="font-weight:bold"' if index in first else ""
        rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                    + "</tr>")
    caption = html.escape(title or "sweep")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    note = f"<p>{html.escape(note)}</p>" if note else ""
    return (f"<!doctype html><meta charset=\"utf-8\"><title>{caption}</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style>"
            f"<h3>{caption}</h3>{note}<table><tr>{header}</tr>{''.join(rows)}</table>"
            f"<p>{INTERVAL}</p>")


def shown_score(metrics: Mapping[str, float], key: str) -> str:
    """A stored score as a run prints it, its interval beside it when the run logged one."""
    name, step = split_score(key)
    return _number(metrics[key], bounds(metrics, name, step))


def _number(found: float | None, interval: tuple[float, float] | None = None) -> str:
    """A score as the run printed it: ``0.667 [0.42, 0.92]`` (its 95 % interval, when kept)."""
    if found is None:
        return ""
    return f"{found:.3f}" + ("" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]")


def description(metrics: Mapping[str, float], *, title: str = "") -> str:
    """A point run's description, in Markdown (MLflow shows a run's description at the top of
    its page, its first lines before "Show more"): the main score with its 95 % interval
    beside its control, in bold, and its row count, on the first line; then each other
    quantity's scores the same way; then ``title`` (the model and site). Rounded as the run
    prints them (``0.667 [0.42, 0.92]``); empty for a point without a score."""
    lines = []
    for name, steps in quantities([({}, metrics)]).items():
        control = next((step for step in steps if step in CONTROLS), None)
        for test in [step for step in steps if step not in CONTROLS] or [None]:
            shown = [_scored(metrics, name, step, bold=not lines) for step in (test, control)
                     if step]
            line = " · control ".join(shown) if test else f"control {shown[0]}"
            rows = metrics.get(f"{COUNT}/{stored_key(name, test)}") if test and not lines \
                else None
            lines.append(line + (f" · {int(rows)} rows" if rows is not None and
                                 math.isfinite(rows) else ""))
    if not lines:
        return ""
    notes = [markdown(title)] if title else []
    if any(key.endswith(BOUNDS) for key in metrics):
        notes.append(markdown(INTERVAL))
    parts = [lines[0], "\n".join(f"- {line}" for line in lines[1:]),
             "  \n".join(f"*{note}*" for note in notes)]
    return "\n\n".join(part for part in parts if part)


def _scored(metrics: Mapping[str, float], name: str, step: str, bold: bool) -> str:
    key, number = markdown(stored_key(name, step)), _number(value(metrics, name, step))
    interval = bounds(metrics, name, step)
    shown = f"**{key} {number or 'none'}**" if bold else f"{key} {number or 'none'}"
    return shown + ("" if interval is None or not number else
                    f" [{interval[0]:.2f}, {interval[1]:.2f}]")


def markdown(text: str) -> str:
    """``text`` read as itself in Markdown: ``logit_diff`` not half in italics."""
    for mark in ("\\", "_", "*", "`"):
        text = text.replace(mark, "\\" + mark)
    return text
