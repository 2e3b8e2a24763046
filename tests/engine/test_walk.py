"""The walk on nnterp against a plain transformers forward with torch hooks (fp32, 1e-6)."""
from __future__ import annotations

import json

import pytest
import torch

from causalab.errors import RunError

TOL = dict(atol=1e-6, rtol=1e-6)


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def _hooked(model, enc, hooks):
    """Run ``model`` once with ``hooks`` = [(module, "pre"|"post", fn)] and remove them after."""
    handles = []
    for module, side, fn in hooks:
        if side == "pre":
            handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
        else:
            handles.append(module.register_forward_hook(fn))
    try:
        with torch.no_grad():
            return model(**enc).logits
    finally:
        for handle in handles:
            handle.remove()


def _capture(store, key, position):
    def post(module, args, output):
        store[key] = _first(output)[:, position].clone()
    return post


def _capture_input(store, key, position):
    def pre(module, args, kwargs):
        value = args[0] if args else kwargs["hidden_states"]
        store[key] = value[:, position].clone()
    return pre


def _replace_last(value):
    def post(module, args, output):
        tensor = _first(output).clone()
        tensor[:, -1] = value
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    return post


@pytest.fixture()
def llama(tiny, oracle, kit, tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    return resolved, model, tokenizer, data_root


def test_a_patched_forward_gives_the_logits_a_hook_oracle_gives(llama, kit, tmp_path):
    resolved, model, tokenizer, data_root = llama
    plan = kit.run_compiled(kit.patching_document(resolved), data_root, tmp_path / "out")
    got = kit.step(plan, "patch").results["reads"]["logits"][:, 0]
    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    cf = kit.encode(tokenizer, [p[1] for p in kit.PAIRS])
    store = {}
    _hooked(model, cf, [(model.model.layers[0], "post", _capture(store, "v", -1))])
    want = _hooked(model, base, [(model.model.layers[0], "post", _replace_last(store["v"]))])[:, -1]
    assert torch.allclose(got, want, **TOL)
    clean = _hooked(model, base, [])[:, -1]
    assert not torch.allclose(got, clean, **TOL)


READS = {
    "embeddings": (None, lambda m: (m.model.embed_tokens, "post")),
    "block_input": (1, lambda m: (m.model.layers[1], "pre")),
    "attention_input_norm": (0, lambda m: (m.model.layers[0].self_attn, "pre")),
    "attention_premix": (1, lambda m: (m.model.layers[1].self_attn.o_proj, "pre")),
    "attention_z": (1, lambda m: (m.model.layers[1].self_attn.o_proj, "pre")),
    "attention_output": (0, lambda m: (m.model.layers[0].self_attn, "post")),
    "block_mid": (0, lambda m: (m.model.layers[0].post_attention_layernorm, "pre")),
    "mlp_input": (1, lambda m: (m.model.layers[1].mlp, "pre")),
    "mlp_activation": (0, lambda m: (m.model.layers[0].mlp.act_fn, "post")),
    "mlp_neuron_output": (0, lambda m: (m.model.layers[0].mlp.down_proj, "pre")),
    "mlp_output": (1, lambda m: (m.model.layers[1].mlp, "post")),
    "block_output": (1, lambda m: (m.model.layers[1], "post")),
    "ln_final": (None, lambda m: (m.model.norm, "post")),
    "lm_head": (None, lambda m: (m.lm_head, "post")),
}


def _reading_document(resolved, components, pos) -> dict:
    sites, reads = {}, {}
    for name in components:
        layer = READS[name][0]
        sites[name] = {"component": name, **({"layers": [layer]} if layer is not None else {})}
        reads["r_" + name] = {"site": name, "pos": pos, "input": "base"}
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}},
        "sites": sites,
        "interventions": {"look": {"reads": reads}},
        "steps": {"look": {"kind": "observe", "interventions": "look", "rows": {"base": "pairs"}}},
    }


def test_reads_at_every_module_boundary_equal_torch_hooks(llama, kit, tmp_path):
    resolved, model, tokenizer, data_root = llama
    document = _reading_document(resolved, list(READS), -2)
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    reads = kit.step(plan, "look").results["reads"]
    store, hooks = {}, []
    for name, (_, where) in READS.items():
        module, side = where(model)
        fn = _capture(store, name, -2) if side == "post" else _capture_input(store, name, -2)
        hooks.append((module, side, fn))
    _hooked(model, kit.encode(tokenizer, [p[0] for p in kit.PAIRS]), hooks)
    for name in READS:
        want = store[name].reshape(len(kit.PAIRS), -1)
        assert torch.allclose(reads["r_" + name][:, 0], want, **TOL), name


def _steering_document(resolved) -> dict:
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}},
        "sites": {"target": {"component": "block_output", "layers": [0]}, "head": {"component": "lm_head"}},
        "interventions": {"steer": {
            "reads": {"logits": {"site": "head", "pos": -1, "model": "steered", "input": "base"}},
            "writes": {"push": {"site": "target", "pos": -1, "mechanism": "add_scaled",
                                "operand": 1.0, "params": {"scale": 2.0}},
                       "restore": {"site": "target", "pos": -1, "mechanism": "renormalize"}},
            "models": {"steered": {"input": "base", "writes": ["push", "restore"]}},
        }},
        "steps": {"steer": {"kind": "observe", "interventions": "steer", "rows": {"base": "pairs"}}},
    }


def test_several_writes_at_one_site_apply_in_list_order_against_the_value_before_them(llama, kit, tmp_path):
    resolved, model, tokenizer, data_root = llama
    plan = kit.run_compiled(_steering_document(resolved), data_root, tmp_path / "out")
    got = kit.step(plan, "steer").results["reads"]["logits"][:, 0]

    def steer(module, args, output):
        tensor = _first(output).clone()
        x = tensor[:, -1]
        pushed = x + 2.0 * 1.0
        tensor[:, -1] = pushed * x.norm(dim=-1, keepdim=True) / pushed.norm(dim=-1, keepdim=True)
        return tensor
    enc = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    want = _hooked(model, enc, [(model.model.layers[0], "post", steer)])[:, -1]
    assert torch.allclose(got, want, **TOL)


def test_the_logit_lens_at_the_last_layer_is_the_models_own_prediction(llama, kit, tmp_path):
    resolved, _, _, data_root = llama
    document = _reading_document(resolved, ["lm_head"], -1)
    document["sites"]["last"] = {"component": "block_output", "layers": [1]}
    document["interventions"]["look"]["reads"]["lens"] = {
        "site": "last", "pos": -1, "input": "base", "view": "logits"}
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    reads = kit.step(plan, "look").results["reads"]
    lens, own = reads["lens"][:, 0], reads["r_lm_head"][:, 0]
    assert torch.allclose(lens, own, atol=1e-5, rtol=1e-5)
    assert torch.equal(lens.argmax(-1), own.argmax(-1))


def test_a_row_with_an_empty_answer_cell_stays_in_the_table_as_not_eligible(tiny, kit, tmp_path):
    from causalab.pipeline import run_document

    resolved = tiny("tiny-llama")
    rows = kit.pair_rows(cf_answers=[" Saturday", None, " Sunday"])
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    run_document(kit.patching_document(resolved), out=str(tmp_path / "out"), data_root=data_root)
    table = json.loads((tmp_path / "out" / "iia.json").read_text())
    assert [row["eligible"] for row in table] == [True, False, True]
    assert table[1]["value"] is None and table[1]["example_id"] == "pair-1"
    assert table[0]["value"] in (0.0, 1.0) and table[0]["positions"] is None


def test_the_same_document_run_twice_writes_byte_identical_tables_and_run_records(tiny, kit, tmp_path):
    from causalab.pipeline import run_document

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = kit.patching_document(resolved)
    for out in ("first", "second"):
        run_document(document, out=str(tmp_path / out), data_root=data_root)
    for name in ("logit_diff.json", "iia.json", "run.json", "document.json"):
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes()
    record = json.loads((tmp_path / "first" / "run.json").read_text())
    assert record["remote"] is False and record["served_dtype"] == "torch.float32"
    assert set(record["versions"]) == {"torch", "transformers", "nnsight", "nnterp", "pydantic"}


def test_a_write_whose_anchor_is_missing_on_a_row_is_refused_naming_the_write(tiny, kit, tmp_path):
    document, data_root = kit.unplaceable_write(tiny("tiny-llama"), tmp_path / "data")
    document["interventions"]["patch"]["reads"]["v_cf"]["pos"] = -1
    with pytest.raises(RunError) as caught:
        kit.run_compiled(document, data_root, tmp_path / "out")
    assert caught.value.path == ("interventions", "patch", "writes", "patch")
    assert "pair-2" in caught.value.message


def test_the_shared_cache_keys_a_scoped_read_on_its_rows_anchor_values(tiny, kit, tmp_path):
    from dataclasses import replace

    import causalab.compile
    from causalab.engine.forwards import read_key

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = causalab.compile.compile_document(kit.patching_document(resolved), data_root=data_root)
    pass_ = kit.step(plan, "patch").pass_
    read = next(r for f in pass_.forwards for r in f.reads if r.name == "v_cf")
    batch = pass_.inputs[read.input]
    one = replace(batch, anchors={"day": ("Friday",) * pass_.rows})
    other = replace(batch, anchors={"day": ("today",) * pass_.rows})
    scoped = replace(read, pos=replace(read.pos, variable="day", ragged=True))
    assert read_key(one, scoped) != read_key(other, scoped)
    assert read_key(one, read) == read_key(other, read)
