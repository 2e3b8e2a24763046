"""``verify: N`` on an attribute step: its estimates checked against exact patching, in the step.

The ``N`` units with the largest estimated magnitude, plus ``N`` drawn (seeded, ``SEED``)
from the rest, are each patched exactly: the step's own interchange pass with its write and
operand moved to the unit alone, run by the walk's ``run_pass`` (the traces an exact sweep
point of that unit runs). Per verified unit: the mean estimated effect over eligible rows,
the mean exact effect (patched metric minus the base's), and their ratio.

The bound on what the unverified units can hide (AtP*'s diagnostic, simplified): the drawn
units are a sample of the unverified population, so the largest factor by which attribution
underestimated one of them, ``max(1, max |exact| / |estimate|)``, times the largest
estimated magnitude left unverified, bounds the largest exact magnitude left unverified, as
far as the sample speaks for the rest. The magnitude a unit is ranked by is ``|effect|``,
or with GradDrop ``max(|effect|, Σ_l |ĉ_l| / (L − 1))``, each ``ĉ_l`` the unit's mean over
rows (AtP*'s use of GradDrop: a unit whose gradients cancel is still found).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import numpy

from causalab.compile.plan import Address, Attribute, Pass
from causalab.engine import record

SEED = 0


def _mean(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def unit_means(table: list[dict], units: int) -> list[dict]:
    """Per unit in table order: its coordinates, mean effect, mean GradDrop magnitude, and
    per row its base metric (``value − effect``)."""
    rows = len(table) // units
    found = []
    for u in range(units):
        cut = table[u * rows:(u + 1) * rows]
        found.append({"coordinates": cut[0]["coordinates"],
                      "estimate": _mean([e["effect"] for e in cut]),
                      "graddrop": _graddrop(cut),
                      "base": {j: e["value"] - e["effect"] for j, e in enumerate(cut)
                               if e["eligible"]}})
    return found


def _graddrop(cut: list[dict]) -> float | None:
    """AtP*'s combination of one unit's GradDrop estimates, each first averaged over rows:
    ``Σ_l |mean ĉ_l| / (L − 1)``; None without GradDrop."""
    per_row = [e["graddrop_layers"] for e in cut if e.get("graddrop_layers") is not None]
    if not per_row:
        return None
    means = [sum(column) / len(per_row) for column in zip(*per_row)]
    return sum(abs(m) for m in means) / max(len(means) - 1, 1)


def _magnitude(unit: dict) -> float:
    estimate = abs(unit["estimate"]) if unit["estimate"] is not None else -math.inf
    return max(estimate, unit["graddrop"] or -math.inf)


def chosen(means: list[dict], count: int) -> tuple[list[int], list[int]]:
    """(the ``count`` units of largest magnitude, ``count`` drawn from the rest)."""
    order = sorted(range(len(means)), key=lambda u: -_magnitude(means[u]))
    top, rest = order[:count], sorted(order[count:])
    drawn = numpy.random.default_rng(SEED).choice(len(rest), min(count, len(rest)),
                                                  replace=False)
    return top, [rest[int(i)] for i in sorted(drawn)]


def unit_pass(pass_: Pass, write: str, operand: str, address: Address) -> Pass:
    """The interchange with its write and operand at ``address``: one unit patched alone."""
    forwards = tuple(dataclasses.replace(
        forward,
        writes=tuple(dataclasses.replace(w, address=address) if w.name == write else w
                     for w in forward.writes),
        reads=tuple(dataclasses.replace(r, address=address) if r.name == operand else r
                    for r in forward.reads)) for forward in pass_.forwards)
    return dataclasses.replace(pass_, forwards=forwards, results={})


def run(node: Attribute, run_passes: Callable[[list[Pass]], list[Any]]) -> dict:
    """``{metric: {"units": [...], "bound": {...}}}`` of the step's verified units, their
    passes run together by ``run_passes`` (the walk's fused sweep points)."""
    tables = node.results["tables"]
    per_label = len(node.units)
    units = per_label * len(node.labels)
    means = {m: unit_means(t, units) for m, t in tables.items()}
    top, drawn = chosen(means[node.metrics[0]], node.verify)
    places = [divmod(u, per_label) for u in top + drawn]
    results = run_passes([unit_pass(node.passes[label], node.write, node.operand,
                                    node.units[k]) for label, k in places])
    exact: dict[str, dict[int, float | None]] = {m: {} for m in tables}
    for u, result in zip(top + drawn, results):
        for metric in tables:
            values, eligible = result.metrics[metric]
            base = means[metric][u]["base"]
            exact[metric][u] = _mean([float(v) - base[row] for v, row
                                      in zip(values.tolist(), eligible) if row in base])
    return {m: _report(means[m], exact[m], top, drawn) for m in tables}


def _report(means: list[dict], exact: dict, top: list[int], drawn: list[int]) -> dict:
    rows = []
    for rank, u in enumerate(top + drawn):
        estimate, truth = means[u]["estimate"], exact[u]
        ratio = estimate / truth if estimate is not None and truth else None
        rows.append({"coordinates": means[u]["coordinates"], "chosen":
                     "top" if rank < len(top) else "drawn", "estimate": estimate,
                     "graddrop": means[u]["graddrop"], "exact": truth, "ratio": ratio})
    verified = set(top + drawn)
    left = [_magnitude(m) for u, m in enumerate(means) if u not in verified]
    under = [abs(exact[u]) / abs(means[u]["estimate"]) for u in drawn
             if exact[u] is not None and means[u]["estimate"]]
    factor = max([1.0] + under)
    largest = max(left) if left else 0.0
    return {"units": rows, "bound": {"unverified": len(left), "largest_estimate": largest,
                                     "drawn_underestimate": factor,
                                     "largest_exact_bound": largest * factor}}


def publish(node: Attribute, run_passes: Callable[[list[Pass]], list[Any]],
            directory: Path) -> list[str]:
    """``run``'s report into the step's results and ``<step>.verify.json``."""
    node.results["verify"] = run(node, run_passes)
    return [record.write_json(directory / f"{node.name}.verify.json", node.results["verify"],
                              root=directory)]
