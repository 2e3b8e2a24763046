"""An attribute step with ``edges: true`` (docs/format.md §9.7): EAP-IG over every edge.

The step's interchange names the two roles and its metrics; ``causalab.engine.attribution.edges`` scores
every edge of the model's graph per window of rows (one forward per role, one per
integrated-gradients step) and patches the top-``circuit_k`` circuits' complements. The
metric is the interchange's, scored on the logits at the prompt's last position. Writes per
metric ``<step>.edges.json`` (sender, receiver, score: the mean over eligible rows, rank),
``<step>.nodes.json`` (each sender's outgoing edges summed: in a residual model that is its
output's node estimate) and ``<step>.faithfulness.json`` (the curve and its area).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from causalab.compile.plan import Attribute, MetricOp
from causalab.engine import record
from causalab.engine.attribution import edges
from causalab.engine.trace_jobs import TraceJob
from causalab.engine.metrics import score
from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from nnterp import StandardizedTransformer

    from causalab.engine.state import ModelFacts

# Circuit sizes when the step names none, as fractions of the graph's edges.
DEFAULT_FRACTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# Rows per window when the run names no batch size: a window holds every sender's output.
WINDOW = 16


def _batch(node: Attribute, role: str, rows: tuple, device) -> dict:
    prompts = node.passes[0].inputs[role]
    return {key: torch.tensor([getattr(prompts, key)[r] for r in rows], device=device)
            for key in ("input_ids", "attention_mask")}


def _metric(metric: MetricOp, rows: tuple):
    """The compiled metric on last-position logits ``(rows, vocab)``: eligible rows' values."""
    return lambda logits: score(metric, logits.float(), rows)[0]


def sizes(node: Attribute, total: int) -> list[int]:
    """The circuit sizes of the curve: the step's (clipped to the graph), with 0 and every
    edge added so the area spans the whole axis."""
    ks = node.circuit_k or tuple(round(f * total) for f in DEFAULT_FRACTIONS)
    return sorted({0, total, *(min(k, total) for k in ks)})


def _tables(found: edges.Graph, mean: torch.Tensor) -> tuple[list, list]:
    mean = mean.double().cpu()
    pairs = sorted(found.edges(), key=lambda e: -abs(float(mean[e])))
    edge_rows = [{"sender": found.senders[u], "receiver": found.receivers[v],
                  "score": float(mean[u, v]), "rank": rank + 1}
                 for rank, (u, v) in enumerate(pairs)]
    node_rows = [{"node": name, "score": float(mean[u].sum())}
                 for u, name in enumerate(found.senders)]
    return edge_rows, node_rows


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
    base forwards under grad (``edges.scores``); then per window the base's, the
    counterfactual's and one patched base forward per circuit size (``edges.faithfulness``).
    The graph is counted from the config's shape; a layout ``run`` refuses is refused there."""
    shape = edges.graph_of(facts.layers, facts.heads, facts.kv_heads or facts.heads,
                           node.receivers)
    ks = sizes(node, int(shape.mask.sum()))
    base, cf = (node.passes[0].inputs[role] for role in (node.base, node.counterfactual))
    chunks = _chunks(node, batch_size)
    found = []
    for _ in _scored(node):
        for rows in chunks:
            found += [TraceJob("edges", cf, rows), TraceJob("edges", base, rows)]
            found += [TraceJob("edges", base, rows, grad=True)] * node.steps
        for rows in chunks:
            found += [TraceJob("edges", base, rows), TraceJob("edges", cf, rows)]
            found += [TraceJob("edges", base, rows)] * len(ks)
    return found


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
        total = sum(edges.scores(torch_model, *window, steps=node.steps,
                                 receivers=node.receivers).sum(0) for window in windows)
        eligible = len(set(metric.eligible) & set(rows))
        mean = total / max(eligible, 1)
        curve = edges.faithfulness(torch_model, windows, mean, ks, node.receivers)
        edge_rows, node_rows = _tables(found, mean)
        report[metric.name] = {"curve": dataclasses.asdict(curve), "edges": len(edge_rows),
                               "top": edge_rows[:10]}
        suffix = "" if len(node.metrics) == 1 else f".{metric.name}"
        for kind, value in (("edges", edge_rows), ("nodes", node_rows),
                            ("faithfulness", report[metric.name]["curve"])):
            written.append(record.write_json(directory / f"{node.name}{suffix}.{kind}.json",
                                             value, root=directory))
    node.results["edges"] = report
    return written
