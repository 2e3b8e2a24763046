"""Batching (docs/format.md §12): a row's numbers do not depend on the rows it is batched with."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytestmark = pytest.mark.usefixtures("no_receipt")


def _values(path) -> list:
    return [row["value"] for row in json.loads(path.read_text())]


@pytest.fixture()
def cuts(monkeypatch):
    """Every row window the walk cut, recorded (the walk's own ``chunks``, unchanged)."""
    from causalab.engine import forwards

    seen, chunks = [], forwards.chunks
    monkeypatch.setattr(forwards, "chunks",
                        lambda rows, size: seen.append(chunks(rows, size)) or seen[-1])
    return seen


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2"],
                         ids=["llama", "gpt2", "gemma2", "qwen2"])
def test_a_patching_table_is_the_same_whole_in_windows_of_one_and_row_by_row_unpadded(
        family, tiny, kit, tmp_path, cuts):
    from causalab.pipeline import run_document

    resolved = tiny(family)
    rows = kit.pair_rows()
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    for i, row in enumerate(rows):
        kit.write_table(tmp_path / "data", f"row{i}", [row])
    document = kit.patching_document(resolved)
    whole, ones = tmp_path / "whole", tmp_path / "ones"
    run_document(document, out=str(whole), data_root=data_root)
    cuts.clear()
    run_document(document, out=str(ones), data_root=data_root, batch_size=1)
    assert [(0,), (1,), (2,)] in cuts and all(len(c) == 1 for cut in cuts for c in cut)
    alone = []
    for i in range(len(rows)):
        out = tmp_path / f"alone{i}"
        run_document(kit.with_rows(document, f"row{i}"), out=str(out), data_root=data_root)
        alone += _values(out / "logit_diff.json")
    reference = _values(whole / "logit_diff.json")
    assert reference == pytest.approx(_values(ones / "logit_diff.json"), abs=1e-5)
    assert reference == pytest.approx(alone, abs=1e-5)
    assert len({len(p[0]) for p in kit.PAIRS}) > 1


def test_windows_concatenate_reads_and_outputs_in_row_order(tiny, kit, tmp_path, cuts):
    from causalab.engine.weights import load_model
    from causalab.engine.walk import run_pass
    import causalab.compile

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = causalab.compile.compile_document(kit.patching_document(resolved), data_root=data_root)
    model = load_model(plan.model)
    pass_ = kit.step(plan, "patch").pass_
    whole = run_pass(model, pass_, None)
    cuts.clear()
    windows = run_pass(model, pass_, None, batch_size=2)
    assert [(0, 1), (2,)] in cuts
    for name in ("v_cf", "logits"):
        assert windows["reads"][name].shape == whole["reads"][name].shape
        assert (windows["reads"][name] - whole["reads"][name]).abs().max() < 1e-5
    picked = run_pass(model, pass_, None, rows=[2, 0])
    values, eligible = picked["metrics"]["logit_diff"]
    assert eligible == (2, 0)
    full, _ = whole["metrics"]["logit_diff"]
    assert (values - full[[2, 0]]).abs().max() < 1e-5


def _moved(pass_, name: str, index: int):
    """``pass_`` with read ``name`` cut at ``{"index": index}`` instead."""
    def read(op):
        return replace(op, pos=replace(op.pos, index=index)) if op.name == name else op
    forwards = tuple(replace(f, reads=tuple(read(r) for r in f.reads)) for f in pass_.forwards)
    return replace(pass_, forwards=forwards)


def test_a_read_some_rows_cannot_place_has_one_flat_layout_across_windows(tiny, kit, tmp_path, cuts):
    from causalab.engine.weights import load_model
    from causalab.engine.walk import run_pass
    import causalab.compile

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    late = {"late": {"site": "target", "pos": {"index": 5}, "model": "patched", "input": "base"}}
    plan = causalab.compile.compile_document(kit.patching_document(resolved, extra_reads=late),
                                             data_root=data_root)
    model = load_model(plan.model)
    # The compiler refuses a fixed cut some row cannot fit (C16); the walk must still not
    # decide a layout per window, so the cut is moved past the short rows here.
    pass_ = _moved(kit.step(plan, "patch").pass_, "late", 9)
    whole = run_pass(model, pass_, None)
    windows, _ = whole.resolved.read("late")
    assert [len(w) for w in windows] == [0, 0, 1]
    assert whole["reads"]["late"].dim() == 2 and whole["reads"]["late"].shape[0] == 1
    for size in (1, 2):
        cuts.clear()
        cut = run_pass(model, pass_, None, batch_size=size)
        assert any(len(c) == size for chunk in cuts for c in chunk)
        assert cut["layouts"]["late"].width is None
        for name in ("late", "v_cf", "logits"):
            assert cut["reads"][name].shape == whole["reads"][name].shape
            assert (cut["reads"][name] - whole["reads"][name]).abs().max() < 1e-5
