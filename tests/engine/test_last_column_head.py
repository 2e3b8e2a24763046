"""The output head over the last column alone (engine/planner.py ``_last_column_head``).

A trace whose taps computed from the head all read the last column feeds the head that
column, padded with zero rows to ``HEAD_ROWS``: the logits must be the ones a plain
transformers forward gives (torch hooks, the head over every column), and the tables must
be byte-identical to the ones the all-column head writes, fused or not.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from causalab.engine import planner, sites
from causalab.pipeline import run_document

# Rows x padded width well past HEAD_ROWS tokens, and fewer rows than HEAD_ROWS: the path
# pads. Three pairs of different lengths, repeated.
ROWS = 96
TOL = dict(atol=1e-6, rtol=1e-6)


def _rows(kit) -> list[dict]:
    rows = []
    for index in range(ROWS):
        row = dict(kit.pair_rows()[index % len(kit.PAIRS)])
        row["example_id"] = f"pair-{index}"
        rows.append(row)
    return rows


@pytest.fixture()
def padded(monkeypatch):
    """Every ``(rows in, rows out)`` the head was padded from and to, in this test."""
    calls = []
    original = sites._padded

    def spy(value, rows):
        out = original(value, rows)
        calls.append((tuple(value.shape), tuple(out.shape)))
        return out
    monkeypatch.setattr(sites, "_padded", spy)
    return calls


def _all_columns(monkeypatch) -> None:
    monkeypatch.setattr(planner, "_last_column_head", lambda prepared, ids: None)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gemma2", "tiny-qwen2"])
def test_last_column_logits_are_the_hook_oracles(family, tiny, oracle, kit, tmp_path, padded,
                                                 monkeypatch):
    resolved = tiny(family)
    rows = _rows(kit)
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    document = kit.patching_document(resolved)
    document["sites"]["head"] = {"component": "logits"}  # Gemma-2's oracle logits are softcapped
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    got = kit.step(plan, "patch").results["reads"]["logits"][:, 0]
    model, tokenizer = oracle(resolved.path)
    want = kit.patched_forward(model, tokenizer, rows)[0][:, -1]
    width = model.config.hidden_size
    assert (((ROWS, 1, width), (sites.HEAD_ROWS, 1, width)) in padded), padded
    assert got.shape == want.shape
    assert torch.allclose(got, want, **TOL)

    _all_columns(monkeypatch)
    every = kit.step(kit.run_compiled(document, data_root, tmp_path / "every"),
                     "patch").results["reads"]["logits"][:, 0]
    assert torch.equal(got, every)


def _sweep(resolved, kit) -> dict:
    """The patching document swept over 4 places and 2 positions: 8 points, one fused run."""
    document = kit.patching_document(resolved)
    pos = {"sweep": [-1, -2], "as": "pos"}
    document["sites"]["target"] = {"sweep": [{"component": c, "layers": [layer]}
                                             for c in ("block_output", "mlp_output")
                                             for layer in (0, 1)], "as": "place"}
    patch = document["interventions"]["patch"]
    patch["reads"]["v_cf"]["pos"] = patch["writes"]["patch"]["pos"] = pos
    return document


def _tables(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.json")
            if p.name in ("logit_diff.json", "iia.json")}


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
def test_sweep_tables_are_byte_identical_to_the_all_column_heads(family, tiny, kit, tmp_path,
                                                                 padded, monkeypatch):
    document = _sweep(tiny(family), kit)
    data_root = kit.write_table(tmp_path / "data", "pairs", _rows(kit))
    run_document(document, out=str(tmp_path / "last"), data_root=data_root)
    took = len(padded)
    # Every un-intervened and intervened trace reading the head (8 points, fused or not).
    assert took >= 2 and all(out[0] >= sites.HEAD_ROWS and out[1] == 1 for _, out in padded)
    last = _tables(tmp_path / "last")
    assert len(last) == 16
    # The all-column head, fused as before and in windows of 48 rows (other traces, other
    # row counts): the same bytes.
    for batch_size in (None, ROWS // 2):
        with monkeypatch.context() as patch:
            _all_columns(patch)
            out = tmp_path / f"every-{batch_size}"
            run_document(document, out=str(out), data_root=data_root, batch_size=batch_size)
        assert _tables(out) == last
    assert len(padded) == took


def test_a_head_read_at_another_column_keeps_every_column(tiny, oracle, kit, tmp_path, padded):
    resolved = tiny("tiny-llama")
    rows = _rows(kit)
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    earlier = {"site": "head", "pos": -2, "model": "patched", "input": "base"}
    document = kit.patching_document(resolved, extra_reads={"earlier": earlier})
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    reads = kit.step(plan, "patch").results["reads"]
    logits = kit.patched_forward(*oracle(resolved.path), rows)[0]
    # The patched forward's head read at -2 keeps it over every column: nothing padded there.
    assert all(shape_in[0] != ROWS for shape_in, _ in padded), padded
    assert torch.allclose(reads["logits"][:, 0], logits[:, -1], **TOL)
    assert torch.allclose(reads["earlier"][:, 0], logits[:, -2], **TOL)
