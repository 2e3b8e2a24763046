"""An attribute step with ``edges: true`` (docs/format.md §9.7): EAP-IG over every edge.

The step's interchange names the two roles and its metrics; ``causalab.engine.edges`` scores
every edge of the model's graph over all the step's rows at once (one forward per role, one
per integrated-gradients step) and patches the top-``circuit_k`` circuits' complements. The
metric is the interchange's, scored on the logits at the prompt's last position. Writes per
metric ``<step>.edges.json`` (sender, receiver, score: the mean over eligible rows, rank),
``<step>.nodes.json`` (each sender's outgoing edges summed: in a residual model that is its
output's node estimate) and ``<step>.faithfulness.json`` (the curve and its area).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from causalab.compile.plan import Attribute, MetricOp
from causalab.engine import edges, record
from causalab.engine.metrics import score
from causalab.errors import RunError

# Circuit sizes when the step names none, as fractions of the graph's edges.
DEFAULT_FRACTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _batch(node: Attribute, role: str, device) -> dict:
    prompts = node.passes[0].inputs[role]
    return {"input_ids": torch.tensor(prompts.input_ids, device=device),
            "attention_mask": torch.tensor(prompts.attention_mask, device=device)}


def _metric(metric: MetricOp, rows: int):
    """The compiled metric on last-position logits ``(rows, vocab)``: eligible rows' values."""
    return lambda logits: score(metric, logits.float(), tuple(range(rows)))[0]


def sizes(node: Attribute, total: int) -> list[int]:
    """The circuit sizes of the curve: the step's (clipped to the graph), with 0 and every
    edge added so the area spans the whole axis."""
    ks = node.circuit_k or tuple(round(f * total) for f in DEFAULT_FRACTIONS)
    return sorted({0, total, *(min(k, total) for k in ks)})


def _tables(found: edges.Graph, scored: torch.Tensor) -> tuple[list, list]:
    mean = scored.mean(0).double().cpu()
    pairs = sorted(found.edges(), key=lambda e: -abs(float(mean[e])))
    edge_rows = [{"sender": found.senders[u], "receiver": found.receivers[v],
                  "score": float(mean[u, v]), "rank": rank + 1}
                 for rank, (u, v) in enumerate(pairs)]
    node_rows = [{"node": name, "score": float(mean[u].sum())}
                 for u, name in enumerate(found.senders)]
    return edge_rows, node_rows


def run(node: Attribute, model: Any, directory: Path) -> list[str]:
    """The step's edge and node tables and faithfulness curve, per metric, into its results."""
    torch_model = getattr(model, "_model", model)
    try:
        found = edges.graph(torch_model)
    except ValueError as error:
        raise RunError((node.name, "edges"), str(error)) from None
    device = next(torch_model.parameters()).device
    base, cf = _batch(node, node.base, device), _batch(node, node.counterfactual, device)
    ks = sizes(node, int(found.mask.sum()))
    written, report = [], {}
    for metric in node.passes[0].metrics:
        if metric.name not in node.metrics:
            continue
        fn = _metric(metric, node.passes[0].rows)
        scored = edges.scores(torch_model, base, cf, fn, steps=node.steps)
        curve = edges.faithfulness(torch_model, base, cf, fn, scored, ks)
        edge_rows, node_rows = _tables(found, scored)
        report[metric.name] = {"curve": dataclasses.asdict(curve), "edges": len(edge_rows),
                               "top": edge_rows[:10]}
        suffix = "" if len(node.metrics) == 1 else f".{metric.name}"
        for kind, value in (("edges", edge_rows), ("nodes", node_rows),
                            ("faithfulness", report[metric.name]["curve"])):
            written.append(record.write_json(directory / f"{node.name}{suffix}.{kind}.json",
                                             value, root=directory))
    node.results["edges"] = report
    return written
