"""An edge step exported in MIB's submission layout, validated against that layout.

The layout, as MIB's circuit-track repository states it (docs/format.md §9.7 cites the files):
one folder per task and model, ``<task>_<model>``, holding either one importance file or 9
circuit files; a circuit or importance file is EAP-IG's ``Graph`` JSON: ``cfg`` (``n_layers``,
``n_heads``, ``parallel_attn_mlp``, ``d_model``), ``nodes`` (``input``, ``a<l>.h<h>``,
``m<l>``, ``logits`` → ``{"in_graph": bool}``) and ``edges`` (``<parent>-><child>``, with
``<q>``, ``<k>`` or ``<v>`` after an attention child → ``{"score", "in_graph"}``). The schema
below is written from those facts; the edge names are checked against MIB's graph rule (every
node before a child in the sequential order feeds it) counted here.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest

from day_pairs import EQUAL_PAIRS

REPO = Path(__file__).resolve().parents[2]
FRACTIONS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5]
NODE = r"(input|a\d+\.h\d+|m\d+)"
SCHEMA = {
    "type": "object", "required": ["cfg", "nodes", "edges"], "additionalProperties": False,
    "properties": {
        "cfg": {"type": "object", "additionalProperties": False,
                "required": ["n_layers", "n_heads", "parallel_attn_mlp", "d_model"],
                "properties": {"n_layers": {"type": "integer", "minimum": 1},
                               "n_heads": {"type": "integer", "minimum": 1},
                               "parallel_attn_mlp": {"type": "boolean"},
                               "d_model": {"type": "integer", "minimum": 1}}},
        "nodes": {"type": "object", "propertyNames": {"pattern": rf"^({NODE[1:-1]}|logits)$"},
                  "additionalProperties": {
                      "type": "object", "required": ["in_graph"], "additionalProperties": False,
                      "properties": {"in_graph": {"type": "boolean"}}}},
        "edges": {"type": "object",
                  "propertyNames": {"pattern": rf"^{NODE}->(a\d+\.h\d+<[qkv]>|m\d+|logits)$"},
                  "additionalProperties": {
                      "type": "object", "required": ["score", "in_graph"],
                      "additionalProperties": False,
                      "properties": {"score": {"type": "number"},
                                     "in_graph": {"type": "boolean"}}}},
    },
}


def _mib_edge_count(layers: int, heads: int) -> int:
    """MIB's graph: each head's q, k and v read every node before its layer; each MLP every
    node before it and its own layer's heads; the logits every node."""
    before, count = 1, 0
    for _ in range(layers):
        count += 3 * heads * before + (before + heads)
        before += heads + 1
    return count + before


def _run_step(kit, tiny, tmp_path, model: str, **options) -> tuple[Path, list, dict]:
    doc = kit.patching_document(tiny(model), component="attention_output", layer=0)
    doc["steps"] = {"circuit": {"kind": "attribute", "interventions": "patch",
                                "rows": {"base": "pairs", "counterfactual": "pairs"},
                                "metrics": ["logit_diff"], "edges": True, **options}}
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    out = tmp_path / "out"
    kit.run_compiled(doc, data_root, out)
    table = json.loads((out / "circuit.edges.json").read_text())
    record = json.loads((out / "circuit.faithfulness.json").read_text())
    return out, table, record


def _validate(path: Path) -> dict:
    graph = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(graph)
    return graph


def test_an_edge_step_exports_in_mibs_submission_layout(kit, tiny, tmp_path):
    from causalab.engine.attribution import mib_export

    run, table, record = _run_step(kit, tiny, tmp_path, "weekday-gpt2", steps=2)
    written = mib_export.export(run, "circuit", tmp_path / "mib", task="ioi", model="gpt2")
    root = tmp_path / "mib"
    assert sorted(p.relative_to(root).as_posix() for p in written) == sorted(
        ["importances/ioi_gpt2/importances.json"]
        + [f"multiple_circuits/abs-{a}/ioi_gpt2/circuit_{p * 100:g}pct.json"
           for a in (False, True) for p in FRACTIONS])
    assert [p.name for p in (root / "importances" / "ioi_gpt2").iterdir()] == ["importances.json"]
    graph = _validate(root / "importances" / "ioi_gpt2" / "importances.json")
    assert graph["cfg"] == {"n_layers": 4, "n_heads": 4, "parallel_attn_mlp": False,
                            "d_model": 64}
    assert len(graph["edges"]) == _mib_edge_count(4, 4) == len(table) == 479
    assert len(graph["nodes"]) == 1 + 4 * 5 + 1
    # Each edge's MIB name and score: the step's score towards the counterfactual.
    direction = record["mib"]["direction"]
    row = next(e for e in table if e["sender"] == "L0H2" and e["receiver"] == "L2KV1.k")
    assert graph["edges"]["a0.h2->a2.h1<k>"]["score"] == direction * row["score"]
    row = next(e for e in table if e["sender"] == "embeddings" and e["receiver"] == "logits")
    assert graph["edges"]["input->logits"]["score"] == direction * row["score"]
    for absolute in (False, True):
        key = (lambda e: -abs(e["score"])) if absolute else (lambda e: -direction * e["score"])
        ranked = sorted(table, key=key)
        folder = root / "multiple_circuits" / f"abs-{absolute}" / "ioi_gpt2"
        assert len(list(folder.iterdir())) == 9
        for p in FRACTIONS:
            circuit = _validate(folder / f"circuit_{p * 100:g}pct.json")
            kept = {name for name, edge in circuit["edges"].items() if edge["in_graph"]}
            n = int(p * 479)
            assert len(kept) == n <= p * 479  # "no more than" each budget's share
            # The circuit is the step's own at that budget (the one its CPR / CMD patched).
            hand = {f"{mib_export.node_name(e['sender'])}->"
                    f"{mib_export.children(e['receiver'], 4, 4)[0]}" for e in ranked[:n]}
            assert kept == hand
            on = {name for name, node in circuit["nodes"].items() if node["in_graph"]}
            assert on == {"logits"} | {part.split("<")[0] for name in kept
                                       for part in name.split("->")}


def test_grouped_keys_and_values_are_shared_by_their_query_heads(kit, tiny, tmp_path):
    from causalab.engine.attribution import mib_export

    run, table, record = _run_step(kit, tiny, tmp_path, "tiny-qwen2", circuit_k=[5])
    mib_export.export(run, "circuit", tmp_path / "mib", task="ioi", model="qwen2.5")
    graph = _validate(tmp_path / "mib" / "importances" / "ioi_qwen2.5" / "importances.json")
    # 2 blocks of 4 query heads, 2 key/value heads: MIB's ungrouped graph has 110 edges
    # against the step's 82.
    assert (len(table), len(graph["edges"])) == (82, _mib_edge_count(2, 4)) == (82, 110)
    row = next(e for e in table if e["sender"] == "L0H0" and e["receiver"] == "L1KV1.v")
    shares = [graph["edges"][f"a0.h0->a1.h{h}<v>"]["score"] for h in (2, 3)]
    assert shares[0] == shares[1] == pytest.approx(record["mib"]["direction"] * row["score"] / 2)


def test_the_export_refuses_block_receivers_and_names_mib_cannot_split(kit, tiny, tmp_path):
    from causalab.engine.attribution import mib_export

    run, *_ = _run_step(kit, tiny, tmp_path, "weekday-gpt2", receivers="blocks",
                        circuit_k=[5])
    with pytest.raises(ValueError, match="receivers: blocks"):
        mib_export.export(run, "circuit", tmp_path / "mib", task="ioi", model="gpt2")
    with pytest.raises(ValueError, match="<task>_<model>"):
        mib_export.export(run, "circuit", tmp_path / "mib", task="arc_easy", model="gpt2")


def test_the_export_script_writes_the_layout(kit, tiny, tmp_path, capsys):
    run, *_ = _run_step(kit, tiny, tmp_path, "weekday-gpt2", circuit_k=[5])
    spec = importlib.util.spec_from_file_location("mib_export_script",
                                                  REPO / "scripts" / "mib_export.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(run), "--step", "circuit", "--task", "ioi", "--model", "gpt2",
                        "--out", str(tmp_path / "mib")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 19
    _validate(tmp_path / "mib" / "importances" / "ioi_gpt2" / "importances.json")
