"""An attribute step with ``edges: true`` (docs/format.md §9.7): EAP-IG over every edge.

The step's interchange names the two roles and its metrics; ``causalab.engine.attribution.edges`` scores
every edge of the model's graph per window of rows (one forward per role, one per
integrated-gradients step) and patches the top-``circuit_k`` circuits' complements, then
MIB's circuits (``causalab.engine.attribution.mib``: its budgets, ranked by signed score for
CPR and by ``|score|`` for CMD; a circuit the curve already has is not patched twice). The
metric is the interchange's, scored on the logits at the prompt's last position. Writes per
metric ``<step>.edges.json`` (sender, receiver, score: the mean over eligible rows, rank),
``<step>.nodes.json`` (each sender's outgoing edges summed: in a residual model that is its
output's node estimate) and ``<step>.faithfulness.json`` (the curve and its area, MIB's
``cpr`` and ``cmd`` with their curves, the ``floor`` check of the gap, the graph's shape).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from causalab.compile.plan import Attribute, MetricOp
from causalab.engine import record
from causalab.engine.attribution import edges, mib
from causalab.engine.trace_jobs import TraceJob
from causalab.engine.metrics import score
from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from nnterp import StandardizedTransformer

    from causalab.engine.state import ModelFacts

# Rows per window when the run names no batch size: a window holds every sender's output.
WINDOW = 16


def _batch(node: Attribute, role: str, rows: tuple, device) -> dict:
    """The rows' prompts as model inputs, position ids from the mask as every other step's
    forwards take them (docs/format.md §18; GPT-2's absolute positions need them)."""
    prompts = node.passes[0].inputs[role]
    found = {key: torch.tensor([getattr(prompts, key)[r] for r in rows], device=device)
             for key in ("input_ids", "attention_mask")}
    found["position_ids"] = (found["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return found


def _metric(metric: MetricOp, rows: tuple):
    """The compiled metric on last-position logits ``(rows, vocab)``: eligible rows' values."""
    return lambda logits: score(metric, logits.float(), rows)[0]


def sizes(node: Attribute, total: int) -> list[int]:
    """The circuit sizes of the curve: the step's (clipped to the graph; by default MIB's
    budgets), with 0 and every edge added so the area spans the whole axis."""
    ks = node.circuit_k or mib.sizes(total)
    return sorted({0, total, *(min(k, total) for k in ks)})


def extra_sizes(ks: list[int], total: int) -> tuple[list[int], list[int]]:
    """The circuits MIB's scores need beyond the curve's: ``|score|``-ranked sizes the curve
    lacks, then signed-ranked sizes strictly between 0 and ``total`` (at either end both
    rankings keep the same edges)."""
    budgets = sorted(set(mib.sizes(total)))
    return ([k for k in budgets if k not in ks], [k for k in budgets if 0 < k < total])


def _tables(found: edges.Graph, mean: torch.Tensor) -> tuple[list, list]:
    mean = mean.double().cpu()
    pairs = sorted(found.edges(), key=lambda e: -abs(float(mean[e])))
    edge_rows = [{"sender": found.senders[u], "receiver": found.receivers[v],
                  "score": float(mean[u, v]), "rank": rank + 1}
                 for rank, (u, v) in enumerate(pairs)]
    node_rows = [{"node": name, "score": float(mean[u].sum())}
                 for u, name in enumerate(found.senders)]
    return edge_rows, node_rows


def _shape(model, receivers: str) -> dict:
    """The graph's shape as MIB's export needs it (``mib_export``): its blocks, query and
    key/value heads, residual width, layout and receivers."""
    found = edges._layout(model)
    return {"layers": len(found.layers), "heads": found.heads, "kv_heads": found.kv_heads,
            "d_model": int(model.config.hidden_size), "layout": found.kind,
            "receivers": receivers}


def _chunks(node: Attribute, batch_size: int | None) -> list[tuple[int, ...]]:
    """The step's rows in windows of ``batch_size`` (default ``WINDOW``)."""
    rows = tuple(range(node.passes[0].rows))
    size = batch_size or WINDOW
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def _scored(node: Attribute) -> list[MetricOp]:
    return [metric for metric in node.passes[0].metrics if metric.name in node.metrics]


def forwards(node: Attribute, batch_size: int | None, facts: ModelFacts) -> list[TraceJob]:
    """The hooked forwards ``run`` makes, in its order, as ``edges`` jobs (what ``explain
    --traces`` lists): per metric, per window the counterfactual's, the base's and ``steps``
    base forwards under grad (``edges.scored``); then per window the base's, the
    counterfactual's and one patched base forward per circuit (``edges.evaluate``): the
    curve's sizes, then MIB's that the curve lacks (``extra_sizes``).
    The graph is counted from the config's shape; a layout ``run`` refuses is refused there."""
    shape = edges.graph_of(facts.layers, facts.heads, facts.kv_heads or facts.heads,
                           node.receivers)
    total = int(shape.mask.sum())
    ks = sizes(node, total)
    patched = len(ks) + sum(map(len, extra_sizes(ks, total)))
    base, cf = (node.passes[0].inputs[role] for role in (node.base, node.counterfactual))
    chunks = _chunks(node, batch_size)
    found = []
    for _ in _scored(node):
        for rows in chunks:
            found += [TraceJob("edges", cf, rows), TraceJob("edges", base, rows)]
            found += [TraceJob("edges", base, rows, grad=True)] * node.steps
        for rows in chunks:
            found += [TraceJob("edges", base, rows), TraceJob("edges", cf, rows)]
            found += [TraceJob("edges", base, rows)] * patched
    return found


def _circuits(found: edges.Graph, mean: torch.Tensor, ks: list[int], direction: float):
    """The patched masks of the curve's circuits and MIB's, and where each MIB point's
    metric is among them: ``{"absolute": [index per point], "signed": [...]}``."""
    mask, total = found.mask, int(found.mask.sum())
    absolute, signed = extra_sizes(ks, total)
    order = [("absolute", k) for k in ks + absolute] + [("signed", k) for k in signed]
    outside = [mask & ~edges.circuit(mean * direction, mask, k, signed=ranking == "signed")
               for ranking, k in order]
    where = {("signed", k): order.index(("absolute", k)) for k in (0, total)}
    where.update({key: j for j, key in enumerate(order)})
    points = mib.sizes(total)
    return outside, {r: [where[(r, k)] for k in points] for r in ("absolute", "signed")}


def _report(ends: edges.Ends, ks: list[int], found: edges.Graph, index: dict,
            direction: float, kind: str) -> dict:
    """The faithfulness file of one metric: the curve, MIB's scores and the floor check."""
    total = int(found.mask.sum())
    curve = dataclasses.asdict(edges.curve_of(ends, ks, list(ends.values[:len(ks)]), total))
    metric = {r: [ends.values[j] for j in at] for r, at in index.items()}
    normal = {r: ends.normalised(values) for r, values in metric.items()}
    gap = curve["base"] - curve["counterfactual"]
    return {**curve, "mib": mib.scores(normal, metric, mib.sizes(total), direction),
            "floor": mib.floor(kind, gap, curve["gap_se"])}


def run(node: Attribute, model: StandardizedTransformer, directory: Path,
        batch_size: int | None) -> list[str]:
    """The step's edge and node tables and faithfulness curve, per metric, into its results;
    rows in windows of ``batch_size`` (scores summed, then the mean over eligible rows)."""
    torch_model = getattr(model, "_model", model)
    try:
        found = edges.graph(torch_model, node.receivers)
    except ValueError as error:
        raise RunError((node.name, "edges"), str(error)) from None
    device = next(torch_model.parameters()).device
    rows = tuple(range(node.passes[0].rows))
    chunks = _chunks(node, batch_size)
    batches = [(_batch(node, node.base, c, device), _batch(node, node.counterfactual, c, device))
               for c in chunks]
    ks = sizes(node, int(found.mask.sum()))
    written, report = [], {}
    for metric in _scored(node):
        windows = [(base, cf, _metric(metric, c)) for (base, cf), c in zip(batches, chunks)]
        total, gap = 0, 0.0
        for window in windows:
            each, m_base, m_cf = edges.scored(torch_model, *window, steps=node.steps,
                                              receivers=node.receivers)
            total, gap = total + each.sum(0), gap + float((m_cf - m_base).sum())
        eligible = len(set(metric.eligible) & set(rows))
        mean = total / max(eligible, 1)
        direction = -1.0 if gap < 0 else 1.0  # towards the counterfactual: MIB's sign
        outside, index = _circuits(found, mean, ks, direction)
        ends = edges.evaluate(torch_model, windows, outside, node.receivers)
        curve = _report(ends, ks, found, index, direction, metric.kind)
        curve["graph"] = _shape(torch_model, node.receivers)
        edge_rows, node_rows = _tables(found, mean)
        report[metric.name] = {"curve": curve, "edges": len(edge_rows), "top": edge_rows[:10]}
        suffix = "" if len(node.metrics) == 1 else f".{metric.name}"
        for kind, value in (("edges", edge_rows), ("nodes", node_rows),
                            ("faithfulness", curve)):
            written.append(record.write_json(directory / f"{node.name}{suffix}.{kind}.json",
                                             value, root=directory))
    node.results["edges"] = report
    return written
