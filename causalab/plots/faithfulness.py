"""An edge step's faithfulness (docs/format.md §9.7) in MLflow: the curve and its area.

The step's report (``results["edges"]`` of its plan node, plain data; its JSON files are the
step's ``<step>.faithfulness.json`` and ``.edges.json``, uploaded with the point's files) is
drawn per metric as ``plots/<step>_faithfulness.png`` (normalised faithfulness against the
circuit's size in edges, 0 the counterfactual's metric and 1 the base's), and each curve's
area is logged as the metric ``<step>/<metric>/faithfulness_area``. Knows no engine.
"""
from __future__ import annotations

import time
from typing import Any, Mapping

from causalab.plots import curves as plots


def reports_of(point: Any) -> dict[str, dict]:
    """``{<step>: {metric: report}}`` of every edge step of a point."""
    found = {}
    for node in getattr(point, "children", ()) or ():
        report = (getattr(node, "results", None) or {}).get("edges")
        if report and hasattr(node, "passes"):
            found[node.name] = report
    return found


def figure(reports: Mapping[str, dict], *, title: str = "") -> bytes:
    """One curve per metric: faithfulness against the number of edges kept."""
    from matplotlib.figure import Figure

    canvas = Figure(figsize=(5.2, 4.0), layout="constrained")
    axes = canvas.subplots()
    for metric, report in reports.items():
        curve = report["curve"]
        axes.plot(curve["ks"], curve["faithfulness"], "o-", markersize=4,
                  label=f"{metric} (area {curve['area']:.3f})")
    axes.set_xscale("symlog", linthresh=1)  # circuits of tens of edges among thousands
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.axhline(0.0, color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel(f"edges in the circuit (of {next(iter(reports.values()))['edges']})")
    axes.set_ylabel("faithfulness: (m(circuit) - m(cf)) / (m(base) - m(cf))")
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    canvas.suptitle(title or "circuit faithfulness: top-k edges kept, the rest patched")
    return plots.png(canvas)


def log_reports(mlflow, run_id: str, reports: Mapping[str, Mapping[str, dict]], *,
                title: str) -> dict[str, int]:
    """Each edge step's plot and areas on its run; returns what was sent."""
    from causalab.tracking import artifacts
    from causalab.tracking import runs as store

    sent: dict[str, int] = {}
    now = int(time.time() * 1000)
    areas = [store.metric(f"{step}/{metric}/faithfulness_area", report["curve"]["area"], 0, now)
             for step, per_metric in reports.items() for metric, report in per_metric.items()]
    store.log_batch(mlflow, run_id, metrics=areas)
    for step, report in reports.items():
        png = figure(report, title=title)
        sent.update(artifacts.log_bytes(mlflow, run_id, png, f"plots/{step}_faithfulness.png"))
    return sent
