"""Generation (docs/format.md §11) against a plain transformers greedy loop over a KV cache, with hooks.

The oracle decodes with ``model(input_ids, attention_mask, position_ids, cache)`` one step at
a time, feeding back the argmax of the last position's logits; writes are torch hooks on the
last position of the steps they belong to. fp32, 1e-6.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch

TOL = dict(atol=1e-6, rtol=1e-6)
EOS = 2


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def _greedy(model, enc, steps, hook_at=None):
    """``steps`` greedy tokens; ``hook_at(step) -> [(module, post_hook)]`` hooks that step.

    Returns the ids ``(rows, steps)``, each step's last-position logits and each step's
    last-position output of block 0.
    """
    from transformers import DynamicCache

    ids, mask = enc["input_ids"], enc["attention_mask"]
    position_ids = enc["position_ids"]
    cache = DynamicCache(config=model.config)
    tokens, logits, block0 = [], [], []
    for step in range(steps):
        seen = {}
        hooks = [(_blocks(model)[0], lambda m, a, o: seen.update(h=_first(o)[:, -1].clone()))]
        hooks += list(hook_at(step) if hook_at else [])
        handles = [module.register_forward_hook(fn) for module, fn in hooks]
        try:
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                            cache=cache, use_cache=True).logits[:, -1]
        finally:
            for handle in handles:
                handle.remove()
        token = out.argmax(-1)
        tokens.append(token)
        logits.append(out)
        block0.append(seen["h"])
        ids = token[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        position_ids = position_ids[:, -1:] + 1
    return torch.stack(tokens, 1), logits, block0


def _blocks(model):
    """The decoder blocks of any of the four tiny families (GPT-2 keeps them in ``h``)."""
    inner = getattr(model, "model", None) or model.transformer
    return inner.layers if hasattr(inner, "layers") else inner.h


def _at_last(fn):
    """A post hook that rewrites the module's output at the last position with ``fn``."""
    def post(module, args, output):
        tensor = _first(output).clone()
        tensor[:, -1] = fn(tensor[:, -1])
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    return post


def _decoding(document: dict, decode: int, logits_pos) -> dict:
    """``document`` (the kit's patching document) decoding, its head read at a generated step."""
    changed = copy.deepcopy(document)
    body = changed["interventions"]["patch"]
    body["decode"] = decode
    body["reads"]["logits"]["pos"] = logits_pos
    body["metrics"] = {"p_cf": {"kind": "token_prob", "of": "logits", "token": "cf_answer"}}
    changed["steps"]["patch"]["saves"] = [
        {"value": "p_cf", "file_path": "p_cf.json"},
        {"value": "patched.generated", "file_path": "patched.safetensors"},
        {"value": "original.generated", "file_path": "original.safetensors"}]
    return changed


@pytest.fixture()
def rows(kit, tmp_path):
    return kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-gemma2"])
def test_generated_ids_without_writes_equal_a_plain_greedy_loop(family, tiny, oracle, kit, rows, tmp_path):
    from safetensors.torch import load_file

    resolved = tiny(family)
    model, tokenizer = oracle(resolved.path)
    document = _decoding(kit.patching_document(resolved), 4, {"frame": "generated", "index": 3})
    plan = kit.run_compiled(document, rows, tmp_path / "out")
    cf = kit.encode(tokenizer, [p[1] for p in kit.PAIRS])
    want, _, _ = _greedy(model, cf, 4)
    got = kit.step(plan, "patch").results["generated"]["original.generated"]
    assert got.dtype == torch.int64 and got.shape == (3, 4)
    assert torch.equal(got, want)
    saved = load_file(str(tmp_path / "out" / "original.safetensors"))["weight"]
    assert torch.equal(saved, want)


def _patched_oracle(model, tokenizer, kit):
    """The patched decode: block 0's last prompt position swapped at the prefill only."""
    cf = kit.encode(tokenizer, [p[1] for p in kit.PAIRS])
    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    _, _, cf_block0 = _greedy(model, cf, 1)
    swap = _at_last(lambda _: cf_block0[0])
    return _greedy(model, base, 3, lambda step: [(_blocks(model)[0], swap)] if step == 0 else [])


@pytest.mark.parametrize("k", [0, 1, 2], ids=["step0", "step1", "step2"])
def test_a_prefill_write_reaches_later_steps_as_in_a_hooked_cached_decode(k, tiny, oracle, kit, rows, tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    document = _decoding(kit.patching_document(resolved), 3, {"frame": "generated", "index": k})
    plan = kit.run_compiled(document, rows, tmp_path / "out")
    ids, logits, _ = _patched_oracle(model, tokenizer, kit)
    results = kit.step(plan, "patch").results
    assert torch.equal(results["generated"]["patched.generated"], ids)
    assert torch.allclose(results["reads"]["logits"][:, 0], logits[k], **TOL)
    cf_ids = torch.tensor([tokenizer(p[3], add_special_tokens=False)["input_ids"][0] for p in kit.PAIRS])
    want = logits[k].softmax(-1).gather(-1, cf_ids[:, None])[:, 0]
    values, eligible = results["metrics"]["p_cf"]
    assert eligible == (0, 1, 2)
    assert torch.allclose(values, want, **TOL)
    table = json.loads((tmp_path / "out" / "p_cf.json").read_text())
    assert [row["positions"] for row in table] == [[k]] * len(kit.PAIRS)


def test_the_unpatched_decode_differs_from_the_patched_one(tiny, oracle, kit, rows, tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    ids, logits, _ = _patched_oracle(model, tokenizer, kit)
    clean_ids, clean_logits, _ = _greedy(model, kit.encode(tokenizer, [p[0] for p in kit.PAIRS]), 3)
    assert not all(torch.allclose(a, b, **TOL) for a, b in zip(logits[1:], clean_logits[1:]))


def _steering(resolved, pos) -> dict:
    """Add 1.5 to block 0's output wherever ``pos`` says; read the head at the last step."""
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}},
        "sites": {"target": {"component": "block_output", "layers": [0]},
                  "head": {"component": "lm_head"}},
        "interventions": {"steer": {
            "decode": 3,
            "reads": {"logits": {"site": "head", "pos": {"frame": "generated", "index": 2},
                                 "model": "steered", "input": "base"},
                      "h": {"site": "target", "pos": {"frame": "generated", "all": True},
                            "model": "steered", "input": "base"}},
            "writes": {"push": {"site": "target", "pos": pos, "mechanism": "add_scaled",
                                "operand": 1.5}},
            "models": {"steered": {"input": "base", "writes": ["push"]}}}},
        "steps": {"steer": {"kind": "observe", "interventions": "steer", "rows": {"base": "pairs"}}},
    }


@pytest.mark.parametrize("pos,steps", [({"frame": "generated", "all": True}, (0, 1, 2)),
                                       ({"frame": "generated", "index": 1}, (1,))],
                         ids=["every_step", "step1"])
def test_a_generated_frame_write_lands_on_the_last_position_of_its_steps(pos, steps, tiny, oracle, kit, rows, tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    plan = kit.run_compiled(_steering(resolved, pos), rows, tmp_path / "out")
    push = _at_last(lambda value: value + 1.5)
    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    ids, logits, block0 = _greedy(model, base, 3,
                                  lambda step: [(_blocks(model)[0], push)] if step in steps else [])
    results = kit.step(plan, "steer").results
    assert torch.equal(results["generated"]["steered.generated"], ids)
    assert torch.allclose(results["reads"]["logits"][:, 0], logits[2], **TOL)
    # The "all" read is the continuation's steps, flat: the hook sees block 0 before the push.
    stacked = torch.stack(block0, 1)
    for step in steps:
        stacked[:, step] += 1.5
    assert torch.allclose(results["reads"]["h"], stacked.reshape(-1, stacked.shape[-1]), **TOL)


def _stopping(resolved, *, force: bool) -> dict:
    """Decode 4 tokens; with ``force`` the stop token's logit is set to 100 at step 1."""
    document = {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}},
        "sites": {"target": {"component": "block_output", "layers": [0]},
                  "head": {"component": "lm_head"}, "stop": {"component": "lm_head", "units": [EOS]}},
        "interventions": {"stop": {
            "decode": 4,
            "reads": {
                "at_eos": {"site": "head", "pos": {"frame": "generated", "index": -1,
                                                   "scope": {"segment": "eos"}}, "input": "base"},
                "said": {"site": "target", "pos": {"frame": "generated", "all": True},
                         "input": "base"}},
            "metrics": {"p_stop": {"kind": "token_prob", "of": "at_eos", "token": "stop"}}}},
        "steps": {"stop": {"kind": "observe", "interventions": "stop", "rows": {"base": "stops"},
                           "saves": [{"value": "p_stop", "file_path": "p_stop.json"}]}},
    }
    if force:
        body = document["interventions"]["stop"]
        body["writes"] = {"stop": {"site": "stop", "pos": {"frame": "generated", "index": 1},
                                   "mechanism": "swap", "operand": 100.0}}
        body["models"] = {"forced": {"input": "base", "writes": ["stop"]}}
        for read in body["reads"].values():
            read["model"] = "forced"
    return document


@pytest.mark.parametrize("force", [True, False], ids=["stopping", "never_stopping"])
def test_the_eos_segment_is_the_step_that_chose_the_stop_token_and_missing_when_none_did(force, tiny, oracle, kit, tmp_path):
    import json

    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    table = [dict(row, stop=tokenizer.decode([EOS])) for row in kit.pair_rows()]
    data_root = kit.write_table(tmp_path / "data", "stops", table)
    document = _stopping(resolved, force=force)
    if not force:  # a metric of no placed row is refused; the provenance says why instead
        document["interventions"]["stop"].pop("metrics")
        document["steps"]["stop"].pop("saves")
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    results = kit.step(plan, "stop").results
    generated = results["generated"][("forced" if force else "original") + ".generated"]
    layout = results["layouts"]["said"]
    if force:
        rows = json.loads((tmp_path / "out" / "p_stop.json").read_text())
        assert (generated[:, 1] == EOS).all()
        assert [r["positions"] for r in rows] == [[1]] * 3
        assert all(r["eligible"] and r["value"] > 0.99 for r in rows)
        assert layout.counts == (2, 2, 2)  # the frame ends at the stop token
    else:
        assert not (generated == EOS).any()
        provenance = results["positions"]["at_eos"]
        assert provenance["windows"] == ((), (), ())
        assert provenance["reasons"] == ("alignment_missing",) * 3
        assert results["reads"]["at_eos"].shape[0] == 0
        assert layout.counts == (4, 4, 4)


def test_a_scoped_generated_read_is_scored_at_the_step_that_ends_the_word(tiny, oracle, kit, tmp_path):
    """``generated_answer.json`` on its own table: found, missing, found, ambiguous rows."""
    import json

    from causalab.document import load_json

    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    document = load_json("documents/v2/generated_answer.json")
    plan = kit.run_compiled(document, "documents/data", tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "p_said.json").read_text())
    assert [(r["reason"], r["positions"]) for r in rows] == [
        ("", [1]), ("alignment_missing", []), ("", [2]), ("alignment_ambiguous", [])]
    table = json.loads(open("documents/data/weekdays/said.json").read())
    prompts = [row["input"] for row in table]
    ids, logits, _ = _greedy(model, kit.encode(tokenizer, prompts), 6)
    generated = kit.step(plan, "generate").results["generated"]["original.generated"]
    assert torch.equal(generated, ids)
    for row, entry in enumerate(rows):
        if entry["eligible"]:
            said = tokenizer(table[row]["said"], add_special_tokens=False)["input_ids"][0]
            step = entry["positions"][0]
            assert abs(entry["value"] - float(logits[step][row].softmax(-1)[said])) < 1e-6


def test_a_decode_in_windows_of_rows_gives_the_whole_batchs_ids_and_reads(tiny, kit, rows, tmp_path):
    resolved = tiny("tiny-llama")
    document = _steering(resolved, {"frame": "generated", "all": True})
    whole = kit.step(kit.run_compiled(document, rows, tmp_path / "a"), "steer").results
    windows = kit.step(kit.run_compiled(document, rows, tmp_path / "b", batch_size=2), "steer").results
    assert torch.equal(whole["generated"]["steered.generated"], windows["generated"]["steered.generated"])
    for name in ("logits", "h"):
        assert torch.allclose(whole["reads"][name], windows["reads"][name], **TOL)


def test_a_write_at_logits_chooses_the_decoded_token_as_a_hooked_head_would(
        tiny, oracle, kit, rows, tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    forced = 7
    document = _decoding(kit.patching_document(resolved), 2, {"frame": "generated", "index": 1})
    document["sites"]["lg"] = {"component": "logits"}
    body = document["interventions"]["patch"]
    body["writes"] = {"force": {"site": "lg", "pos": -1, "mechanism": "swap",
                                "operand": 1e4, "features": [forced]}}
    body["models"]["patched"]["writes"] = ["force"]
    plan = kit.run_compiled(document, rows, tmp_path / "out")

    def force(last):
        last = last.clone()
        last[:, forced] = 1e4
        return last

    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    head = lambda step: [(model.lm_head, _at_last(force))] if step == 0 else []
    want, _, _ = _greedy(model, base, 2, head)
    got = kit.step(plan, "patch").results["generated"]["patched.generated"]
    assert torch.equal(got[:, 0], torch.full((3,), forced))
    assert torch.equal(got, want)
