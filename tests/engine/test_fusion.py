"""Fused sweep points: many points' forwards in one trace give the tables one point at a time gives.

The one-point-at-a-time path is checked against torch-hook oracles elsewhere (test_walk,
test_write_matrix, test_interiors); here the fused path must reproduce it byte for byte, over
components, head selections and mechanisms, on two families, and must really have fused.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from causalab.engine import planner
from causalab.models import resolve
from causalab.pipeline import run_document

COMPONENTS = ["block_input", "attention_query", "attention_z", "attention_premix",
              "attention_output", "block_mid", "mlp_activation", "mlp_output", "block_output"]


def _document(family: str, mechanism: str) -> dict:
    resolved = resolve(f"causalab:tiny-{family}")
    places = [{"component": c, "layers": [layer]} for c in COMPONENTS for layer in (0, 1)]
    places.append({"component": "attention_premix", "layers": [1], "heads": [2]})
    pos = {"sweep": [-1, -2], "as": "pos"}
    write = {"site": "target", "pos": pos, "mechanism": "swap", "operand": "v_cf"}
    if mechanism == "lerp":
        write.update(mechanism="lerp", params={"t": 0.3})
    if mechanism == "zero":
        write.update(operand=0.0)
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"sweep": places, "as": "place"}, "head": {"component": "lm_head"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": pos, "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": write},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"}}}},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def _tables(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.json")
            if p.name != "run.json"}


@pytest.mark.parametrize("family,mechanism", [("llama", "swap"), ("llama", "lerp"),
                                              ("gpt2", "zero")],
                         ids=["llama-swap", "llama-lerp", "gpt2-zero"])
def test_fused_points_write_the_tables_one_point_at_a_time_writes(family, mechanism, tmp_path,
                                                                   monkeypatch):
    document = _document(family, mechanism)
    fused_traces = []
    original = planner.fuse

    def counting(*args, **kwargs):
        fused_traces.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(planner, "fuse", counting)
    run_document(document, out=str(tmp_path / "fused"))
    assert fused_traces, "the sweep was never fused"

    monkeypatch.setattr(planner, "groups", lambda points, batch_size=None, cache=None: [[p] for p in points])
    run_document(document, out=str(tmp_path / "alone"))

    fused, alone = _tables(tmp_path / "fused"), _tables(tmp_path / "alone")
    assert len(alone) == 1 + 2 * (2 * len(COMPONENTS) + 1) * 2
    assert fused == alone
    values = [row["value"] for row in json.loads(next(iter(
        v for k, v in alone.items() if k.endswith("logit_diff.json"))))]
    assert all(isinstance(v, float) for v in values)
