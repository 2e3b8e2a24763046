"""A trace stops after its last tap when nothing above it is read (engine/planner.py ``_job``).

No tap from the head, no cache, no next token: the blocks above the deepest tap do not run.
The values must be the ones a plain transformers forward gives (torch hooks), and bit for
bit the ones the trace gives when it runs every block.
"""
from __future__ import annotations

import pytest
import torch

from causalab.engine import planner

TOL = dict(atol=1e-6, rtol=1e-6)


@pytest.fixture()
def blocks_run(monkeypatch):
    """How many decoder blocks ran, counted on every module call of this test."""
    calls = []

    def count(module, args):
        if type(module).__name__.endswith(("DecoderLayer", "Block")):
            calls.append(type(module).__name__)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    yield calls
    handle.remove()


def _document(kit, resolved) -> dict:
    """Swap block_output[0]'s last column in from the counterfactual and read the patched
    block_output[0] there and at -2: every tap sits in block 0 of 2."""
    document = kit.patching_document(resolved)
    patch = document["interventions"]["patch"]
    patch["reads"] = {"v_cf": patch["reads"]["v_cf"],
                      "mid": {"site": "target", "pos": -2, "model": "patched", "input": "base"},
                      "own": {"site": "target", "pos": -1, "model": "patched", "input": "base"}}
    patch["metrics"] = {}
    del document["sites"]["head"]
    document["steps"]["patch"]["saves"] = []
    return document


def _loaded(document: dict) -> None:
    """Load the document's model now: loading runs the blocks once, outside any trace."""
    from causalab.compile.plan import ModelRef
    from causalab.engine.weights import load_model
    from causalab.models import resolve

    model = document["model"]
    load_model(ModelRef(model["key"], model["revision"], model["dtype"], None,
                        resolve(model["key"]).path))


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2"])
def test_a_trace_runs_no_block_above_its_last_tap(family, tiny, oracle, kit, tmp_path,
                                                   blocks_run, monkeypatch):
    resolved = tiny(family)
    rows = kit.pair_rows()
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    document = _document(kit, resolved)
    _loaded(document)
    blocks_run.clear()
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    # Two traces (the counterfactual's, the patched base's), block 0 of 2 in each.
    assert len(blocks_run) == 2, blocks_run
    reads = kit.step(plan, "patch").results["reads"]
    want = kit.patched_forward(*oracle(resolved.path), rows)[1]
    assert torch.allclose(reads["own"][:, 0], want[:, -1], **TOL)
    assert torch.allclose(reads["mid"][:, 0], want[:, -2], **TOL)

    blocks_run.clear()
    monkeypatch.setattr(planner, "_no_logits", lambda prepared: False)  # every block runs
    every = kit.step(kit.run_compiled(document, data_root, tmp_path / "every"),
                     "patch").results["reads"]
    assert len(blocks_run) == 4, blocks_run
    assert all(torch.equal(reads[name], every[name]) for name in ("own", "mid", "v_cf"))


def test_a_head_read_runs_every_block(tiny, kit, tmp_path, blocks_run):
    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = kit.patching_document(resolved)
    _loaded(document)
    blocks_run.clear()
    kit.run_compiled(document, data_root, tmp_path / "out")
    # The counterfactual's trace stops after block 0; the patched one reads the head.
    assert len(blocks_run) == 1 + 2, blocks_run
