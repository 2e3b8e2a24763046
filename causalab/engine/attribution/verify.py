"""``verify`` on an attribute step: its estimates checked against exact patching, in the step.

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

``verify: {bound: b}`` repeats the choice in rounds of ``round`` top and ``round`` drawn
units among those still unverified until the first metric's bound is below ``b``, every
unit is verified, or ``max_units`` are (the report's ``stopped``: ``bound``, ``all``, ``cap``):
a fixed count stops where the estimate says, a tolerance where the error does.
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


def chosen(means: list[dict], count: int, verified: frozenset = frozenset(),
           budget: int | None = None,
           rng: numpy.random.Generator | None = None) -> tuple[list[int], list[int]]:
    """(the ``count`` unverified units of largest magnitude, ``count`` drawn from the rest),
    together at most ``budget``; one generator across rounds keeps the draws seeded."""
    budget = len(means) if budget is None else budget
    order = [u for u in sorted(range(len(means)), key=lambda u: -_magnitude(means[u]))
             if u not in verified]
    size = min(count, budget)
    top, rest = order[:size], sorted(order[size:])
    rng = numpy.random.default_rng(SEED) if rng is None else rng
    drawn = rng.choice(len(rest), min(count, len(rest), budget - size), replace=False)
    return top, [rest[int(i)] for i in sorted(drawn)]


def planned(node: Attribute) -> str:
    """What the step verifies, in words: ``4 units``, or ``rounds of 8 units until the bound
    is below 0.05, at most 64 units``."""
    if node.verify_bound is None:
        return f"{node.verify_round} units"
    return (f"rounds of {node.verify_round} units until the bound is below "
            f"{node.verify_bound:g}, at most {node.verify_most} units")


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
    """``{metric: {"units": [...], "bound": {...}, "ranking": [...]}}`` of the step's verified
    units, each round's passes run together by ``run_passes`` (the walk's fused sweep points).
    The first metric ranks the units and its bound stops the rounds."""
    tables = node.results["tables"]
    per_label = len(node.units)
    units = per_label * len(node.labels)
    means = {m: unit_means(t, units) for m, t in tables.items()}
    cap = node.verify_most
    rng = numpy.random.default_rng(SEED)
    exact: dict[str, dict[int, float | None]] = {m: {} for m in tables}
    picked: dict[int, str] = {}
    rounds = 0
    while True:
        top, drawn = chosen(means[node.metrics[0]], node.verify, frozenset(picked),
                            cap - len(picked), rng)
        picked.update({u: "top" for u in top} | {u: "drawn" for u in drawn})
        _patch(node, run_passes, top + drawn, means, exact)
        rounds += 1
        stop = _stop(node, _bound(means[node.metrics[0]], exact[node.metrics[0]], picked),
                     len(picked), units, cap)
        if stop is not None:
            break
    loop = {} if node.verify_bound is None else {
        "tolerance": node.verify_bound, "max_units": node.verify_cap, "rounds": rounds,
        "verified": len(picked), "stopped": stop, "judged_by": node.metrics[0]}
    return {m: _report(means[m], exact[m], picked, loop) for m in tables}


def _stop(node: Attribute, bound: dict, done: int, units: int, cap: int) -> str | None:
    """Why the rounds end (the first reason met), or None to go on; ``verify: N`` is one
    round."""
    if node.verify_bound is None:
        return "count"
    reasons = (("all", done >= units), ("bound", bound["largest_exact_bound"] < node.verify_bound),
               ("cap", done >= cap))
    return next((reason for reason, met in reasons if met), None)


def _patch(node: Attribute, run_passes: Callable[[list[Pass]], list[Any]], chosen_: list[int],
           means: dict, exact: dict) -> None:
    """Each of ``chosen_`` patched alone; its mean exact effect per metric into ``exact``."""
    per_label = len(node.units)
    places = [divmod(u, per_label) for u in chosen_]
    results = run_passes([unit_pass(node.passes[label], node.write, node.operand,
                                    node.units[k]) for label, k in places])
    for u, result in zip(chosen_, results):
        for metric in exact:
            values, eligible = result.metrics[metric]
            base = means[metric][u]["base"]
            exact[metric][u] = _mean([float(v) - base[row] for v, row
                                      in zip(values.tolist(), eligible) if row in base])


def _bound(means: list[dict], exact: dict, picked: dict[int, str]) -> dict:
    """AtP*'s diagnostic, simplified: the largest underestimate among the drawn units (every
    round's: each sampled a population the units left unverified belong to) times the largest
    magnitude left unverified."""
    left = [_magnitude(m) for u, m in enumerate(means) if u not in picked]
    under = [abs(exact[u]) / abs(means[u]["estimate"]) for u, how in picked.items()
             if how == "drawn" and exact[u] is not None and means[u]["estimate"]]
    factor = max([1.0] + under)
    largest = max(left) if left else 0.0
    return {"unverified": len(left), "largest_estimate": largest,
            "drawn_underestimate": factor, "largest_exact_bound": largest * factor}


def _report(means: list[dict], exact: dict, picked: dict[int, str], loop: dict) -> dict:
    rows = []
    for u, how in picked.items():
        estimate, truth = means[u]["estimate"], exact[u]
        ratio = estimate / truth if estimate is not None and truth else None
        rows.append({"coordinates": means[u]["coordinates"], "chosen": how,
                     "estimate": estimate, "graddrop": means[u]["graddrop"], "exact": truth,
                     "ratio": ratio})
    return {"units": rows, "bound": _bound(means, exact, picked) | loop,
            "ranking": _ranking(means, exact)}


def _ranking(means: list[dict], exact: dict) -> list[dict]:
    """Every unit by magnitude, largest first: its exact effect where verified, else its
    estimate (the ranking a reader of the step should act on)."""
    found = [{"coordinates": m["coordinates"], "effect": exact[u] if exact.get(u) is not None
              else m["estimate"], "exact": exact.get(u) is not None}
             for u, m in enumerate(means)]
    return sorted(found, key=lambda e: -abs(e["effect"]) if e["effect"] is not None
                  else math.inf)


def publish(node: Attribute, run_passes: Callable[[list[Pass]], list[Any]],
            directory: Path) -> list[str]:
    """``run``'s report into the step's results and ``<step>.verify.json``."""
    node.results["verify"] = run(node, run_passes)
    return [record.write_json(directory / f"{node.name}.verify.json", node.results["verify"],
                              root=directory)]
