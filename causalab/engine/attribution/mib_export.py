"""An edge step's scores and circuits in MIB's submission layout (docs/format.md §9.7, "MIB's
submission layout"): what MIB's circuit track evaluates, read off a run's files.

MIB's graph (EAP-IG's ``Graph``, the one its evaluation loads) names its nodes ``input``,
``a<l>.h<h>``, ``m<l>`` and ``logits``, and its edges ``<parent>-><child>`` with ``<q>``,
``<k>`` or ``<v>`` after an attention child (``input->a0.h0<q>``, ``a3.h1->m5``,
``m11->logits``). Its JSON file holds ``cfg`` (``n_layers``, ``n_heads``,
``parallel_attn_mlp``, ``d_model``), ``nodes`` (name → ``{"in_graph": bool}``) and ``edges``
(name → ``{"score": float, "in_graph": bool}``). A submission is one folder per task and model,
``<task>_<model>``, holding either one file of importance scores or 9 circuits, one of at most
each budget's share of the edges (``mib.BUDGETS``); MIB's evaluation recurses into folders
named ``abs-True`` / ``abs-False`` and scores circuits found there with ``|score|`` or signed
ranking alone.

Written here: ``importances/<task>_<model>/importances.json`` (every edge, ``in_graph``
true, each score multiplied by the step's direction so that MIB's signed top-n is the step's
signed ranking) and ``multiple_circuits/abs-False/<task>_<model>/`` (the signed ranking's
circuits: CPR's) and ``multiple_circuits/abs-True/<task>_<model>/`` (the ``|score|``
ranking's: CMD's), one ``circuit_<percent>pct.json`` per budget, each circuit the top
``int(p · |edges|)`` edges of the exported scores and every node one of its edges touches
(``logits`` always). Under grouped-query attention MIB's graph has a key and a value input per
query head; the step's ``L3KV0.k`` edge is then written to each query head of the group with
an equal share of its score (their sum, the first-order score of patching them together): the
file is MIB's graph, but its per-head scores are shares, never measured one by one. Edges into
``L3.attention`` (``receivers: blocks``) are no edges of MIB's graph and are refused.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from causalab.engine.attribution import mib

_RECEIVER = re.compile(r"L(\d+)(?:H(\d+)\.(q)|KV(\d+)\.([kv])|\.(mlp))")
_SENDER = re.compile(r"L(\d+)(?:H(\d+)|(MLP))")
_NAME = re.compile(r"[a-z0-9.\-]+")  # MIB's own: ioi, arc-easy, qwen2.5; "_" splits them


def node_name(sender: str) -> str:
    """MIB's name of a causalab sender: ``embeddings`` → ``input``, ``L3H1`` → ``a3.h1``,
    ``L3MLP`` → ``m3``.

    >>> [node_name(s) for s in ("embeddings", "L3H1", "L3MLP")]
    ['input', 'a3.h1', 'm3']
    """
    if sender == "embeddings":
        return "input"
    found = _SENDER.fullmatch(sender)
    if found is None:
        raise ValueError(f"{sender!r} is no sender of an edge graph")
    layer, head, mlp = found.groups()
    return f"m{layer}" if mlp else f"a{layer}.h{head}"


def children(receiver: str, heads: int, kv_heads: int) -> list[str]:
    """MIB's children (with their ``<q|k|v>``) of a causalab receiver: a key/value head's
    input is each query head of its group's.

    >>> children("L3KV1.k", 4, 2), children("L2.mlp", 4, 2), children("L0H3.q", 4, 2)
    (['a3.h2<k>', 'a3.h3<k>'], ['m2'], ['a0.h3<q>'])
    """
    if receiver == "logits":
        return ["logits"]
    found = _RECEIVER.fullmatch(receiver)
    if found is None:
        raise ValueError(f"{receiver!r} is no edge of MIB's graph (receivers: heads has each "
                         "head's query, key and value input; blocks' L<l>.attention has none)")
    layer, head, q, group, kv, mlp = found.groups()
    if mlp:
        return [f"m{layer}"]
    if q:
        return [f"a{layer}.h{head}<q>"]
    size = heads // kv_heads
    return [f"a{layer}.h{h}<{kv}>" for h in range(int(group) * size, (int(group) + 1) * size)]


def mib_names(layers: int, heads: int) -> list[str]:
    """Every edge of MIB's graph of ``layers`` blocks of ``heads`` heads, in the order its
    ``Graph.from_model`` adds them (sequential attention and MLP)."""
    stream, found = ["input"], []
    for l in range(layers):
        attention = [f"a{l}.h{h}" for h in range(heads)]
        found += [f"{u}->{a}<{x}>" for u in stream for a in attention for x in "qkv"]
        stream += attention
        found += [f"{u}->m{l}" for u in stream]
        stream.append(f"m{l}")
    return found + [f"{u}->logits" for u in stream]


def _nodes(layers: int, heads: int) -> list[str]:
    names = ["input"]
    for l in range(layers):
        names += [f"a{l}.h{h}" for h in range(heads)] + [f"m{l}"]
    return names + ["logits"]


def importances(table: list[dict], shape: dict, direction: float) -> dict:
    """MIB's graph with every edge's score: ``table`` a step's ``edges.json`` rows, ``shape``
    its faithfulness file's ``graph``, ``direction`` its ``mib.direction``."""
    if shape["receivers"] != "heads":
        raise ValueError(f"receivers: {shape['receivers']} has no edges of MIB's graph; "
                         "export an edge step with receivers: heads")
    heads, kv = shape["heads"], shape["kv_heads"]
    scores: dict[str, float] = {}
    for row in table:
        targets = children(row["receiver"], heads, kv)
        for child in targets:
            scores[f"{node_name(row['sender'])}->{child}"] = direction * row["score"] / len(targets)
    names = mib_names(shape["layers"], heads)
    if set(scores) != set(names):
        raise ValueError(f"the table's {len(scores)} edges are not MIB's graph of "
                         f"{len(names)} (layers {shape['layers']}, heads {heads})")
    return {"cfg": {"n_layers": shape["layers"], "n_heads": heads, "parallel_attn_mlp": False,
                    "d_model": shape["d_model"]},
            "nodes": {name: {"in_graph": True} for name in _nodes(shape["layers"], heads)},
            "edges": {name: {"score": scores[name], "in_graph": True} for name in names}}


def circuit(graph: dict, n: int, absolute: bool) -> dict:
    """The top ``n`` edges of ``graph``'s scores (``absolute``: by ``|score|``) as MIB's
    circuit file: the same names and scores, ``in_graph`` on those edges and on every node
    they touch (``logits`` always)."""
    edge_names = list(graph["edges"])

    def key(name):
        score = graph["edges"][name]["score"]
        return abs(score) if absolute else score
    kept = set(sorted(edge_names, key=key, reverse=True)[:n])  # stable: MIB's order on ties
    touched = {"logits"} | {part.split("<")[0] for name in kept for part in name.split("->")}
    return {"cfg": graph["cfg"],
            "nodes": {name: {"in_graph": name in touched} for name in graph["nodes"]},
            "edges": {name: {"score": graph["edges"][name]["score"], "in_graph": name in kept}
                      for name in edge_names}}


def _percent(p: float) -> str:
    return f"{p * 100:g}"


def step_files(directory: Path, step: str, metric: str | None) -> tuple[list, dict]:
    """A run's ``<step>[.<metric>].edges.json`` rows and ``.faithfulness.json`` record."""
    stem = step if metric is None else f"{step}.{metric}"
    table = json.loads((directory / f"{stem}.edges.json").read_text())
    record = json.loads((directory / f"{stem}.faithfulness.json").read_text())
    return table, record


def export(directory: str | Path, step: str, out: str | Path, *, task: str, model: str,
           metric: str | None = None) -> list[Path]:
    """Write a run's edge step (``directory`` holding its files) in MIB's layout under
    ``out``: the importances and the two rankings' circuits; returns the files written."""
    for what, name in (("task", task), ("model", model)):
        if not _NAME.fullmatch(name):
            raise ValueError(f"{what} {name!r}: MIB's folder is <task>_<model>, each of "
                             "lower-case letters, digits, '.' and '-'")
    table, record = step_files(Path(directory), step, metric)
    graph = importances(table, record["graph"], record["mib"]["direction"])
    folder = f"{task}_{model}"
    root = Path(out)
    written = [_write(root / "importances" / folder / "importances.json", graph)]
    total = len(graph["edges"])
    for absolute in (False, True):
        where = root / "multiple_circuits" / f"abs-{absolute}" / folder
        for p in mib.BUDGETS:
            written.append(_write(where / f"circuit_{_percent(p)}pct.json",
                                  circuit(graph, int(p * total), absolute)))
    return written


def _write(path: Path, value: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path
