"""The fidelity receipt: the engine's forward with no write is the plain model.

On every built-in family (tiny and weekday, fp32) the logits the engine reads with the first
pass's writes taken out are compared with a plain transformers model loaded here without
nnterp (the ``oracle`` fixture), fed the same left-padded rows with position ids from the
mask. Both run the same weights through the same kernels, so they agree to float32 rounding
of a reordered sum at most: 1e-5 on logits of magnitude ~10 is a few ulps.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import causalab.compile
from causalab.engine import entry, fidelity
from causalab.engine.runner import TraceRunner
from causalab.engine.weights import load_model
from causalab.engine.walk import run_pass
from causalab.errors import RunError

FP32 = 1e-5
REPO = Path(__file__).resolve().parents[2]
BUILT_INS = ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2", "weekday-llama",
             "weekday-gpt2", "weekday-qwen2", "weekday-gemma2"]


@pytest.mark.parametrize("name", BUILT_INS)
def test_the_receipt_is_the_plain_transformers_forward(name, tiny, oracle, kit, tmp_path):
    resolved = tiny(name)
    data_root = kit.write_table(tmp_path, "pairs", kit.pair_rows())
    plan = causalab.compile.compile_document(kit.patching_document(resolved), data_root=data_root)
    model = load_model(plan.model)
    found = entry.receipt(TraceRunner(model), plan, "fp32")
    plain, tokenizer = oracle(resolved.path)
    encoded = kit.encode(tokenizer, [row["input"] for row in kit.pair_rows()])
    # The receipt reads two rows: one unpadded, one with the most left padding (the pairs'
    # prompts differ in length on every built-in tokenizer).
    padding = (encoded["attention_mask"] == 0).sum(-1).tolist()
    assert min(padding) == 0 < max(padding) and found["rows"] == 2
    receipt = fidelity.receipt_pass(plan, model._model.config)
    assert receipt.rows == tuple(sorted({padding.index(0), padding.index(max(padding))}))
    assert found["max_abs_dlogit"] <= FP32
    assert found["dtype"] == "fp32" and set(found["versions"]) == set(fidelity.LIBRARIES)

    no_op, read, _ = fidelity.no_op_pass(fidelity.first_pass(plan), model._model.config)
    engine = run_pass(model, no_op, None).reads[read].reshape(len(kit.PAIRS), -1)
    with torch.no_grad():
        expected = plain(**encoded).logits[:, -1]
    assert (engine - expected).abs().max().item() <= FP32


def test_a_receipt_over_its_tolerance_refuses_the_run_naming_it(tiny, kit, tmp_path,
                                                                  monkeypatch):
    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path, "pairs", kit.pair_rows())
    plan = causalab.compile.compile_document(kit.patching_document(resolved), data_root=data_root)
    monkeypatch.setitem(fidelity.TOLERANCE, "fp32", -1.0)  # any difference, even 0, is over
    with pytest.raises(RunError, match="fidelity receipt 0: .* than -1, the tolerance for fp32"):
        entry.receipt(TraceRunner(load_model(plan.model)), plan, "fp32")


def test_the_plain_side_is_kept_per_weights_state_and_rows(tiny, kit, tmp_path, monkeypatch):
    """A rerun on the same weights and rows reuses the plain forward; a weight written in
    place meanwhile is a new state, seen by both sides (a kept plain forward would put the
    receipt far over its tolerance)."""
    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path, "pairs", kit.pair_rows())
    plan = causalab.compile.compile_document(kit.patching_document(resolved), data_root=data_root)
    model = load_model(plan.model)
    calls = []
    plain = fidelity.plain_logits
    monkeypatch.setattr(fidelity, "plain_logits", lambda *args: calls.append(1) or plain(*args))
    monkeypatch.setattr(fidelity, "_PLAIN", type(fidelity._PLAIN)())
    for _ in range(2):
        assert entry.receipt(TraceRunner(model), plan, "fp32")["max_abs_dlogit"] <= FP32
    assert len(calls) == 1
    weight = model._model.get_output_embeddings().weight
    kept = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(2.0)
        assert entry.receipt(TraceRunner(model), plan, "fp32")["max_abs_dlogit"] <= FP32
        assert len(calls) == 2
    finally:
        with torch.no_grad():
            weight.copy_(kept)


def test_the_receipt_rides_the_first_fused_fill_and_moves_no_number(tmp_path, monkeypatch):
    """A fused sweep whose un-intervened fill runs on the receipt's batch through the last
    block: the receipt's read is taken in that fill's trace (no trace of its own, ``explain
    --traces`` says so), it is still within fp32's bound, and every table is the bytes of a
    run without a receipt."""
    from causalab.engine import dry_run, runner
    from causalab.engine.events import Events
    from causalab.models import load_config, load_tokenizer
    from causalab.pipeline import compile_only, run_document

    raw = json.loads((REPO / "documents" / "v2" / "head_patching.json").read_text())
    data = str(REPO / "documents" / "data")

    class Receipts(Events):
        def receipt(self, found):
            receipts.append(found)

    def run(out: Path) -> tuple[int, dict]:
        opened, original = [], runner.run_trace
        with monkeypatch.context() as patch:
            patch.setattr(runner, "run_trace", lambda *args: opened.append(1) or original(*args))
            run_document(copy.deepcopy(raw), out=str(out), data_root=data, events=Receipts())
        return len(opened), {p.relative_to(out): p.read_bytes() for p in out.rglob("*.json")
                             if p.name != "run.json"}

    receipts: list = []
    traces, tables = run(tmp_path / "with")
    assert len(receipts) == 1 and receipts[0]["max_abs_dlogit"] <= FP32
    plan = compile_only(copy.deepcopy(raw), data)
    found = dry_run.schedule(plan, load_config(plan.model.path), load_tokenizer(plan.model.path))
    assert "riding the fill of 4 fused points" in found[0].where
    with monkeypatch.context() as patch:
        patch.setattr(fidelity, "receipt_pass", lambda plan, config: None)
        bare_traces, bare_tables = run(tmp_path / "without")
    assert receipts[1:] == [None]
    assert traces == bare_traces and tables == bare_tables


@pytest.mark.parametrize("change", ["an earlier block", "bf16"])
def test_a_receipt_whose_ride_would_cost_more_runs_alone_on_its_rows(change):
    """A fill that stops before the last block would run on through every block for the
    receipt (its own rows alone cost less), and in bf16 a batch's other rows may move a
    logit by a step of its mantissa: there the receipt runs its own trace of its rows."""
    from causalab.engine import dry_run
    from causalab.models import load_config, load_tokenizer
    from causalab.pipeline import compile_only

    raw = json.loads((REPO / "documents" / "v2" / "head_patching.json").read_text())
    if change == "bf16":
        raw["model"]["dtype"] = "bf16"
    else:
        raw["sites"]["head_out"]["layers"] = [0]
    plan = compile_only(raw, str(REPO / "documents" / "data"))
    found = dry_run.schedule(plan, load_config(plan.model.path), load_tokenizer(plan.model.path))
    assert found[0].where.startswith("fidelity receipt") and "riding" not in found[0].where
    assert found[0].job.kind == "reads" and len(found[0].job.rows) <= 2
    assert not any("receipt" in planned.where for planned in found[1:])
