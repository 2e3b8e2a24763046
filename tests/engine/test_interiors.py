"""Attention interiors (queries, keys, patterns, z) against attention written out in plain torch.

The oracle is a transformers model loaded with eager attention whose modeling module's
``eager_attention_forward`` is replaced, for the test's duration, by the function below: the
same arithmetic spelled out, with a hook on each interior tensor of one layer (the query and
key as the kernel receives them, keys before grouped-query repetition; the scores; the
probabilities; the mixed values). fp32, 1e-6.
"""
from __future__ import annotations

import contextlib
import sys

import pytest
import torch

TOL = dict(atol=1e-6, rtol=1e-6)
FAMILIES = ["tiny-llama", "tiny-gpt2", "tiny-qwen2"]


def _same(x):
    return x


def _eager(hooks: dict):
    """``eager_attention_forward`` in plain torch; ``hooks[layer][tensor](value) -> value``."""
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        on = hooks.get(module.layer_idx, {})
        query = on.get("query", _same)(query)
        key = on.get("key", _same)(key)
        groups = query.shape[1] // key.shape[1]
        keys = key.repeat_interleave(groups, dim=1)
        values = value.repeat_interleave(groups, dim=1)
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : keys.shape[-2]]
        scores = on.get("scores", _same)(scores)
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        probs = on.get("probs", _same)(probs)
        z = torch.matmul(probs, values).transpose(1, 2).contiguous()
        return on.get("z", _same)(z), probs
    return attention


@contextlib.contextmanager
def _attention_hooks(model, hooks: dict):
    module = sys.modules[type(model).__module__]
    original = module.eager_attention_forward
    module.eager_attention_forward = _eager(hooks)
    try:
        yield
    finally:
        module.eager_attention_forward = original


@pytest.fixture(scope="module")
def eager_oracle():
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    loaded = {}

    def _get(path):
        if path not in loaded:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
            loaded[path] = (model, load_tokenizer(path))
        return loaded[path]
    return _get


def _logits(model, enc, hooks: dict) -> torch.Tensor:
    with _attention_hooks(model, hooks), torch.no_grad():
        return model(**enc).logits[:, -1]


# Where the interior tensor's sequence axis is, and how one position flattens to features.
def _at(name: str, value: torch.Tensor, position: int) -> torch.Tensor:
    if name == "z":  # (batch, seq, heads, head_dim)
        return value[:, position].flatten(1)
    return value[:, :, position].flatten(1)  # (batch, heads, seq, X)


def _put(name: str, value: torch.Tensor, position: int, new: torch.Tensor, heads) -> torch.Tensor:
    """``value`` with ``new`` (batch, features) placed at ``position`` on the named heads."""
    value = value.clone()
    view = value[:, position] if name == "z" else value[:, :, position]
    shaped = new.reshape(view.shape)
    take = range(view.shape[1 if name != "z" else 1]) if heads is None else heads
    for head in take:
        view[:, head] = shaped[:, head]
    return value


COMPONENTS = {"attention_query": "query", "attention_key": "key", "attention_z": "z",
              "attention_scores": "scores", "attention_probs": "probs"}


def _document(resolved, sites, reads, *, writes=None, models=None, eager=True, table="pairs"):
    model = {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"}
    if eager:
        model["attn_implementation"] = "eager"
    body = {"reads": reads, **({"writes": writes, "models": models} if writes else {})}
    roles = {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}}
    used = {read["input"] for read in reads.values()}
    return {"model": model, "roles": {r: v for r, v in roles.items() if r in used},
            "sites": sites, "interventions": {"look": body},
            "steps": {"look": {"kind": "observe", "interventions": "look",
                               "rows": {role: table for role in used}}}}


@pytest.mark.parametrize("family", FAMILIES)
def test_interior_reads_equal_the_tensors_plain_attention_computes(family, tiny, eager_oracle, kit, tmp_path):
    resolved = tiny(family)
    model, tokenizer = eager_oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    sites = {c: {"component": c, "layers": [1]} for c in COMPONENTS}
    reads = {"r_" + c: {"site": c, "pos": -2, "input": "base"} for c in COMPONENTS}
    plan = kit.run_compiled(_document(resolved, sites, reads), data_root, tmp_path / "out")
    got = kit.step(plan, "look").results["reads"]
    seen = {}

    def capture(name):
        def hook(value):
            seen[name] = value.clone()
            return value
        return hook
    enc = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    _logits(model, enc, {1: {name: capture(name) for name in COMPONENTS.values()}})
    for component, name in COMPONENTS.items():
        want = _at(name, seen[name], -2)
        assert got["r_" + component][:, 0].shape == want.shape, component
        assert torch.allclose(got["r_" + component][:, 0], want, **TOL), component
    kv_heads = seen["key"].shape[1]
    assert got["r_attention_key"].shape[-1] == kv_heads * seen["key"].shape[-1]


SWAPS = [("attention_query", None), ("attention_key", [1]), ("attention_z", [0, 2])]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("component,heads", SWAPS, ids=["query", "key_head1", "z_heads02"])
def test_an_interior_swap_gives_the_logits_a_hooked_attention_gives(family, component, heads, tiny, eager_oracle, kit, tmp_path):
    resolved = tiny(family)
    model, tokenizer = eager_oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    site = {"component": component, "layers": [0], **({"heads": heads} if heads else {})}
    sites = {"target": site, "head": {"component": "lm_head"}}
    reads = {"v_cf": {"site": "target", "pos": -1, "input": "counterfactual"},
             "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}}
    writes = {"patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf"}}
    models = {"patched": {"input": "base", "writes": ["patch"]}}
    document = _document(resolved, sites, reads, writes=writes, models=models, eager=False)
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    got = kit.step(plan, "look").results["reads"]["logits"][:, 0]
    name = COMPONENTS[component]
    seen = {}

    def capture(value):
        seen["v"] = _at(name, value, -1)
        return value
    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    cf = kit.encode(tokenizer, [p[1] for p in kit.PAIRS])
    _logits(model, cf, {0: {name: capture}})
    want = _logits(model, base, {0: {name: lambda v: _put(name, v, -1, seen["v"], heads)}})
    assert torch.allclose(got, want, **TOL)
    assert not torch.allclose(got, _logits(model, base, {}), **TOL)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("component,value", [("attention_scores", 0.0), ("attention_probs", 0.25)],
                         ids=["scores", "probs"])
def test_a_pattern_write_gives_the_logits_a_hooked_attention_gives(family, component, value, tiny, eager_oracle, kit, tmp_path):
    resolved = tiny(family)
    model, tokenizer = eager_oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    sites = {"target": {"component": component, "layers": [0], "heads": [1]},
             "head": {"component": "lm_head"}}
    reads = {"logits": {"site": "head", "pos": -1, "model": "written", "input": "base"}}
    writes = {"set": {"site": "target", "pos": -1, "mechanism": "swap", "operand": value}}
    models = {"written": {"input": "base", "writes": ["set"]}}
    plan = kit.run_compiled(_document(resolved, sites, reads, writes=writes, models=models),
                            data_root, tmp_path / "out")
    got = kit.step(plan, "look").results["reads"]["logits"][:, 0]
    name = COMPONENTS[component]

    def write(pattern):
        pattern = pattern.clone()
        pattern[:, 1, -1] = value
        return pattern
    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    want = _logits(model, base, {0: {name: write}})
    assert torch.allclose(got, want, **TOL)
    assert not torch.allclose(got, _logits(model, base, {}), **TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pattern_swapped_between_prompts_of_one_length_gives_the_hooked_logits(family, tiny, eager_oracle, kit, tmp_path):
    import json

    resolved = tiny(family)
    model, tokenizer = eager_oracle(resolved.path)
    rows = json.loads(open("documents/data/weekdays_aligned/data.json").read())[:3]
    data_root = kit.write_table(tmp_path / "data", "aligned", rows)
    sites = {"pattern": {"component": "attention_probs", "layers": [1], "heads": [0]},
             "head": {"component": "lm_head"}}
    reads = {"cf": {"site": "pattern", "pos": -1, "input": "counterfactual"},
             "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}}
    writes = {"patch": {"site": "pattern", "pos": -1, "mechanism": "swap", "operand": "cf"}}
    models = {"patched": {"input": "base", "writes": ["patch"]}}
    document = _document(resolved, sites, reads, writes=writes, models=models, table="aligned")
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    got = kit.step(plan, "look").results["reads"]["logits"][:, 0]
    seen = {}

    def capture(value):
        seen["p"] = value[:, 0, -1].clone()
        return value

    def swap(value):
        value = value.clone()
        value[:, 0, -1] = seen["p"]
        return value
    base = kit.encode(tokenizer, [row["input"] for row in rows])
    cf = kit.encode(tokenizer, [row["counterfactual_inputs"][0] for row in rows])
    _logits(model, cf, {1: {"probs": capture}})
    assert torch.allclose(got, _logits(model, base, {1: {"probs": swap}}), **TOL)


def _blocks(model):
    inner = getattr(model, "model", None) or model.transformer
    return inner.layers if hasattr(inner, "layers") else inner.h


def _mid_hooks(block, seen: dict, swap=None):
    """Hooks making ``swap`` (batch, d) the residual after attention at the last position.

    The residual after attention is the pre-MLP norm's input; the block's output is rebuilt
    as the swapped residual plus whatever the block adds after its MLP.
    """
    children = dict(block.named_children())
    norm = next(children[n] for n in ("pre_feedforward_layernorm", "post_attention_layernorm", "ln_2")
                if n in children)
    branch = children.get("post_feedforward_layernorm", children["mlp"])

    def pre(module, args):
        x = args[0].clone()
        seen["cf"] = x[:, -1].clone()
        if swap is not None:
            x[:, -1] = swap
        seen["mid"] = x
        return (x, *args[1:])

    def added(module, args, output):
        seen["branch"] = output

    def out(module, args, output):
        return seen["mid"] + seen["branch"] if swap is not None else output
    return [norm.register_forward_pre_hook(pre), branch.register_forward_hook(added),
            block.register_forward_hook(out)]


def _mid_patching(resolved, operand_input: str) -> dict:
    # "logits", not "lm_head": the oracle's logits are Gemma-2's softcapped ones.
    sites = {"mid": {"component": "block_mid", "layers": [0]}, "out": {"component": "block_output", "layers": [0]},
             "head": {"component": "logits"}}
    reads = {"v": {"site": "mid", "pos": -1, "input": operand_input},
             "after": {"site": "out", "pos": -1, "model": "patched", "input": "base"},
             "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}}
    writes = {"patch": {"site": "mid", "pos": -1, "mechanism": "swap", "operand": "v"}}
    models = {"patched": {"input": "base", "writes": ["patch"]}}
    return _document(resolved, sites, reads, writes=writes, models=models, eager=False)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-gemma2"])
def test_a_block_mid_swap_carries_into_the_mlp_and_the_stream_after_the_block(family, tiny, oracle, kit, tmp_path):
    resolved = tiny(family)
    model, tokenizer = oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = kit.run_compiled(_mid_patching(resolved, "counterfactual"), data_root, tmp_path / "out")
    reads = kit.step(plan, "look").results["reads"]
    block = _blocks(model)[0]
    seen: dict = {}
    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    cf = kit.encode(tokenizer, [p[1] for p in kit.PAIRS])
    handles = _mid_hooks(block, seen)
    with torch.no_grad():
        model(**cf)
    for handle in handles:
        handle.remove()
    handles = _mid_hooks(block, seen, swap=seen["cf"])
    after = {}
    handles.append(block.register_forward_hook(lambda m, a, o: after.update(v=o[:, -1].clone())))
    try:
        with torch.no_grad():
            want = model(**base).logits[:, -1]
    finally:
        for handle in handles:
            handle.remove()
    assert torch.allclose(reads["after"][:, 0], after["v"], **TOL)
    assert torch.allclose(reads["logits"][:, 0], want, **TOL)
    with torch.no_grad():
        assert not torch.allclose(want, model(**base).logits[:, -1], **TOL)


def test_a_block_mid_write_of_its_own_value_leaves_the_forward_bit_identical(tiny, kit, tmp_path):
    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = _mid_patching(resolved, "base")
    document["interventions"]["look"]["reads"]["clean"] = {"site": "head", "pos": -1, "input": "base"}
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    reads = kit.step(plan, "look").results["reads"]
    assert torch.equal(reads["logits"], reads["clean"])
