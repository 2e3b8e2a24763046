"""Attribution patching: every unit of a site set scored from one forward of each role and one
backward per metric (docs/format.md §9.7).

For a unit ``u`` (a layer's site, one of its heads or one feature, at one position label) and
a row, the estimate of the metric with only ``u`` patched from the counterfactual is

    value = metric(base) + effect,  effect = Σ_u (a_cf − a_base) · ∂metric/∂a

(Nanda 2023; Kramár et al. 2024, "AtP"). The gradient is taken at the base run; with
``steps = n > 1`` it is averaged over ``n`` forwards whose input embeddings lie on the straight
line from the base prompt's to the counterfactual's, at ``α = k/n`` for ``k = 0 … n−1``
(integrated gradients as EAP-IG takes it: ``steps: 1`` is plain AtP). AtP*'s corrections, when
the step asks for them, are ``causalab.engine.attribution.atp_star``'s: the QK fix replaces a query or key
unit's estimate, GradDrop adds per-layer estimates and their combination to the table.

This module never opens a trace and plans none: the planner's ``attribute_stages`` says which
traces run, the walk runs them, and ``keep`` takes each one's values and gradients before the
next runs. Positions come from the interchange's compiled passes, resolved by ``windows``;
tensors are cut by the seam's one ``gather``. Shapes: ``rows`` of a window of the pass, ``w``
positions, ``d`` the site's width, ``units`` per address.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from causalab.compile.plan import Address, Attribute, MetricOp, Pass
from causalab.document.vocab import ATTRIBUTION_UNITS
from causalab.engine import record
from causalab.engine.attribution import atp_star
from causalab.engine import windows as window_rules
from causalab.engine.trace_jobs import Stage, Traced, TraceJob
from causalab.engine.metrics import score
from causalab.engine.seam import Window, gather
from causalab.engine.state import PassContext, Windows
from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from transformers import PreTrainedTokenizerBase


@dataclasses.dataclass
class Sums:
    """An attribute step's running state: its node, the windows of every position label's
    pass, and for the window of rows being run the counterfactual's site values, the base's,
    the embeddings' two ends, the base scores and the summed gradients; ``parts`` holds each
    finished window's effects and scores."""

    node: Attribute
    windows: list[Windows]
    counterfactual: dict = dataclasses.field(default_factory=dict)
    base: dict = dataclasses.field(default_factory=dict)
    ends: tuple = ()
    scores: dict = dataclasses.field(default_factory=dict)
    grads: dict = dataclasses.field(default_factory=dict)
    runs: int = 0
    parts: list = dataclasses.field(default_factory=list)
    aux: dict = dataclasses.field(default_factory=dict)
    drops: list = dataclasses.field(default_factory=list)
    dropped: list = dataclasses.field(default_factory=lambda: [None])
    scales: list = dataclasses.field(default_factory=list)


def estimand(metric: MetricOp, node: Attribute) -> str:
    """``logit_diff/v1 atp``, ``… atp+qk`` or ``… ig-8``: the metric's estimand, estimated."""
    method = "atp" if node.steps == 1 else f"ig-{node.steps}"
    return f"{metric.estimand_version} {method}{'+qk' if node.patterns else ''}"


def open_step(ctx: PassContext, node: Attribute,
              tokenizer: PreTrainedTokenizerBase) -> PassContext:
    """The step's first pass, opened, carrying its ``Sums``; every label's windows resolved
    with ``tokenizer`` (and refused, R1/R2) before any trace runs."""
    windows = [ctx.windows] + [window_rules.resolve_pass(pass_, tokenizer, ctx.state)
                               for pass_ in node.passes[1:]]
    return dataclasses.replace(ctx, attributed=Sums(node, windows))


def interpolated(ctx: PassContext, step: int) -> torch.Tensor:
    """The embeddings ``step/steps`` of the way from the base prompt's to the counterfactual's."""
    sums = ctx.attributed
    start, end = sums.ends
    return start + (step / sums.node.steps) * (end - start)


def keep(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    """One attribute trace kept: the counterfactual's site values, or a base forward's scores
    and gradients (summed over integrated gradients' steps); the window's effects once its
    last forward has run."""
    sums, job, done = units[0].attributed, stage.jobs[0], traced[0]
    taps = list(zip(job.taps, done.values))
    embeddings = [value for tap, value in taps if tap.kind == "read" and tap.whole
                  and tap.op.index < 0]
    if not job.grad:
        sums.counterfactual = {tap.op.index: value for tap, value in taps if tap.whole}
        sums.ends, sums.runs, sums.grads = tuple(embeddings), 0, {}
        return
    roles = {}
    for tap, value in taps:
        roles.setdefault(getattr(tap.op, "role", None), []).append(value)
    shifts = {tap.op.index: value for tap, value in taps
              if tap.kind == "shift" and tap.op.role == "site"}
    head = next(value for tap, value in taps if tap.kind == "read" and not tap.whole)
    with torch.enable_grad():  # the metrics read one read (V29)
        scores = _scores(sums, job.rows, head)
        leaves = [shifts[i][1] for i in range(len(sums.node.addresses))]
        leaves += [leaf for _, leaf in roles.get("pattern", [])]
        gates = len(sums.node.gates) // 2
        grads = _gradients(scores, leaves, retain=gates > 0)
        sums.drops = [_dropped(sums, scores, leaves, layer, gates) for layer in range(gates)]
    if sums.runs == 0:
        sums.base = {i: value for i, (value, _) in shifts.items()}
        sums.ends = tuple(embeddings) + sums.ends
        sums.scores, sums.grads = scores, grads
        sums.aux = {role: roles.get(role, []) for role in ("partner", "scores")}
        sums.scales = [atp_star.scaling(units[0].model, a.layer) for a in sums.node.partners]
    else:
        sums.grads = {m: [g + h for g, h in zip(sums.grads[m], grads[m])] for m in grads}
    sums.runs += 1
    if sums.runs == sums.node.steps:
        _close_window(sums, job)


def _scores(sums: Sums, chunk: tuple, head: torch.Tensor) -> dict:
    """Per metric ``(values (eligible,), eligible pass rows)`` of one base forward."""
    found = {}
    for metric in sums.node.passes[0].metrics:
        if metric.name in sums.node.metrics:
            windows = sums.windows[0].read(metric.of).windows
            found[metric.name] = score(metric, head, [row for row in chunk if windows[row]])
    return found


def _dropped(sums: Sums, scores: dict, leaves: list, layer: int, layers: int) -> dict:
    """GradDrop's gradients for ``layer``: its attention and MLP outputs pass none back."""
    sums.dropped[0] = layer
    try:
        return _gradients(scores, leaves, retain=layer < layers - 1)
    finally:
        sums.dropped[0] = None


def _gradients(scores: dict, shifts: list, retain: bool = False) -> dict:
    """``∂ Σ_rows metric / ∂ site`` at every address, per metric, one backward each;
    ``retain``: the graph kept for more backward passes (GradDrop's)."""
    names = list(scores)
    grads = {}
    for j, name in enumerate(names):
        total = scores[name][0].sum()
        grads[name] = torch.autograd.grad(total, shifts,
                                          retain_graph=retain or j < len(names) - 1,
                                          allow_unused=True)
        grads[name] = [torch.zeros_like(s) if g is None else g
                       for g, s in zip(grads[name], shifts)]
    return grads


def _close_window(sums: Sums, job: TraceJob) -> None:
    """A window's effects per metric and label (and per GradDrop layer), kept with its
    scores; its tensors let go."""
    sums.parts.append({"effects": _effects(sums, job, sums.grads), "scores": sums.scores,
                       "drops": [_effects(sums, job, grads) for grads in sums.drops]})
    sums.counterfactual, sums.base, sums.ends, sums.grads, sums.scores = {}, {}, (), {}, {}
    sums.aux, sums.drops = {}, []


def _effects(sums: Sums, job: TraceJob, grads: dict) -> dict:
    """``{metric: [(rows, units) per position label]}`` from the gradients of each leaf."""
    effects = {}
    for metric, per_site in grads.items():
        mean = [g / sums.node.steps for g in per_site]
        effects[metric] = [_label_effects(sums, pass_, windows, job.rows, mean)
                           for pass_, windows in zip(sums.node.passes, sums.windows)]
    return effects


def _per_row(value: torch.Tensor, window: Window) -> torch.Tensor:
    """``(rows, w, d)`` or flat ``(total, d)`` summed over each row's positions: ``(rows, d)``."""
    if window.width is not None:
        return value.sum(1)
    out = value.new_zeros((window.rows, value.shape[-1]))
    return out.index_add_(0, window.batch_rows.to(value.device), value)


def _units(value: torch.Tensor, address: Address, unit: str) -> torch.Tensor:
    """``(rows, d)`` summed into ``(rows, units)``: the site whole, each head, each feature."""
    if unit == "site":
        return value.sum(-1, keepdim=True)
    if unit == "head":
        return value.reshape(value.shape[0], len(address.heads), -1).sum(-1)
    return value


def _label_effects(sums: Sums, pass_: Pass, windows: Windows, chunk: tuple,
                   grads: list) -> torch.Tensor:
    """``(rows, units)`` over every address of one position label, addresses side by side."""
    node = sums.node
    write = next(w for fw in pass_.forwards for w in fw.writes if w.name == node.write)
    read = next(r for fw in pass_.forwards for r in fw.reads if r.name == node.operand)
    ragged = write.pos.ragged or read.pos.ragged
    at_base = window_rules.layout(windows.write(write.name, node.base).windows, chunk, ragged)
    at_cf = window_rules.layout(windows.read(read.name).windows, chunk, ragged)
    if (at_base.width is None) != (at_cf.width is None) or at_base.counts != at_cf.counts:
        raise RunError(("interventions", pass_.intervention, "writes", write.name, "operand"),
                       "the operand and the write cover different positions on some row")
    out = []
    for i, address in enumerate(node.addresses):
        if node.patterns:
            out.append(_qk_fixed(sums, i, grads[len(node.addresses) + i], at_cf, at_base))
            continue
        delta = (gather(sums.counterfactual[i], address, at_cf)
                 - gather(sums.base[i], address, at_base)).float()
        gradient = gather(grads[i], address, at_base).float()
        out.append(_units(_per_row(delta * gradient, at_base), address, node.unit))
    return torch.cat(out, -1)


def _qk_fixed(sums: Sums, i: int, grad: torch.Tensor, at_cf: Window,
              at_base: Window) -> torch.Tensor:
    """``(rows, heads)`` of address ``i``: the QK fix's estimate, its selected heads."""
    address = sums.node.addresses[i]
    tensors = {"cf": sums.counterfactual[i], "base": sums.base[i], "grad": grad,
               "partner": sums.aux["partner"][i], "scores": sums.aux["scores"][i]}
    every = atp_star.qk_effects(address.component, tensors, at_cf, at_base, sums.scales[i])
    return every[:, list(address.heads)].float()


def _coordinates(node: Attribute) -> list[dict]:
    """Each unit's coordinates in table order, named as a sweep of the same field is labelled."""
    name = ATTRIBUTION_UNITS[node.unit]["coordinate"]
    each = []
    for label in node.labels:
        for layer, address in zip(node.layers, node.addresses):
            place = {} if layer is None else {"layers": layer}
            if label is not None:
                place["pos"] = label
            if node.unit == "site":
                each.append(place)
                continue
            indices = address.heads if node.unit == "head" else (
                address.units or tuple(range(address.width)))
            each += [{**place, name: int(u)} for u in indices]
    return each


def _table(node: Attribute, metric: MetricOp, effects: torch.Tensor, base: dict,
           positions: list, digest: str) -> list[dict]:
    """One object per (unit, row), excluded rows included, as docs/format.md §13 lays a table."""
    coordinates = _coordinates(node)
    pass_ = node.passes[0]
    rows = []
    for unit, place in enumerate(coordinates):
        label = node.labels[unit * len(node.labels) // len(coordinates)]
        for row, example_id in enumerate(pass_.example_ids):
            effect = float(effects[row, unit]) if row in base else None
            value = None if effect is None else base[row] + effect
            if value is not None and not math.isfinite(value):
                value = effect = None
            rows.append({"example_id": str(example_id), "metric": metric.name, "value": value,
                         "effect": effect, "eligible": value is not None,
                         "coordinates": place, "positions": positions[label][row],
                         "reason": "", "unit": metric.unit,
                         "estimand_version": estimand(metric, node),
                         "produced_by": digest})
    return rows


def _with_drops(table: list[dict], drops: torch.Tensor) -> list[dict]:
    """GradDrop's columns on each eligible row: ``graddrop_layers`` (``ĉ_l`` for each dropped
    layer ``l``) and ``graddrop``, their combination (``atp_star.combined``)."""
    rows = drops.shape[1]
    together = atp_star.combined(drops)
    for j, entry in enumerate(table):
        unit, row = divmod(j, rows)
        eligible = entry["eligible"]
        entry["graddrop"] = float(together[row, unit]) if eligible else None
        entry["graddrop_layers"] = ([float(v) for v in drops[:, row, unit]] if eligible
                                    else None)
    return table


def grid(table: list[dict]) -> list[tuple[dict, float | None]]:
    """``(coordinates, mean value over eligible rows)`` per unit, in table order."""
    sums: dict[str, list] = {}
    for entry in table:
        key = repr(sorted(entry["coordinates"].items()))
        cell = sums.setdefault(key, [entry["coordinates"], 0.0, 0])
        if entry["value"] is not None:
            cell[1] += entry["value"]
            cell[2] += 1
    return [(place, total / count if count else None) for place, total, count in sums.values()]


def publish(ctx: PassContext, directory: Path) -> list[str]:
    """The step's tables from every window's effects, into its results; its saves written."""
    sums = ctx.attributed
    node, parts = sums.node, sums.parts
    windows = {label: [list(map(int, w)) for w in each.write(node.write, node.base).windows]
               for label, each in zip(node.labels, sums.windows)}
    tables = {}
    for metric in node.passes[0].metrics:
        if metric.name not in node.metrics:
            continue
        effects = torch.cat([torch.cat(part["effects"][metric.name], -1) for part in parts], 0)
        base = {}
        for part in parts:
            values, eligible = part["scores"][metric.name]
            base.update(zip(eligible, values.detach().double().cpu().tolist()))
        tables[metric.name] = _table(node, metric, effects.detach().double().cpu(), base,
                                     windows, ctx.state.digest)
        if node.gates:
            drops = torch.stack([torch.cat([torch.cat(part["drops"][layer][metric.name], -1)
                                            for part in parts], 0)
                                 for layer in range(len(parts[0]["drops"]))])
            _with_drops(tables[metric.name], drops.detach().double().cpu())
    node.results.update(tables=tables, grid={m: grid(t) for m, t in tables.items()})
    return [record.write_json(directory / save.file_path, tables[save.value], root=directory)
            for save in node.saves]
