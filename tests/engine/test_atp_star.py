"""AtP*'s corrections on the attribute step, each against plain torch hooks and autograd.

QK fix: a copy of the tiny Llama whose softmax saturates (layer 1's query weights scaled up)
and whose every path after layer 1's attention is linear (norms made linear by a huge
epsilon, their weights scaled back; layer 1's MLP zeroed), so exact patching of one head's
query equals the pattern's exact change times the pattern's gradient: the QK-fixed estimate
must equal exact patching done by hooks, and plain AtP must not. GradDrop: per dropped layer,
the gradient recomputed with that layer's attention and MLP outputs detached by hooks.
"""
from __future__ import annotations

import json

import pytest
import torch
from day_pairs import EQUAL_PAIRS

HEADS, HEAD_DIM = 4, 4
PROJECTIONS = {"attention_query": "q_proj", "attention_key": "k_proj"}
# How far plain AtP is at least from exact patching somewhere, per component.
MISSED = {"attention_query": 0.05, "attention_key": 0.0}
# The norms divide by sqrt(mean(x²) + EPS): with EPS ≫ mean(x²) they are x/1e6, linear to a
# relative 1e-12; their weights times 1e6 / rms(embeddings) keep the activations near unit rms.
EPS = 1e12
PAIRS = EQUAL_PAIRS


@pytest.fixture(scope="module")
def saturated(tiny, tmp_path_factory):
    """(resolved, eager transformers model, tokenizer) of the linearised, saturated copy."""
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer, resolve

    source = tiny("tiny-llama").path
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    model.config.rms_norm_eps = EPS
    attention = model.model.layers[1].self_attn
    with torch.no_grad():
        gain = EPS ** 0.5 / model.model.embed_tokens.weight.pow(2).mean().sqrt()
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.mul_(gain)
                module.variance_epsilon = EPS
        # The random weights are small: scaled, the END query's pattern saturates (its top
        # key holds 0.65 to 1 of it) and a head's patch moves the logit difference by up to 4.
        attention.q_proj.weight.mul_(1000.0)
        attention.v_proj.weight.mul_(30.0)
        attention.o_proj.weight.mul_(30.0)
        model.model.layers[1].mlp.down_proj.weight.zero_()
    folder = tmp_path_factory.mktemp("saturated")
    model.save_pretrained(folder)
    load_tokenizer(source).save_pretrained(folder)
    return resolve(str(folder)), model, load_tokenizer(str(folder))


def _document(kit, resolved, component: str, **fields) -> dict:
    doc = kit.patching_document(resolved, component=component)
    doc["model"]["attn_implementation"] = "eager"
    doc["steps"] = {"attribute": {"kind": "attribute", "interventions": "patch",
                                  "rows": {"base": "pairs", "counterfactual": "pairs"},
                                  "layers": [1] if component in PROJECTIONS else "all",
                                  "unit": "head", "metrics": ["logit_diff"], **fields,
                                  "saves": [{"value": "logit_diff",
                                             "file_path": "logit_diff.json"}]}}
    return doc


def _run(kit, tmp_path, document) -> list[dict]:
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(PAIRS))
    kit.run_compiled(document, data_root, tmp_path / "out")
    return json.loads((tmp_path / "out" / "logit_diff.json").read_text())


def _metric(tokenizer, rows):
    ids = [[tokenizer(r[c], add_special_tokens=False)["input_ids"][0] for r in rows]
           for c in ("cf_answer", "base_answer")]
    return lambda logits: logits[range(len(rows)), ids[0]] - logits[range(len(rows)), ids[1]]


def _exact_patching(model, tokenizer, kit, projection: str) -> torch.Tensor:
    """``(rows, heads)``: logit_diff with one head's layer-1 query (or key) at END taken from
    the counterfactual (equal lengths, so RoPE turns equal pre-rotary slices into equal
    queries and keys), minus the base's."""
    rows = kit.pair_rows(PAIRS)
    base = kit.encode(tokenizer, [r["input"] for r in rows])
    cf = kit.encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])
    q_proj = getattr(model.model.layers[1].self_attn, projection)
    metric, kept = _metric(tokenizer, rows), {}
    with torch.no_grad():
        handle = q_proj.register_forward_hook(lambda m, a, out: kept.__setitem__("cf", out))
        model(**cf)
        handle.remove()
        start = metric(model(**base).logits[:, -1])
        effects = []
        for head in range(HEADS):
            cut = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)

            def swap(m, a, out, cut=cut):
                out = out.clone()
                out[:, -1, cut] = kept["cf"][:, -1, cut]
                return out
            handle = q_proj.register_forward_hook(swap)
            effects.append(metric(model(**base).logits[:, -1]) - start)
            handle.remove()
    return torch.stack(effects, 1)


@pytest.mark.parametrize("component", ["attention_query", "attention_key"])
def test_the_qk_fix_equals_exact_patching_of_a_query_or_key_where_the_softmax_saturates(
        kit, saturated, tmp_path, component):
    resolved, model, tokenizer = saturated
    for row in kit.pair_rows(PAIRS):
        assert len(tokenizer(row["input"])["input_ids"]) == len(
            tokenizer(row["counterfactual_inputs"][0])["input_ids"])
    # 4 key-value heads on the tiny Llama: a key unit is one head's key, as a query unit is.
    exact = _exact_patching(model, tokenizer, kit, PROJECTIONS[component])
    fixed = _run(kit, tmp_path / "qk", _document(kit, resolved, component, qk_fix=True))
    plain = _run(kit, tmp_path / "atp", _document(kit, resolved, component))
    worst_plain = 0.0
    for one, other in zip(fixed, plain):
        row, head = int(one["example_id"].split("-")[1]), one["coordinates"]["heads"]
        # float32 forwards of logits near 10: both sides carry ~1e-5 of rounding.
        assert one["effect"] == pytest.approx(float(exact[row, head]), abs=2e-4)
        assert one["estimand_version"] == "logit_diff/v1 atp+qk"
        worst_plain = max(worst_plain, abs(other["effect"] - float(exact[row, head])))
    # The gradient at the saturated pattern misses a query's change; the END key alone moves
    # the END query's pattern too little here for plain AtP to be far off (5e-4).
    assert worst_plain > MISSED[component]


def _dropped_gradient_estimates(model, tokenizer, kit, dropped: int | None) -> dict:
    """``{layer: (rows, heads)}``: each head's AtP estimate at END with the gradient through
    layer ``dropped``'s attention and MLP outputs cut by ``detach`` in hooks (None: none)."""
    rows = kit.pair_rows(PAIRS)
    base = kit.encode(tokenizer, [r["input"] for r in rows])
    cf = kit.encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])
    layers, kept, leaves = model.model.layers, {}, {}
    handles = [layers[l].self_attn.o_proj.register_forward_pre_hook(
        lambda m, a, l=l: kept.__setitem__(l, a[0].detach().clone())) for l in (0, 1)]
    with torch.no_grad():
        model(**cf)
    for handle in handles:
        handle.remove()
    cf_values = dict(kept)

    def shift(m, a, l):
        leaves[l] = torch.zeros_like(a[0], requires_grad=True)
        kept[l] = a[0].detach().clone()
        return (a[0] + leaves[l],)

    def cut(m, a, out):
        return (out[0].detach(), *out[1:]) if isinstance(out, tuple) else out.detach()
    handles = [layers[l].self_attn.o_proj.register_forward_pre_hook(
        lambda m, a, l=l: shift(m, a, l)) for l in (0, 1)]
    if dropped is not None:
        handles += [layers[dropped].self_attn.register_forward_hook(cut),
                    layers[dropped].mlp.register_forward_hook(cut)]
    try:
        values = _metric(tokenizer, rows)(model(**base).logits[:, -1])
    finally:
        for handle in handles:
            handle.remove()
    grads = torch.autograd.grad(values.sum(), [leaves[0], leaves[1]], allow_unused=True)
    found = {}
    for l, grad in zip((0, 1), grads):
        grad = torch.zeros_like(leaves[l]) if grad is None else grad
        delta = cf_values[l][:, -1] - kept[l][:, -1]
        found[l] = (delta * grad[:, -1]).reshape(len(rows), HEADS, HEAD_DIM).sum(-1)
    return found


def test_graddrop_estimates_equal_gradients_with_one_layer_cut_by_hooks(kit, tiny, oracle,
                                                                        tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    doc = kit.patching_document(resolved, component="attention_premix")
    doc["steps"] = {"attribute": {"kind": "attribute", "interventions": "patch",
                                  "rows": {"base": "pairs", "counterfactual": "pairs"},
                                  "layers": "all", "unit": "head", "graddrop": True,
                                  "metrics": ["logit_diff"],
                                  "saves": [{"value": "logit_diff",
                                             "file_path": "logit_diff.json"}]}}
    table = _run(kit, tmp_path, doc)
    plain = _dropped_gradient_estimates(model, tokenizer, kit, None)
    per_layer = [_dropped_gradient_estimates(model, tokenizer, kit, l) for l in (0, 1)]
    moved = 0.0
    for entry in table:
        place, row = entry["coordinates"], int(entry["example_id"].split("-")[1])
        layer, head = place["layers"], place["heads"]
        expected = [float(found[layer][row, head]) for found in per_layer]
        # float32 gradients of one small model: rounding stays near 1e-7 of values near 1.
        assert entry["graddrop_layers"] == pytest.approx(expected, abs=1e-5)
        assert entry["effect"] == pytest.approx(float(plain[layer][row, head]), abs=1e-5)
        # AtP*'s combination over L = 2 layers: Σ_l |ĉ_l| / (L − 1).
        assert entry["graddrop"] == pytest.approx(sum(abs(v) for v in expected), abs=1e-5)
        moved += abs(expected[1] - entry["effect"])
    assert moved > 1e-4  # dropping layer 1 changed layer 0's estimates
