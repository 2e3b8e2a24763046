"""An edge step's faithfulness (docs/format.md §9.7) in MLflow: the curve, its area, MIB's scores.

The step's report (``results["edges"]`` of its plan node, plain data; its JSON files are the
step's ``<step>.faithfulness.json`` and ``.edges.json``, uploaded with the point's files) is
drawn per metric as ``plots/<step>_faithfulness.png`` (normalised faithfulness against the
circuit's size in edges, 0 the counterfactual's metric and 1 the base's; MIB's signed ranking
dashed beside the ``|score|`` curve). Each curve's area is logged as the metric
``<step>/<metric>/faithfulness_area``, MIB's scores as ``<step>/<metric>/cpr`` and ``.../cmd``.
A curve whose gap ``m(base) − m(cf)`` is below the floor is drawn hatched, says so in its
legend, and its run gets the tag ``causalab.below_floor`` (the JSON list of
``<step>/<metric>``). Knows no engine.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from causalab.plots import curves as plots

TAG = "causalab.below_floor"
HATCH = "////"


def reports_of(point: Any) -> dict[str, dict]:
    """``{<step>: {metric: report}}`` of every edge step of a point."""
    found = {}
    for node in getattr(point, "children", ()) or ():
        report = (getattr(node, "results", None) or {}).get("edges")
        if report and hasattr(node, "passes"):
            found[node.name] = report
    return found


def _below(curve: Mapping) -> bool:
    return bool((curve.get("floor") or {}).get("below"))


def _label(metric: str, curve: Mapping) -> str:
    numbers = [f"{name} {curve[key]:.3f}" if curve.get(key) is not None else f"{name} -"
               for name, key in (("area", "area"),)]
    scores = curve.get("mib") or {}
    numbers += [f"{name.upper()} {scores[name]:.3f}" for name in ("cpr", "cmd")
                if scores.get(name) is not None]
    text = f"{metric} ({', '.join(numbers)})"
    if _below(curve):
        text += f"\ngap below floor: {curve['floor']['why']}"
    return text


def canvas(reports: Mapping[str, dict], *, title: str = ""):
    """The figure itself (a matplotlib ``Figure``): one curve per metric."""
    from matplotlib.figure import Figure

    figure_ = Figure(figsize=(5.6, 4.3), layout="constrained")
    axes = figure_.subplots()
    for metric, report in reports.items():
        curve = report["curve"]
        if None in curve["faithfulness"]:  # no gap at all: nothing to draw
            axes.plot([], [], "o-", label=_label(metric, curve) + " (no gap: undefined)")
            continue
        line, = axes.plot(curve["ks"], curve["faithfulness"], "o-", markersize=4,
                          label=_label(metric, curve))
        signed = (curve.get("mib") or {}).get("signed")
        if signed and None not in signed["faithfulness"]:
            axes.plot(curve["mib"]["ks"], signed["faithfulness"], "--", color=line.get_color(),
                      linewidth=1, alpha=0.7)
        if _below(curve):
            axes.fill_between(curve["ks"], 0.0, curve["faithfulness"], hatch=HATCH,
                              facecolor="none", edgecolor=line.get_color(), linewidth=0)
    axes.set_xscale("symlog", linthresh=1)  # circuits of tens of edges among thousands
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.axhline(0.0, color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel(f"edges in the circuit (of {next(iter(reports.values()))['edges']}; "
                    "dashed: ranked by signed score)")
    axes.set_ylabel("faithfulness: (m(circuit) - m(cf)) / (m(base) - m(cf))")
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    figure_.suptitle(title or "circuit faithfulness: top-k edges kept, the rest patched")
    return figure_


def figure(reports: Mapping[str, dict], *, title: str = "") -> bytes:
    """``canvas`` as PNG bytes."""
    return plots.png(canvas(reports, title=title))


def areas(reports: Mapping[str, Mapping[str, dict]]) -> dict[str, float]:
    """``<step>/<metric>/faithfulness_area``, ``/cpr`` and ``/cmd`` of each edge step's curve:
    the numbers a sweep compares (none where a gap of 0 leaves them undefined)."""
    found = {}
    for step, per_metric in reports.items():
        for metric, report in per_metric.items():
            curve = report["curve"]
            scores = curve.get("mib") or {}
            for name, value in (("faithfulness_area", curve["area"]),
                                ("cpr", scores.get("cpr")), ("cmd", scores.get("cmd"))):
                if value is not None:
                    found[f"{step}/{metric}/{name}"] = value
    return found


def tags(reports: Mapping[str, Mapping[str, dict]]) -> dict[str, str]:
    """``causalab.below_floor``: the ``<step>/<metric>`` whose gap is below the floor."""
    below = [f"{step}/{metric}" for step, per_metric in reports.items()
             for metric, report in per_metric.items() if _below(report["curve"])]
    return {TAG: json.dumps(below)} if below else {}
