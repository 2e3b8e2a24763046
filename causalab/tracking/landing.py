"""A sweep's parent run as a reader lands on it: plots, its own summary metrics, a table, a view.

At a sweep's end the parent's points are read back from the store, so the parent shows what
was stored whoever logged it (a point run, a link to a reused one, a job on another host); its
ranking, seeds summary and table are docs/format.md §7.10's. Every call goes through the client
it is given. The view is MLflow 3.17's saved view of a runs page: an experiment tag
``mlflow.sharedViewState.<key>`` that the address's ``viewStateShareKey=<key>`` opens, with
the points as the table's rows and their scores as charts. The parent's description (the
Markdown MLflow shows at the top of its page) shows its plots, whose bands are the scores'
95 % intervals: MLflow 3.17's charts draw none.
"""
from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import quote

from causalab.files import DOCUMENT
from causalab.plots import curves as plots
from causalab.progress import mlflow_bars
from causalab.scores import ranking, seeds, summary
from causalab.scores.summary import (MAX_COLUMNS, Point, main_keys, numeric, plain, quantities,
                                     short, stored_key)
from causalab.tracking import runs as store
from causalab.tracking.artifacts import log_bytes

VIEW_TAG = "mlflow.sharedViewState."
VIEW_KEY = "viewStateShareKey"


def stored_points(mlflow, experiment: str, parent: str) -> list:
    """The point runs below ``parent`` (a multirun's below its jobs too), oldest first."""
    found = []
    for child in store.children(mlflow, experiment, parent):
        if child.data.tags.get(store.KIND) == "sweep":
            found += store.children(mlflow, experiment, child.info.run_id)
        else:
            found.append(child)
    points = [run for run in found if run.data.tags.get(store.KIND) == "point"]
    return sorted(points, key=lambda run: (run.info.start_time or 0, run.info.run_id))


def coordinates_of(run) -> dict[str, Any]:
    """A point's place: its job's overrides, then its coordinates (``model`` as its key)."""
    tags = run.data.tags
    place = json.loads(tags.get(store.OVERRIDES) or "{}")
    place.update(json.loads(tags.get(store.COORDINATES) or "{}"))
    if "model" in place and tags.get(store.MODEL_KEY):
        place["model"] = tags[store.MODEL_KEY]
    return place


def table_rows(mlflow, run, name: str, step: str | None,
               local: Path | None = None) -> dict[str, float] | None:
    """example id -> value of the eligible rows of the table ``run`` (or the run it links to)
    saved for ``name`` at ``step``; None when there is none. ``local``: the folder this
    process uploaded the run's files from, read there rather than downloaded again."""
    from mlflow.exceptions import MlflowException

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


def land(mlflow, run_id: str, *, title: str = "", folder: str | None = None,
         local: dict[str, Path] | None = None) -> dict:
    """Give the parent ``run_id`` its plots, summary metrics, ranking, table and view, from its
    points as stored; the plots go into ``folder`` too. ``local``: as :func:`table_rows`, by
    run id. Returns ``{"view": key or None, "points": n, "first": the ranking's line or None,
    "runs": the point runs' ids, "pictures": the files written into folder}``."""
    parent = mlflow.get_run(run_id)
    experiment = parent.info.experiment_id
    runs = stored_points(mlflow, experiment, run_id)
    scored = [run for run in runs if summary.scores(run.data.metrics)]
    if not scored:
        return {"view": None, "points": 0, "first": None}
    points = [(coordinates_of(run), dict(run.data.metrics)) for run in scored]
    title = plots.title_from_params([run.data.params for run in runs]) or title
    pictures, drawn = [], {}
    for name, png in plots.sweep_plots(points, title=title).items():
        log_bytes(mlflow, run_id, png, name)
        drawn[name] = png_width(png)
        if folder:
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / name).write_bytes(png)
            pictures.append(str(Path(folder) / name))
    swept = plots.varied([c for c, _ in points])
    ranked, across, tags = _judged(mlflow, run_id, scored, points, swept, local or {})
    now = int(time.time() * 1000)
    numbers = summary.parent_metrics(points, swept, ranked["indices"]) | seeds.metrics(across)
    note = " · ".join(filter(None, [ranking.line(ranked), seeds.line(across)]))
    tags = {**tags, store.NOTE: description(experiment, run_id, len(points), drawn,
                                            note)}
    store.log_batch(mlflow, run_id, tags=tags,
                    metrics=[store.metric(k, v, 0, now) for k, v in numbers.items()])
    page = summary.html_table(points, swept, title=title or parent.info.run_name,
                              names=[run.info.run_name or "" for run in scored],
                              first=ranked["indices"], note=note)
    log_bytes(mlflow, run_id, page.encode(), summary.TABLE)
    search = points_filter(run_id, [run.info.run_id for run in runs],
                           [run.data.tags.get(store.PARENT) for run in runs])
    view = view_state(points, swept, name=f"{parent.info.run_name or 'sweep'} "
                                          f"({len(points)} points)", created_ms=now,
                      search=search, step_axis=step_axis_of(scored))
    mlflow.set_experiment_tag(experiment, f"{VIEW_TAG}{run_id}", view)
    return {"view": run_id, "points": len(points), "runs": [run.info.run_id for run in runs],
            "first": ranking.line(ranked) if ranked["first"] else None, "pictures": pictures}


def _judged(mlflow, run_id: str, runs: list, points: list, swept: list,
            local: dict[str, Path]) -> tuple:
    """The parent's ranking and its summary across seeds, logged: ``(ranking, seed groups,
    the ranking's tags)``; ``runs[i]`` is ``points[i]``'s run."""
    name, test, _ = summary.main_keys(points)
    ranked = ranking.rank(points, swept, [table_rows(mlflow, run, name, test,
                                                     local.get(run.info.run_id))
                                          for run in runs])
    body, tags = ranking.record(ranked)
    log_bytes(mlflow, run_id, body, ranking.FILE)
    across = seeds.groups(points, swept)
    if across:
        log_bytes(mlflow, run_id, json.dumps(across, indent=1).encode(), seeds.FILE)
    return ranked, across, tags


def description(experiment: str, run_id: str, count: int, pictures: Mapping[str, int],
                note: str = "") -> str:
    """The parent's description, in Markdown: how many points, where each one's scores and
    intervals are, its plots (name -> width in pixels; their bands are the scores' 95 %
    intervals), drawn in place where one fits the description's column at 1280x800
    (MLflow's Markdown keeps an image's own size), else linked, then ``note`` (its ranking)."""
    page = f"#/experiments/{experiment}/runs/{run_id}/artifacts"
    lines = [f"**{count} points** · each point's scores and 95 % intervals: "
             f"[{summary.TABLE}]({page}/{summary.TABLE})"]
    wide = [name for name, width in pictures.items() if width > IN_PLACE_PX]
    lines += [f"[![{name}](get-artifact?path={quote(name)}&run_uuid={run_id})]({page}/{name})"
              for name, width in pictures.items() if width <= IN_PLACE_PX]
    if wide:
        lines.append("plots (95 % intervals as bands): " +
                     ", ".join(f"[{name}]({page}/{name})" for name in wide))
    if note:
        lines.append(summary.markdown(note))
    return "\n\n".join(lines)


IN_PLACE_PX = 640  # the widest picture a run page's description shows whole at 1280x800


def png_width(png: bytes) -> int:
    """A PNG's width in pixels, from its header (0 when it is none)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        return 0
    return int.from_bytes(png[16:20], "big")


def step_axis_of(runs: Sequence) -> str | None:
    """The coordinate every run logged its scores against as MLflow's step
    (:func:`causalab.tracking.points.step_axis`), when they all name the same one."""
    found = {run.data.tags.get(store.STEP_AXIS) for run in runs}
    return found.pop() if len(found) == 1 else None


def landed(mlflow, experiment: str, parent: str) -> dict | None:
    """``{"view": key, "runs": point ids}`` of a parent :func:`land` gave a view, else None."""
    tags = mlflow.get_experiment(experiment).tags
    if f"{VIEW_TAG}{parent}" not in tags:
        return None
    return {"view": parent, "runs": [run.info.run_id for run in
                                     stored_points(mlflow, experiment, parent)]}


def newest_landed(mlflow, parent: str | None = None) -> tuple[str, str, list] | None:
    """(experiment id, parent id, point ids) of ``parent``, else of the newest landed one."""
    if parent is None:
        keyed = [key[len(VIEW_TAG):] for experiment in mlflow.search_experiments()
                 for key in experiment.tags if key.startswith(VIEW_TAG)]
        if not keyed:
            return None
        parent = max(keyed, key=lambda run_id: mlflow.get_run(run_id).info.start_time or 0)
    run = store.found_run(mlflow, parent)  # None: no such run in this store
    found = None if run is None else landed(mlflow, run.info.experiment_id, parent)
    return None if found is None else (run.info.experiment_id, parent, found["runs"])


def view_params(swept: Sequence[str]) -> list[str]:
    """The point runs' param keys of the swept coordinates (``k``; a model by ``model``, the
    name its job was given, not its long key)."""
    params = [short(k) for k in swept if short(k) != "model"]
    return ["model", *params] if any(short(k) == "model" for k in swept) else params


def view_charts(points: Sequence[Point], swept: Sequence[str],
                step_axis: str | None = None) -> tuple[list[dict], list[dict]]:
    """(charts, sections) of the saved view: the main test score and its control, each
    against the swept coordinate the points logged their scores at as MLflow's step
    (``step_axis``: a line chart, whose x axis MLflow can draw on a log scale, a log grid's
    so, and whose y range can be set, a fraction's 0 to 1), else against the first numeric
    swept coordinate (a scatter), else bars by point."""
    name, test, control = main_keys(points)
    scored = [stored_key(name, step) for step in (test, control) if step]
    section = "causalab-sweep"
    shown_runs = max(100, len(points))  # MLflow's chart cards plot at most this many runs
    if charted(swept, step_axis):
        charts = _line_charts(points, scored, name, test, control, step_axis)
    else:
        axis = next((short(k) for k in swept if short(k) != "model" and
                     all(numeric(plain(c.get(k))) for c, _ in points)), None)
        charts = [{"type": "SCATTER", "xaxis": {"key": axis, "type": "PARAM"},
                   "yaxis": {"key": key, "type": "METRIC"}} if axis else
                  {"type": "BAR", "metricKey": key, "displayName": key} for key in scored]
    charts = [{**chart, "uuid": f"{section}-{index}", "metricSectionId": section,
               "runsCountToCompare": shown_runs, "deleted": False, "isGenerated": False}
              for index, chart in enumerate(charts)]
    params = view_params(swept)
    title = "sweep: " + ", ".join(params) if params else "sweep"
    sections = [{"uuid": section, "name": title, "display": True, "isReordered": False,
                 "columns": 2, "cardHeight": CARD_HEIGHT}]
    return charts, sections


def charted(swept: Sequence[str], step_axis: str | None) -> bool:
    """Whether the points' scores are drawn against ``step_axis`` as MLflow's step: one of
    the swept coordinates."""
    return step_axis is not None and step_axis in [short(k) for k in swept] + list(swept)


def groups(swept: Sequence[str], step_axis: str | None) -> dict | None:
    """MLflow's grouping of the runs table and charts by the swept params besides the step
    axis (a multirun's ``model``): each group's points are one line across the axis, in the
    charts' legend by its value (``gpt2``), and a heading of rows in the table; None when
    nothing else was swept."""
    if not charted(swept, step_axis):
        return None
    keys = [key for key in view_params(swept) if key != short(step_axis)]
    return {"aggregateFunction": "average",
            "groupByKeys": [{"mode": "param", "groupByData": key} for key in keys]} \
        if keys else None


# Two charts a row, this tall: both in view below the runs page's header at 1280x800.
CARD_HEIGHT = 400


def _line_charts(points: Sequence[Point], keys: Sequence[str], name: str, test: str | None,
                 control: str | None, axis: str) -> list[dict]:
    """A line chart per key against MLflow's step (the points' ``axis``), one dot a point:
    on a log x axis for a log grid, both on one y range (0 to 1 for a fraction)."""
    values = [plain(c.get(axis)) for c, _ in points]
    found = [summary.value(m, name, step) for _, m in points for step in (test, control) if step]
    fraction = plots.bounds(name, [v for v in found if v is not None])
    log = plots.log_axis(axis, values)
    chart = {"type": "LINE", "xAxisKey": "step", "useGlobalXaxisKey": False,
             "xAxisScaleType": "log" if log else "linear", "scaleType": "linear",
             "lineSmoothness": 0, "useGlobalLineSmoothing": False, "displayPoints": True}
    # A little beyond the ends, so a dot there is drawn whole; a log range in decades.
    chart["range"] = {"xMin": math.log10(min(values) / 1.5),
                      "xMax": math.log10(max(values) * 1.5)} if log else {}
    if fraction is not None:
        chart["range"].update(yMin=fraction[0] - 0.05, yMax=fraction[1] + 0.05)
    return [{**chart, "metricKey": key, "selectedMetricKeys": [key]} for key in keys]


def points_filter(parent: str, run_ids: Sequence[str], parents: Sequence[str]) -> str:
    """The runs-table search that shows a sweep's points alone: its children, or by id when
    some have another parent (``parents``: a multirun's jobs)."""
    if run_ids and set(parents) != {parent}:
        return "attributes.run_id IN (" + ", ".join(f"'{r}'" for r in run_ids) + ")"
    return f"tags.`mlflow.parentRunId` = '{parent}'"


def view_state(points: Sequence[Point], swept: Sequence[str], *, name: str,
               created_ms: int, search: str = "", step_axis: str | None = None) -> str:
    """The experiment tag value of a saved runs-page view (MLflow 3.17's envelope, the state
    a JSON string). Its columns: the swept params, then at most ``MAX_COLUMNS`` scores, each
    test step beside its control. The state holds the table's ``search`` (oldest point
    first), so the points are the rows it opens on (MLflow leaves a saved view's
    ``runsExpanded`` out, so a parent cannot open expanded). The run list stays beside the
    charts: folding it (``runListHidden``) would also drop the table's count of runs. Runs
    that differ in more than the step axis are grouped by the rest (:func:`groups`)."""
    steps = [(name, step) for name, found in quantities(points).items() for step in found]
    columns = [f"params.`{k}`" for k in view_params(swept)] + \
        [f"metrics.`{stored_key(n, s)}`" for n, s in steps[:MAX_COLUMNS]]
    charts, sections = view_charts(points, swept, step_axis)
    state = {"selectedColumns": columns, "columnOrder": columns, "runsHiddenMode": "SHOW_ALL",
             "runListHidden": False, "viewMaximized": False, "compareRunCharts": charts,
             "compareRunSections": sections, "isAccordionReordered": True}
    if search:
        state.update(searchFilter=search, orderByKey="attributes.created", orderByAsc=True)
    grouping = groups(swept, step_axis)
    if grouping:
        state["groupBy"] = grouping
    return json.dumps({"name": name, "createdAt": created_ms, "updatedAt": created_ms,
                       "state": json.dumps(state)})


def where(base: str, experiment_id: str, view: str, run_ids: Sequence[str]) -> list[str]:
    """The lines that open a landed sweep at ``base``: its saved view, and that view's charts
    for more than one point (MLflow's compare page shows every param before any metric)."""
    page = (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?{VIEW_KEY}={view}&workflowType=machine_learning")
    lines = [f"open the sweep: {page}"]
    if len(run_ids) > 1:
        lines.append(f"compare its points: {page}&compareRunsMode=CHART")
    return lines
