"""A (layer, head) pair sweep tied with "as" compiles on SmolLM2 with one label per pair.

Compiling reads SmolLM2's config and tokenizer (the dequantized built-in in the test home),
never its weights.
"""
from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")


def test_a_layer_head_pair_sweep_tied_with_as_compiles_with_distinct_labels():
    import causalab.compile

    raw = json.loads((REPO / "documents" / "real" / "ioi_head_patching.json").read_text())
    raw["sites"]["head_out"]["layers"] = {"sweep": [[23], [23]], "as": "pair"}
    raw["sites"]["head_out"]["heads"] = {"sweep": [[3], [0]], "as": "pair"}
    plan = causalab.compile.compile_document(raw, data_root=DATA)
    assert [point.name for point in plan.children] == ["layers=23,heads=3", "layers=23,heads=0"]
    assert [point.coordinates for point in plan.children] == [
        {"layers": (23,), "heads": (3,)}, {"layers": (23,), "heads": (0,)}]
