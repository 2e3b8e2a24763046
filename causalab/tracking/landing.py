"""A sweep's parent run as a reader lands on it: plots, its own summary metrics, a table, a view.

At a sweep's end (a document sweep, or a Hydra multirun, whose jobs may be sweeps of their
own) the parent's points are read back from the store, with every metric's last value, so
the parent shows what was stored whoever logged it (a point run, a link to a reused one, a
job on another host). The parent then gets the sweep's plots, the first point's main scores
as its own metrics (``iia/test``, its interval, ``iia/control``; ``first/k`` when no point is
tied with it), its ranking (``ranking.json``, tag ``causalab.first``: every point tied for
first, :mod:`causalab.scores.ranking`), across swept seeds each score's mean, sd and
interval (``seeds.json``, :mod:`causalab.scores.seeds`), ``summary.html`` (a row per point)
and a saved view of the experiment's runs page that lists the points (searched by their
parent, or by their ids when a multirun's jobs hold them) with the swept params and those
scores as columns (:func:`causalab.tracking.views.view_address` opens it). Every call goes
through the client it is given.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from causalab.files import DOCUMENT
from causalab.plots import curves as plots
from causalab.scores import ranking, seeds, summary
from causalab.tracking import runs as store, views
from causalab.tracking.artifacts import log_bytes


def stored_points(mlflow, experiment: str, parent: str) -> list:
    """The point runs below ``parent`` (its children, and the children of a child that is a
    sweep: a multirun's job), in the order they started."""
    found = []
    for child in store.children(mlflow, experiment, parent):
        if child.data.tags.get(store.KIND) == "sweep":
            found += store.children(mlflow, experiment, child.info.run_id)
        else:
            found.append(child)
    points = [run for run in found if run.data.tags.get(store.KIND) == "point"]
    return sorted(points, key=lambda run: (run.info.start_time or 0, run.info.run_id))


def coordinates_of(run) -> dict[str, Any]:
    """A point's place: its job's overrides, then its document coordinates; a ``model``
    override shown as the model key it chose."""
    tags = run.data.tags
    place = json.loads(tags.get(store.OVERRIDES) or "{}")
    place.update(json.loads(tags.get(store.COORDINATES) or "{}"))
    if "model" in place and tags.get(store.MODEL_KEY):
        place["model"] = tags[store.MODEL_KEY]
    return place


def table_rows(mlflow, run, name: str, step: str | None,
               local: Path | None = None) -> dict[str, float] | None:
    """example id -> value of the eligible rows of the table ``run`` saved for ``name`` at
    ``step`` (None: no such table; the point's order is
    :func:`causalab.scores.summary.ranked`'s). A linked point's files are on the run it
    reuses. ``local``: the folder this process uploaded the run's files from, their stored
    sizes read back (the same bytes): read there, not downloaded again."""
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


def land(mlflow, run_id: str, points: list | None = None, *, title: str = "",
         folder: str | None = None, local: dict[str, Path] | None = None) -> dict:
    """Give the parent ``run_id`` its plots, summary metrics, ranking, table and view, from
    its points as stored (``points``, ``(coordinates, metrics)`` pairs, only when the store
    has none); the plots go into ``folder`` too (a multirun's sweep folder). ``local``: run
    id -> the folder this process uploaded that point's files from, read back as stored
    (the ranking reads its tables there). Returns what was
    made: ``{"view": key or None, "points": n, "first": the ranking's line or None, "runs":
    the point runs' ids, "pictures": the files written into folder}``."""
    parent = mlflow.get_run(run_id)
    experiment = parent.info.experiment_id
    runs = stored_points(mlflow, experiment, run_id)
    if runs:
        points = [(coordinates_of(run), dict(run.data.metrics)) for run in runs]
        title = plots.title_from_params([run.data.params for run in runs]) or title
    kept = [index for index, (_, m) in enumerate(points or []) if summary.scores(m)]
    points = [points[index] for index in kept]
    if not points:
        return {"view": None, "points": 0, "first": None}
    pictures = []
    for name, png in plots.sweep_plots(points, title=title).items():
        log_bytes(mlflow, run_id, png, name)
        if folder:
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / name).write_bytes(png)
            pictures.append(str(Path(folder) / name))
    swept = plots.varied([c for c, _ in points])
    ranked, across, tags = _judged(mlflow, run_id, [runs[i] for i in kept] if runs else [],
                                   points, swept, local or {})
    now = int(time.time() * 1000)
    numbers = summary.parent_metrics(points, swept, ranked["indices"]) | seeds.metrics(across)
    store.log_batch(mlflow, run_id, metrics=[store.metric(k, v, 0, now) for k, v in numbers.items()],
                    tags=tags)
    page = summary.html_table(points, swept, title=title or parent.info.run_name,
                              first=ranked["indices"],
                              note=" · ".join(filter(None, [ranking.line(ranked),
                                                            seeds.line(across)])))
    log_bytes(mlflow, run_id, page.encode(), summary.TABLE)
    search = views.points_filter(run_id, [run.info.run_id for run in runs],
                                 [run.data.tags.get(store.PARENT) for run in runs])
    view = views.view_state(points, swept, name=f"{parent.info.run_name or 'sweep'} "
                                                f"({len(points)} points)", created_ms=now,
                            search=search)
    mlflow.set_experiment_tag(experiment, f"{views.VIEW_TAG}{run_id}", view)
    return {"view": run_id, "points": len(points), "runs": [run.info.run_id for run in runs],
            "first": ranking.line(ranked) if ranked["first"] else None, "pictures": pictures}


def _judged(mlflow, run_id: str, runs: list, points: list, swept: list,
            local: dict[str, Path]) -> tuple:
    """The parent's ranking (``ranking.json``) and its summary across seeds (``seeds.json``),
    logged: ``(ranking, seed groups, the ranking's tags)``. ``runs[i]`` is ``points[i]``'s run
    (none: points without a store, ranked by their means)."""
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


def landed(mlflow, experiment: str, parent: str) -> dict | None:
    """``{"view": key, "runs": point ids}`` of a parent :func:`land` gave a view, else None."""
    tags = mlflow.get_experiment(experiment).tags
    if f"{views.VIEW_TAG}{parent}" not in tags:
        return None
    return {"view": parent, "runs": [run.info.run_id for run in
                                     stored_points(mlflow, experiment, parent)]}


def newest_landed(mlflow, parent: str | None = None) -> tuple[str, str, list] | None:
    """(experiment id, parent id, point ids) of ``parent``, else of the newest parent
    :func:`land` gave a view in any experiment; None when there is none."""
    if parent is not None:
        run = store.found_run(mlflow, parent)
        if run is None:  # no such run in this store
            return None
        experiment = run.info.experiment_id
        found = landed(mlflow, experiment, parent)
        return None if found is None else (experiment, parent, found["runs"])
    keyed = [(experiment.experiment_id, key[len(views.VIEW_TAG):])
             for experiment in mlflow.search_experiments()
             for key in experiment.tags if key.startswith(views.VIEW_TAG)]
    if not keyed:
        return None
    started = {run_id: mlflow.get_run(run_id).info.start_time or 0 for _, run_id in keyed}
    experiment, newest = max(keyed, key=lambda pair: started[pair[1]])
    return newest_landed(mlflow, newest)
