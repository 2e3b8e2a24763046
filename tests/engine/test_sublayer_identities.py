"""Sublayer outputs are what the residual stream receives, on every family (docs/format.md §5.2).

``block_mid = block_input + attention_output`` and ``block_output = block_mid + mlp_output``
hold exactly on every family, Gemma-2's sandwich norms included: there the sublayer outputs
are the post-attention and post-feedforward norms' outputs. The oracle is a plain
transformers forward with hooks placed by hand per family below.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

# fp32 on CPU: the block's own sums are single additions of the tensors read, so the
# identities and the hook comparison hold to rounding of one add (far below 1e-6).
TOL = dict(atol=1e-6, rtol=1e-6)
LAYERS = (0, 1)
LAST = 4  # the last four tokens: inside every prompt, past the left padding
PARTS = ("block_input", "attention_output", "block_mid", "mlp_output", "block_output")


def _family_hooks(block, family: str) -> dict:
    """Where each part sits in a plain transformers block: (module, "pre"|"post")."""
    if family == "tiny-gemma2":
        return {"attention_output": (block.post_attention_layernorm, "post"),
                "block_mid": (block.pre_feedforward_layernorm, "pre"),
                "mlp_output": (block.post_feedforward_layernorm, "post")}
    if family == "tiny-gpt2":
        return {"attention_output": (block.attn, "post"), "block_mid": (block.ln_2, "pre"),
                "mlp_output": (block.mlp, "post")}
    return {"attention_output": (block.self_attn, "post"),
            "block_mid": (block.post_attention_layernorm, "pre"),
            "mlp_output": (block.mlp, "post")}


def _oracle(model, family: str, enc: dict) -> dict:
    """{(part, layer): (rows, seq, d)} from one hooked forward."""
    blocks = model.transformer.h if family == "tiny-gpt2" else model.model.layers
    seen, handles = {}, []

    def keep(key, pre):
        def hook(module, args, *rest):
            value = (args[0] if args else rest[0]["hidden_states"]) if pre else rest[-1]
            seen[key] = (value[0] if isinstance(value, tuple) else value).clone()
        return hook
    for layer in LAYERS:
        where = dict(_family_hooks(blocks[layer], family), block_input=(blocks[layer], "pre"),
                     block_output=(blocks[layer], "post"))
        for part, (module, side) in where.items():
            if side == "pre":
                handles.append(module.register_forward_pre_hook(keep((part, layer), True), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(keep((part, layer), False)))
    try:
        with torch.no_grad():
            model(**enc)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _document(resolved) -> dict:
    sites = {f"{p}{l}": {"component": p, "layers": [l]} for p in PARTS for l in LAYERS}
    sites["ids"] = {"component": "input_ids"}
    reads = {name: {"site": name, "pos": {"last": LAST}, "input": "base"} for name in sites}
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}},
        "sites": sites,
        "interventions": {"look": {"reads": reads}},
        "steps": {"look": {"kind": "observe", "interventions": "look", "rows": {"base": "pairs"},
                           "outputs": {"ids_out": "ids", "mid_out": "block_mid0"},
                           "saves": [{"value": "ids_out", "file_path": "ids.safetensors"},
                                     {"value": "mid_out", "file_path": "mid.safetensors"}]}},
    }


SMOLLM2 = "smollm2-135m"


def _families() -> list:
    """The four tiny families and SmolLM2 (dequantized once per session, shared with the
    smollm2 tests)."""
    return ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2", SMOLLM2]


def _resolved(family, tiny, request):
    if family == SMOLLM2:
        request.getfixturevalue("smollm2_dir")  # the suite's one place that materialises it
    return tiny(family)


@pytest.mark.parametrize("family", _families())
def test_each_sublayer_output_is_what_the_residual_receives_so_the_block_sums_hold(family, tiny, oracle, kit, tmp_path, request):
    resolved = _resolved(family, tiny, request)
    model, tokenizer = oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = kit.run_compiled(_document(resolved), data_root, tmp_path / "out")
    reads = kit.step(plan, "look").results["reads"]
    enc = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    want = _oracle(model, family, enc)
    for layer in LAYERS:
        got = {part: reads[f"{part}{layer}"] for part in PARTS}
        assert torch.allclose(got["block_mid"], got["block_input"] + got["attention_output"], **TOL)
        assert torch.allclose(got["block_output"], got["block_mid"] + got["mlp_output"], **TOL)
        for part in PARTS:
            assert torch.allclose(got[part], want[(part, layer)][:, -LAST:], **TOL), (part, layer)
    assert reads["ids"].dtype == torch.int64 and torch.equal(reads["ids"], enc["input_ids"][:, -LAST:])
    saved = {name: load_file(str(tmp_path / "out" / f"{name}.safetensors"))["weight"] for name in ("ids", "mid")}
    assert saved["ids"].dtype == torch.int64 and torch.equal(saved["ids"], reads["ids"])
    assert saved["mid"].dtype == torch.float32


def _zeroing_document(resolved) -> dict:
    sites = {"attn": {"component": "attention_output", "layers": [0]},
             "mlp": {"component": "mlp_output", "layers": [1]}, "head": {"component": "logits"}}
    writes = {name: {"site": name, "pos": -1, "mechanism": "swap", "operand": 0.0} for name in ("attn", "mlp")}
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}},
        "sites": sites,
        "interventions": {"look": {
            "reads": {"logits": {"site": "head", "pos": -1, "model": "zeroed", "input": "base"}},
            "writes": writes, "models": {"zeroed": {"input": "base", "writes": ["attn", "mlp"]}}}},
        "steps": {"look": {"kind": "observe", "interventions": "look", "rows": {"base": "pairs"}}},
    }


@pytest.mark.parametrize("family", _families())
def test_zeroing_a_sublayer_output_removes_what_the_residual_would_have_added(family, tiny, oracle, kit, tmp_path, request):
    resolved = _resolved(family, tiny, request)
    model, tokenizer = oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = kit.run_compiled(_zeroing_document(resolved), data_root, tmp_path / "out")
    got = kit.step(plan, "look").results["reads"]["logits"][:, 0]
    blocks = model.transformer.h if family == "tiny-gpt2" else model.model.layers

    def zero_last(module, args, output):
        tensor = (output[0] if isinstance(output, tuple) else output).clone()
        tensor[:, -1] = 0.0
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    handles = [_family_hooks(blocks[0], family)["attention_output"][0].register_forward_hook(zero_last),
               _family_hooks(blocks[1], family)["mlp_output"][0].register_forward_hook(zero_last)]
    try:
        with torch.no_grad():
            want = model(**kit.encode(tokenizer, [p[0] for p in kit.PAIRS])).logits[:, -1]
    finally:
        for handle in handles:
            handle.remove()
    assert torch.allclose(got, want, **TOL)
