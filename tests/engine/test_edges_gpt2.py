"""EAP-IG edges on GPT-2's layout (``transformer.h``) against edge patching done by hand.

The model is the trained weekday GPT-2 built-in (4 blocks of 4 heads, width 64; LayerNorms,
one fused ``c_attn``, ``Conv1D`` projections with biases, learned absolute positions). The
oracle (``gpt2_oracle``) is written from GPT-2's formulas, not causalab's code: each sender
read by its own hooks, each receiver patched by plain hooks, per head for queries, keys and
values. ``c_proj``'s bias belongs to no sender: it is the same in every forward, a constant of
the stream, as TransformerLens's per-head ``hook_result`` leaves ``b_O`` out (MIB's graph).
"""
from __future__ import annotations

import json

import pytest
import torch

import gpt2_oracle
import qkv_oracle
from causalab.engine.attribution import edges
from day_pairs import EQUAL_PAIRS
from edge_curves import check_faithfulness


@pytest.fixture(scope="module")
def setup(tiny):
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    source = tiny("weekday-gpt2").path
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(source)
    base = dict(tokenizer([p[0] for p in EQUAL_PAIRS], return_tensors="pt"))
    cf = dict(tokenizer([p[1] for p in EQUAL_PAIRS], return_tensors="pt"))
    assert base["input_ids"].shape == cf["input_ids"].shape == (3, 7)  # no BOS on GPT-2
    good = torch.tensor([tokenizer(p[2]).input_ids[-1] for p in EQUAL_PAIRS])
    bad = torch.tensor([tokenizer(p[3]).input_ids[-1] for p in EQUAL_PAIRS])
    rows = torch.arange(len(EQUAL_PAIRS))

    def metric(logits):
        return logits[rows, good] - logits[rows, bad]
    return model, base, cf, metric


def _exact(model, base, cf, metric, found, eps: float = 1.0) -> torch.Tensor:
    """Each edge patched alone by hand (its sender's delta times ``eps``), the metric's change."""
    cf_out, base_out = gpt2_oracle.outputs(model, cf), gpt2_oracle.outputs(model, base)
    m_base = gpt2_oracle.run(model, base, metric, {}).mean()
    exact = []
    for u, v in found.edges():
        delta = eps * (cf_out[found.senders[u]] - base_out[found.senders[u]])
        exact.append(float(gpt2_oracle.run(model, base, metric,
                                {found.receivers[v]: lambda now, d=delta: d}).mean() - m_base))
    return torch.tensor(exact) / eps


def test_the_gpt2_layout_has_mibs_graph(setup):
    model, *_ = setup
    found = edges.graph(model)
    # 4 blocks of 4 heads: 1 + 4 · 5 senders, (12 + 1) · 4 + 1 receivers; MIB's graph of the
    # same shape has the same edges (GPT-2 small's 12 × 12: 32,491, MIB's count).
    assert (len(found.senders), len(found.receivers), len(found.edges())) == (21, 53, 479)
    assert edges.graph_of(4, 4).receivers == found.receivers
    assert int(edges.graph_of(12, 12).mask.sum()) == 32491
    # blocks: layer l's attention reads 1 + 5l senders, its MLP 5 + 5l, the logits 21.
    assert len(edges.graph(model, "blocks").edges()) == 34 + 50 + 21


def test_senders_sum_to_the_stream_up_to_the_biases(setup):
    """Every receiver's input is the senders before it plus ``c_proj``'s biases (constants):
    the logits' receiver checked on the base."""
    model, base, *_ = setup
    out = gpt2_oracle.outputs(model, base)
    caught = {}
    handle = model.transformer.ln_f.register_forward_pre_hook(
        lambda m, a: caught.__setitem__("x", a[0]))
    with torch.no_grad():
        model(**base)
    handle.remove()
    biases = sum(block.attn.c_proj.bias for block in model.transformer.h)
    total = sum(out.values()) + biases
    assert torch.allclose(total, caught["x"], atol=1e-4)


def test_eap_is_exact_per_head_patchings_first_order_term_on_gpt2(setup):
    model, base, cf, metric = setup
    found = edges.graph(model)
    exact = _exact(model, base, cf, metric, found, eps=1e-3)
    mean = edges.scores(model, base, cf, metric, steps=1).mean(0)
    estimate = torch.tensor([float(mean[e]) for e in found.edges()])
    worst = float((estimate - exact).abs().max() / exact.abs().max())
    print(f"GPT-2 first order, 479 per-head edges: max |EAP - exact/eps| = {worst:.2e}")
    # A receiver read at the wrong head or slice (q for k, another head's columns), a sender
    # with its bias or another head's rows is off at first order (order 1).
    assert worst < 5e-2


def test_eap_ig_ranks_gpt2_edges_as_exact_edge_patching_does(setup):
    model, base, cf, metric = setup
    found = edges.graph(model)
    exact = _exact(model, base, cf, metric, found)
    rho = {}
    for steps in (1, 5):
        mean = edges.scores(model, base, cf, metric, steps=steps).mean(0)
        rho[steps] = qkv_oracle.spearman(
            torch.tensor([float(mean[e]) for e in found.edges()]), exact)
    print(f"GPT-2 479 per-head edges, Spearman against exact edge patching: "
          f"EAP {rho[1]:.3f}, EAP-IG steps=5 {rho[5]:.3f}")
    # Measured EAP 0.775, EAP-IG (5 steps) 0.567: the trained model's weekday swap moves the
    # logit difference by 22, far from linear (the first-order test above agrees to 1.5e-3), as
    # on the weekday Llama (issue 61: 0.56). A shuffled ranking of 479 edges lies near 0 ± 0.05.
    assert rho[1] > 0.7 and rho[5] > 0.45


def test_gpt2_head_faithfulness_equals_hand_patched_circuits(setup):
    model, base, cf, metric = setup
    check_faithfulness(model, base, cf, metric, [0, 20, 100, 300, 479], (20, 100, 300),
                       gpt2_oracle.outputs(model, cf),
                       lambda batch, adds: gpt2_oracle.run(model, batch, metric, adds))


def test_gpt2_block_faithfulness_equals_hand_patched_circuits(setup):
    model, base, cf, metric = setup
    total = len(edges.graph(model, "blocks").edges())
    check_faithfulness(model, base, cf, metric, [0, 5, 20, 40, total], (5, 20, 40),
                       gpt2_oracle.outputs(model, cf),
                       lambda batch, adds: gpt2_oracle.run(model, batch, metric, adds), receivers="blocks")


def test_an_edges_step_runs_on_the_gpt2_built_in(kit, tiny, tmp_path, setup):
    model, *_ = setup
    resolved = tiny("weekday-gpt2")
    doc = kit.patching_document(resolved, component="attention_output", layer=0)
    doc["steps"] = {"circuit": {"kind": "attribute", "interventions": "patch",
                                "rows": {"base": "pairs", "counterfactual": "pairs"},
                                "metrics": ["logit_diff"], "edges": True, "steps": 5}}
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    kit.run_compiled(doc, data_root, tmp_path / "out")
    table = json.loads((tmp_path / "out" / "circuit.edges.json").read_text())
    curve = json.loads((tmp_path / "out" / "circuit.faithfulness.json").read_text())
    assert len(table) == 479
    assert curve["faithfulness"][0] == pytest.approx(0.0, abs=1e-4)
    assert curve["faithfulness"][-1] == pytest.approx(1.0, abs=1e-4)
    assert curve["graph"] == {"layers": 4, "heads": 4, "kv_heads": 4, "d_model": 64,
                              "layout": "gpt2", "receivers": "heads"}
    # The step's logit_diff is logit(cf answer) - logit(base answer): the hand metric negated,
    # so the step's scores are the hand EAP-IG's negated, edge by edge.
    tokenizer_rows = kit.pair_rows(EQUAL_PAIRS)
    assert [r["cf_answer"] for r in tokenizer_rows] == [p[3] for p in EQUAL_PAIRS]
    _, base, cf, metric = setup
    found = edges.graph(model)
    mean = edges.scores(model, base, cf, metric, steps=5).mean(0)
    by_name = {(found.senders[u], found.receivers[v]): -float(mean[u, v])
               for u, v in found.edges()}
    assert [e["score"] for e in table] == pytest.approx(
        [by_name[(e["sender"], e["receiver"])] for e in table], rel=1e-4, abs=1e-6)
