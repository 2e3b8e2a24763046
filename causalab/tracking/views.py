"""The MLflow view that opens a sweep: its points as the runs table's rows, its scores as charts.

MLflow 3.17's saved view of an experiment's runs page is an experiment tag
``mlflow.sharedViewState.<key>`` that the address's ``viewStateShareKey=<key>`` opens: which
columns the runs table shows and, in the page's chart view (``compareRunsMode=CHART``, the
compare address), which charts come first: each main score against the swept coordinate,
then all swept params and both scores as parallel coordinates. Built from a sweep's points as
plain data (:mod:`causalab.scores.summary`); the parent's landing sets the tag
(:mod:`causalab.tracking.landing`).
"""
from __future__ import annotations

import json
from typing import Sequence

from causalab.scores.summary import (MAX_COLUMNS, Point, main_keys, numeric, plain, quantities,
                                     short, stored_key)

VIEW_TAG = "mlflow.sharedViewState."
VIEW_KEY = "viewStateShareKey"


def view_params(swept: Sequence[str]) -> list[str]:
    """The point runs' param keys of the swept coordinates (``k``; a model by ``model.key``)."""
    params = [short(k) for k in swept if short(k) != "model"]
    return ["model.key", *params] if any(short(k) == "model" for k in swept) else params


def view_columns(points: Sequence[Point], swept: Sequence[str]) -> list[str]:
    """The runs table's columns for this sweep: its swept params, then each quantity's
    scores, every test step beside its control (main quantity first, at most
    :data:`~causalab.scores.summary.MAX_COLUMNS`)."""
    steps = [(name, step) for name, found in quantities(points).items() for step in found]
    return [f"params.`{k}`" for k in view_params(swept)] + \
        [f"metrics.`{stored_key(n, s)}`" for n, s in steps[:MAX_COLUMNS]]


def view_charts(points: Sequence[Point], swept: Sequence[str]) -> tuple[list[dict], list[dict]]:
    """(charts, sections) of the saved view's chart view: one section first, two charts a
    row, that reads the sweep at a glance: the main test score and its control each against
    the first swept coordinate whose values are all numbers (a scatter; bars by point when
    none is), then the swept params and both scores as parallel coordinates. MLflow 3.17
    adds its own sections (a chart per metric, by prefix) after it."""
    name, test, control = main_keys(points)
    scored = [stored_key(name, step) for step in (test, control) if step]
    params = view_params(swept)
    axis = next((short(k) for k in swept if short(k) != "model" and
                 all(numeric(plain(c.get(k))) for c, _ in points)), None)
    section = "causalab-sweep"
    shown_runs = max(100, len(points))  # MLflow's chart cards plot at most this many runs
    charts: list[dict] = []
    for key in scored:
        if axis:
            chart = {"type": "SCATTER", "xaxis": {"key": axis, "type": "PARAM"},
                     "yaxis": {"key": key, "type": "METRIC"}}
        else:
            chart = {"type": "BAR", "metricKey": key, "displayName": key}
        charts.append(chart)
    if len(params) + len(scored) >= 2:  # MLflow draws parallel coordinates from two axes
        charts.append({"type": "PARALLEL", "selectedParams": params, "selectedMetrics": scored,
                       "showAllRuns": False})
    charts = [{**chart, "uuid": f"{section}-{index}", "metricSectionId": section,
               "runsCountToCompare": shown_runs, "deleted": False, "isGenerated": False}
              for index, chart in enumerate(charts)]
    title = "sweep: " + ", ".join(params) if params else "sweep"
    sections = [{"uuid": section, "name": title, "display": True, "isReordered": False,
                 "columns": 2, "cardHeight": 360}]
    return charts, sections


def points_filter(parent: str, run_ids: Sequence[str], parents: Sequence[str]) -> str:
    """The runs-table search that shows a sweep's points and nothing else: its children
    (``parents`` are the points' own parents), or, when some are a job's children (a
    multirun's), the points by their ids."""
    if run_ids and set(parents) != {parent}:
        return "attributes.run_id IN (" + ", ".join(f"'{r}'" for r in run_ids) + ")"
    return f"tags.`mlflow.parentRunId` = '{parent}'"


def view_state(points: Sequence[Point], swept: Sequence[str], *, name: str,
               created_ms: int, search: str = "") -> str:
    """The experiment tag value of a saved runs-page view (MLflow 3.17's envelope: ``name``,
    ``createdAt``, ``updatedAt`` and the view's state as a JSON string). The state holds the
    table's search too (``search``, oldest point first), so the points are the rows it opens
    on; MLflow leaves a saved view's ``runsExpanded`` out, so a parent cannot open expanded.
    Its chart view (:func:`view_charts`) opens on the sweep's own section; the run list stays
    beside it (folding it, ``runListHidden``, would also drop the table's count of runs)."""
    columns = view_columns(points, swept)
    charts, sections = view_charts(points, swept)
    state = {"selectedColumns": columns, "columnOrder": columns, "runsHiddenMode": "SHOW_ALL",
             "runListHidden": False, "viewMaximized": False, "compareRunCharts": charts,
             "compareRunSections": sections, "isAccordionReordered": True}
    if search:
        state.update(searchFilter=search, orderByKey="attributes.created", orderByAsc=True)
    return json.dumps({"name": name, "createdAt": created_ms, "updatedAt": created_ms,
                       "state": json.dumps(state)})


def view_address(base: str, experiment_id: str, key: str) -> str:
    """The runs page of ``experiment_id`` opened on the saved view ``key``."""
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?{VIEW_KEY}={key}&workflowType=machine_learning")


def compare_address(base: str, experiment_id: str, key: str) -> str:
    """The same runs page and saved view in its chart view: the sweep's charts first
    (:func:`view_charts`), the scores against what was swept. MLflow's compare page
    (``#/compare-runs``) cannot be told what to show first: it lists every param before any
    metric, and its plot starts on one metric."""
    return f"{view_address(base, experiment_id, key)}&compareRunsMode=CHART"


def where(base: str, experiment_id: str, view: str, run_ids: Sequence[str]) -> list[str]:
    """The lines that open a landed sweep in the UI at ``base``: the runs page on its saved
    view and, for more than one point, that view's charts."""
    lines = [f"open the sweep: {view_address(base, experiment_id, view)}"]
    if len(run_ids) > 1:
        lines.append(f"compare its points: {compare_address(base, experiment_id, view)}")
    return lines
