"""Attribution patching: every unit of a site set scored from one forward of each role and one
backward per metric (docs/format.md §9.7).

For a unit ``u`` (a layer's site, one of its heads or one feature, at one position label) and
a row, the estimate of the metric with only ``u`` patched from the counterfactual is

    value = metric(base) + effect,  effect = Σ_u (a_cf − a_base) · ∂metric/∂a

(Nanda 2023; Kramár et al. 2024, "AtP"). The gradient is taken at the base run; with
``steps = n > 1`` it is averaged over ``n`` forwards whose input embeddings lie on the straight
line from the base prompt's to the counterfactual's, at ``α = k/n`` for ``k = 0 … n−1``
(integrated gradients as EAP-IG takes it: ``steps: 1`` is plain AtP). AtP*'s corrections
(recomputing attention softmaxes for keys and queries, GradDrop) are not made.

This module never opens a trace: ``causalab.engine.walk.run_gradient_trace`` is handed in.
Positions come from the interchange's compiled passes, resolved by ``windows``; tensors are
cut by the seam's one ``gather``. Shapes: ``rows`` of a window of the pass, ``w`` positions,
``d`` the site's width, ``units`` per address.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch

from causalab.compile.plan import Address, Attribute, MetricOp, Pass
from causalab.document.vocab import ATTRIBUTION_UNITS
from causalab.engine import forwards, record
from causalab.engine import windows as window_rules
from causalab.engine.metrics import score
from causalab.engine.seam import Window, gather
from causalab.engine.sites import project_to_vocabulary
from causalab.errors import RunError


def estimand(metric: MetricOp, steps: int) -> str:
    """``logit_diff/v1 atp`` or ``logit_diff/v1 ig-8``: the metric's estimand, estimated."""
    return f"{metric.estimand_version} {'atp' if steps == 1 else f'ig-{steps}'}"


def _read_of(pass_: Pass, name: str):
    return next(read for fw in pass_.forwards for read in fw.reads if read.name == name)


def _window(resolved: dict, key: tuple, chunk: tuple, ragged: bool) -> Window:
    windows, _ = resolved[key]
    return window_rules.layout(windows, chunk, ragged)


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


def _head_value(head: torch.Tensor, read, window: Window, model: Any) -> torch.Tensor:
    """The metric's read, gathered as the exact pass gathers it (a logits view projected)."""
    value = gather(head, read.address, window)
    return project_to_vocabulary(model, value) if read.view == "logits" else value


def _last_only(read, windows: tuple, width: int) -> bool:
    """Whether the head may form the last column alone: every row reads only that column."""
    return (read.address.component in ("lm_head", "logits") and read.view == "raw"
            and all(tuple(w) == (width - 1,) for w in windows))


def _scores(node: Attribute, pass_: Pass, resolved: dict, chunk: tuple, got: dict,
            last_only: bool, model: Any) -> dict:
    """Per metric ``(values (eligible,), eligible pass rows)`` of one forward."""
    found = {}
    for metric in pass_.metrics:
        if metric.name not in node.metrics:
            continue
        read = _read_of(pass_, metric.of)
        windows, _ = resolved[("read", read.name, read.input)]
        local = [i for i, row in enumerate(chunk) if windows[row]]
        picked = [windows[chunk[i]] for i in local]
        if last_only:
            picked = [(0,)] * len(local)
        window = Window.from_windows(picked, ragged=read.pos.ragged)
        index = torch.tensor(local, dtype=torch.long, device=got["head"].device)
        logits = _head_value(got["head"].index_select(0, index), read, window, model)
        found[metric.name] = score(metric, logits, [chunk[i] for i in local])
    return found


def _gradients(scores: dict, shifts: list) -> dict:
    """``∂ Σ_rows metric / ∂ site`` at every address, per metric, one backward each."""
    names = list(scores)
    grads = {}
    for j, name in enumerate(names):
        total = scores[name][0].sum()
        grads[name] = torch.autograd.grad(total, shifts, retain_graph=j < len(names) - 1,
                                          allow_unused=True)
        grads[name] = [torch.zeros_like(s) if g is None else g
                       for g, s in zip(grads[name], shifts)]
    return grads


def _base_trace(node: Attribute, model: Any, trace: Callable, inputs: dict, position_ids,
                pass_: Pass, resolved: dict, chunk: tuple, replace=None) -> tuple[dict, dict]:
    """One forward with the graph kept: the site values, their zero shifts and the scores."""
    width = inputs["input_ids"].shape[1]
    read = next(_read_of(pass_, m.of) for m in pass_.metrics if m.name in node.metrics)
    last_only = _last_only(read, resolved[("read", read.name, read.input)][0], width)
    with torch.enable_grad():  # the metrics read one read (V29)
        got = trace(model, inputs, position_ids, _sites(node), shift=True, replace=replace,
                    head=read.address, last_only=last_only)
        scores = _scores(node, pass_, resolved, chunk, got, last_only, model)
        first = _first(node)
        shifts = [got[("shift", first + i)] for i in range(len(node.addresses))]
        return got, {"scores": scores, "grads": _gradients(scores, shifts)}


def _sites(node: Attribute) -> tuple:
    """What a trace reads, in forward order: the embeddings first when the path needs them."""
    return ((node.embeddings,) if node.embeddings is not None else ()) + node.addresses


def _first(node: Attribute) -> int:
    """Where the step's own addresses start among ``_sites``."""
    return 0 if node.embeddings is None else 1


def _interpolated(node: Attribute, base: dict, counterfactual: dict, k: int):
    """The embeddings ``α = k/steps`` of the way from the base prompt's to the counterfactual's."""
    start, end = base[("value", 0)], counterfactual[("value", 0)]
    return node.embeddings, start + (k / node.steps) * (end - start)


def _chunk(node: Attribute, model: Any, state: Any, trace: Callable, resolved: list,
           chunk: tuple) -> dict:
    """Effects of every unit on the rows of ``chunk``: ``{metric: [per label (rows, units)]}``
    plus each metric's base values and eligible rows."""
    pass_ = node.passes[0]
    cache = state.cache.inputs
    base_in, base_pos = forwards.prompt_inputs(model, pass_.inputs[node.base], chunk, cache)
    cf_in, cf_pos = forwards.prompt_inputs(model, pass_.inputs[node.counterfactual], chunk, cache)
    with torch.no_grad():
        counterfactual = trace(model, cf_in, cf_pos, _sites(node))
    base, found = _base_trace(node, model, trace, base_in, base_pos, pass_, resolved[0], chunk)
    grads = found["grads"]
    for k in range(1, node.steps):
        replace = _interpolated(node, base, counterfactual, k)
        _, more = _base_trace(node, model, trace, base_in, base_pos, pass_, resolved[0], chunk,
                              replace)
        grads = {m: [g + h for g, h in zip(grads[m], more["grads"][m])] for m in grads}
    effects = {}
    for metric, per_site in grads.items():
        effects[metric] = [_label_effects(node, each, found_windows, chunk, base, counterfactual,
                                          [g / node.steps for g in per_site])
                           for each, found_windows in zip(node.passes, resolved)]
    return {"effects": effects, "scores": found["scores"]}


def _label_effects(node: Attribute, pass_: Pass, resolved: dict, chunk: tuple, base: dict,
                   counterfactual: dict, grads: list) -> torch.Tensor:
    """``(rows, units)`` over every address of one position label, addresses side by side."""
    write = next(w for fw in pass_.forwards for w in fw.writes if w.name == node.write)
    read = _read_of(pass_, node.operand)
    ragged = write.pos.ragged or read.pos.ragged
    at_base = _window(resolved, ("write", write.name, node.base), chunk, ragged)
    at_cf = _window(resolved, ("read", read.name, node.counterfactual), chunk, ragged)
    if (at_base.width is None) != (at_cf.width is None) or at_base.counts != at_cf.counts:
        raise RunError(("interventions", pass_.intervention, "writes", write.name, "operand"),
                       "the operand and the write cover different positions on some row")
    out, first = [], _first(node)
    for i, address in enumerate(node.addresses):
        delta = (gather(counterfactual[("value", first + i)], address, at_cf)
                 - gather(base[("value", first + i)], address, at_base)).float()
        gradient = gather(grads[i], address, at_base).float()
        out.append(_units(_per_row(delta * gradient, at_base), address, node.unit))
    return torch.cat(out, -1)


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
                         "estimand_version": estimand(metric, node.steps),
                         "produced_by": digest})
    return rows


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


def run_attribution(node: Attribute, model: Any, state: Any, directory: Path,
                    trace: Callable) -> list[str]:
    """Score every unit on every row, publish the tables and write the step's saves."""
    resolved = [window_rules.resolve_pass(model, pass_, state) for pass_ in node.passes]
    pass_ = node.passes[0]
    rows = tuple(range(pass_.rows))
    parts = [_chunk(node, model, state, trace, resolved, chunk)
             for chunk in forwards.chunks(rows, state.batch_size)]
    windows = {label: [list(map(int, w)) for w in each[("write", node.write, node.base)][0]]
               for label, each in zip(node.labels, resolved)}
    tables = {}
    for metric in pass_.metrics:
        if metric.name not in node.metrics:
            continue
        effects = torch.cat([torch.cat(part["effects"][metric.name], -1) for part in parts], 0)
        base = {}
        for part in parts:
            values, eligible = part["scores"][metric.name]
            base.update(zip(eligible, values.detach().double().cpu().tolist()))
        tables[metric.name] = _table(node, metric, effects.detach().double().cpu(), base,
                                     windows, state.digest)
    node.results.update(tables=tables, grid={m: grid(t) for m, t in tables.items()})
    return [record.write_json(directory / save.file_path, tables[save.value], root=directory)
            for save in node.saves]
