"""Pictures a run logs beside its numbers: attribution grids and attribution against exact
(docs/platform.md §5), a step's verification and faithfulness pictures.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

from causalab.plots import attribution_maps as attribution_plots, curves as plots
from causalab.plots import faithfulness as edge_plots, verification as verify_plots
from causalab.tracking import artifacts, runs as store

TAG = "causalab.attribution"
FOLDER = "attribution"
COMPARISON = "plots/attribution_vs_exact.png"


def log_grids(mlflow, run_id: str, grids: Mapping[str, Mapping[str, list]], *,
              title: str) -> dict[str, int]:
    """A point's attribute steps: their pictures, their grids and the tag; returns what was sent."""
    prefix = len(grids) > 1
    sent: dict[str, int] = {}
    for step, grid in grids.items():
        units = attribution_plots.grid_points(step, grid)
        for name, png in plots.sweep_plots(units, title=title).items():
            folder, file = name.rsplit("/", 1)
            sent.update(artifacts.log_bytes(mlflow, run_id, png,
                                            f"{folder}/{step}_{file}" if prefix else name))
        text = json.dumps({m: [[c, v] for c, v in cells] for m, cells in grid.items()})
        sent.update(artifacts.log_bytes(mlflow, run_id, text.encode(), f"{FOLDER}/{step}.json"))
    store.log_batch(mlflow, run_id, tags={TAG: json.dumps(sorted(grids))})
    return sent


def _grids(mlflow, run) -> dict[str, list]:
    """The grids an attribution run logged, merged over its steps (a metric from its last)."""
    merged: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="causalab-attribution-") as folder:
        for step in json.loads(run.data.tags[TAG]):
            local = mlflow.download_artifacts(run.info.run_id, f"{FOLDER}/{step}.json", folder)
            merged.update(json.loads(Path(local).read_text()))
    return merged


def log_comparison(mlflow, run_id: str, experiment: str, *, title: str = "") -> None:
    """On a parent: every attribution run below it against every exact point below it."""
    below = store.descendants(mlflow, experiment, run_id)
    estimated = [run for run in below if TAG in run.data.tags]
    if not estimated:
        return
    exact = [(json.loads(run.data.tags.get(store.COORDINATES) or "{}"), dict(run.data.metrics))
             for run in below if TAG not in run.data.tags]
    found: dict[str, list] = {}
    for run in estimated:
        for metric, points in attribution_plots.pairs(exact, _grids(mlflow, run)).items():
            found.setdefault(metric, []).extend(points)
    png = attribution_plots.comparison(found, title=title)
    if png is not None:
        artifacts.log_bytes(mlflow, run_id, png, COMPARISON)


def send_grids(listener: Any, run: Any, point: Any) -> None:
    """A point's attribution grids and step pictures, sent after its files (``point_end``)."""
    grids = attribution_plots.grids_of(point)
    if grids:
        listener.send(run.sending, listener.call, log_grids, run.run_id, grids, title=run.title)
    for module, name, numbers, labels in ((verify_plots, "verify", verify_plots.numbers, None),
                                          (edge_plots, "faithfulness", edge_plots.areas,
                                           edge_plots.tags)):
        reports = module.reports_of(point)
        if reports:
            listener.send(run.sending, listener.call, log_step_pictures, run.run_id, reports,
                          module.figure, name, title=run.title,
                          metrics=numbers(reports) if numbers else {},
                          tags=labels(reports) if labels else {})


def log_step_pictures(mlflow, run_id: str, reports: Mapping[str, Any], draw, name: str, *,
                      title: str, metrics: Mapping[str, float],
                      tags: Mapping[str, str] | None = None) -> dict[str, int]:
    """Each step's report drawn as ``plots/<step>_<name>.png``, with ``metrics`` (a verified
    step's bound, an edge step's faithfulness areas and MIB's scores) and ``tags`` (its curves
    below the floor); returns what was sent."""
    store.log_batch(mlflow, run_id,  # none: log_batch sends nothing
                    metrics=[store.metric(key, value) for key, value in metrics.items()],
                    tags=tags or {})
    sent: dict[str, int] = {}
    for step, report in reports.items():
        png = draw(report, title=title)
        if png is not None:
            sent.update(artifacts.log_bytes(mlflow, run_id, png, f"plots/{step}_{name}.png"))
    return sent
