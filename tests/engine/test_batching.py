"""Batching (FORMAT §12): a row's numbers do not depend on the rows it is batched with."""
from __future__ import annotations

import json

import pytest


def _values(path) -> list:
    return [row["value"] for row in json.loads(path.read_text())]


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2"],
                         ids=["llama", "gpt2", "gemma2", "qwen2"])
def test_a_patching_table_is_the_same_whole_in_windows_of_one_and_row_by_row_unpadded(
        family, tiny, kit, tmp_path):
    from causalab.pipeline import run_document

    resolved = tiny(family)
    rows = kit.pair_rows()
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    for i, row in enumerate(rows):
        kit.write_table(tmp_path / "data", f"row{i}", [row])
    document = kit.patching_document(resolved)
    whole, ones = tmp_path / "whole", tmp_path / "ones"
    run_document(document, out=str(whole), data_root=data_root)
    run_document(document, out=str(ones), data_root=data_root, batch_size=1)
    alone = []
    for i in range(len(rows)):
        out = tmp_path / f"alone{i}"
        run_document(kit.with_rows(document, f"row{i}"), out=str(out), data_root=data_root)
        alone += _values(out / "logit_diff.json")
    reference = _values(whole / "logit_diff.json")
    assert reference == pytest.approx(_values(ones / "logit_diff.json"), abs=1e-5)
    assert reference == pytest.approx(alone, abs=1e-5)
    assert len({len(p[0]) for p in kit.PAIRS}) > 1


def test_windows_concatenate_reads_and_outputs_in_row_order(tiny, kit, tmp_path):
    from causalab.engine.load import load_model
    from causalab.engine.walk import run_pass
    import causalab.compile

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = causalab.compile.compile_document(kit.patching_document(resolved), data_root=data_root)
    model = load_model(plan.model)
    pass_ = kit.step(plan, "patch").pass_
    whole = run_pass(model, pass_, None)
    windows = run_pass(model, pass_, None, batch_size=2)
    for name in ("v_cf", "logits"):
        assert windows["reads"][name].shape == whole["reads"][name].shape
        assert (windows["reads"][name] - whole["reads"][name]).abs().max() < 1e-5
    picked = run_pass(model, pass_, None, rows=[2, 0])
    values, eligible = picked["metrics"]["logit_diff"]
    assert eligible == (2, 0)
    full, _ = whole["metrics"]["logit_diff"]
    assert (values - full[[2, 0]]).abs().max() < 1e-5
