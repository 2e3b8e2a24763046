"""An attribute step's ``verify`` (docs/format.md §9.7) in MLflow: estimate against exact.

The step's report (``results["verify"]`` of its plan node, plain data; its JSON is the
step's ``<step>.verify.json``, uploaded with the point's files) is drawn per metric as
``plots/<step>_verify.png``: each verified unit's exact effect (x) against its estimate (y),
the top-ranked units and the drawn ones marked apart, the diagonal dashed, and the bound on
the unverified units in the panel title. Knows no engine: it reads plan results.
"""
from __future__ import annotations

from typing import Any, Mapping

from causalab.plots import curves as plots

# chosen -> (marker, label) of the verified units it names.
MARKS = {"top": ("o", "top by estimate"), "drawn": ("s", "drawn from the rest")}


def reports_of(point: Any) -> dict[str, dict]:
    """``{<step>: {metric: report}}`` of every attribute step of a point that verified."""
    found = {}
    for node in getattr(point, "children", ()) or ():
        report = (getattr(node, "results", None) or {}).get("verify")
        if report and hasattr(node, "passes"):
            found[node.name] = report
    return found


# The bound's fields a run logs as metrics: (report key, MLflow name under <step>/<metric>/).
NUMBERS = (("largest_exact_bound", "verify_bound"), ("tolerance", "verify_tolerance"),
           ("verified", "verify_units"), ("rounds", "verify_rounds"))


def numbers(reports: Mapping[str, Mapping[str, dict]]) -> dict[str, float]:
    """``<step>/<metric>/verify_bound`` of each verified step, and with a tolerance the
    tolerance, the units verified and the rounds: what a sweep compares."""
    return {f"{step}/{metric}/{name}": report["bound"][key]
            for step, per_metric in reports.items() for metric, report in per_metric.items()
            for key, name in NUMBERS if report["bound"].get(key) is not None}


def figure(reports: Mapping[str, dict], *, title: str = "") -> bytes | None:
    """One scatter per metric of the verified units; None when none has an exact effect."""
    from matplotlib.figure import Figure

    shown = {m: r for m, r in reports.items()
             if any(u["exact"] is not None and u["estimate"] is not None for u in r["units"])}
    if not shown:
        return None
    canvas = Figure(figsize=(4.6 * len(shown) + 0.6, 4.4), layout="constrained")
    grid = canvas.subplots(1, len(shown), squeeze=False)
    for column, (metric, report) in enumerate(shown.items()):
        axes, ends = grid[0][column], []
        for chosen, (marker, label) in MARKS.items():
            units = [u for u in report["units"] if u["chosen"] == chosen
                     and u["exact"] is not None and u["estimate"] is not None]
            xs, ys = [u["exact"] for u in units], [u["estimate"] for u in units]
            ends += xs + ys
            axes.plot(xs, ys, marker, markersize=5, alpha=0.8, label=label)
        axes.plot([min(ends), max(ends)], [min(ends), max(ends)], "--", color="grey",
                  linewidth=1)
        axes.set_xlabel(f"exact patching effect: {metric}")
        axes.set_ylabel(f"estimated effect: {metric}")
        bound = report["bound"]
        stated = (f" (tolerance {bound['tolerance']:.3g}, stopped: {bound['stopped']})"
                  if "tolerance" in bound else "")
        axes.set_title(f"{bound['unverified']} unverified: |exact| <= "
                       f"{bound['largest_exact_bound']:.3g}{stated}", fontsize="medium")
        axes.legend(fontsize="small")
        axes.grid(alpha=0.3)
    canvas.suptitle(title or "verified units: attribution against exact patching")
    return plots.png(canvas)
