"""Attribute steps on the built-in tiny Llama, checked against plain torch autograd with hooks.

The oracle runs the transformers model underneath with forward hooks: the counterfactual's
site values are kept, the base forward adds a zero leaf at every site, ``torch.autograd.grad``
of the summed metric gives the gradients, and each unit's estimate is
``Σ (a_cf − a_base) · grad`` over its coordinates at the patched position. Integrated
gradients averages the gradients over forwards whose embeddings are interpolated by a hook.
"""
from __future__ import annotations

import json

import pytest
import torch
from day_pairs import EQUAL_PAIRS

PAIRS = EQUAL_PAIRS
# Prompts of other lengths, so the left padding differs between base and counterfactual.
RAGGED = [
    ("If today is Monday, tomorrow is", "Today is Sunday, so tomorrow is", " Tuesday", " Monday"),
    ("Today is Saturday, tomorrow is", "If today is Friday, tomorrow is", " Sunday", " Saturday"),
    ("If today is Wednesday, tomorrow is", "Today is Saturday, tomorrow is", " Thursday",
     " Sunday"),
]


def _modules(model):
    """component -> (layer -> module, hooked side) on the transformers Llama."""
    layers = model.model.layers
    return {
        "attention_premix": (lambda l: layers[l].self_attn.o_proj, "input"),
        "block_output": (lambda l: layers[l], "output"),
        "mlp_activation": (lambda l: layers[l].mlp.act_fn, "output"),
        "ln_final": (lambda l: model.model.norm, "output"),
        "embeddings": (lambda l: model.model.embed_tokens, "output"),
    }


def _hook(module, side: str, edit):
    """``edit(tensor) -> tensor`` on the module's first input or its output."""
    if side == "input":
        return module.register_forward_pre_hook(lambda m, args: (edit(args[0]), *args[1:]))

    def on_output(m, args, output):
        tensor = output[0] if isinstance(output, tuple) else output
        tensor = edit(tensor)
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    return module.register_forward_hook(on_output)


def _forward(model, enc, edits: list) -> torch.Tensor:
    handles = [_hook(module, side, edit) for module, side, edit in edits]
    try:
        return model(**enc).logits[:, -1]
    finally:
        for handle in handles:
            handle.remove()


def _logit_diff(tokenizer, rows):
    ids = [[tokenizer(r[c], add_special_tokens=False)["input_ids"][0] for r in rows]
           for c in ("cf_answer", "base_answer")]
    return lambda logits: (logits[range(len(rows)), ids[0]] - logits[range(len(rows)), ids[1]])


def _positions(tokenizer, enc, index: int) -> torch.Tensor:
    """Absolute column of prompt index ``index`` per row (negative: from the end)."""
    if index < 0:
        return torch.full((enc["input_ids"].shape[0],), enc["input_ids"].shape[1] + index)
    prefix = len(tokenizer("")["input_ids"])
    return (enc["attention_mask"] == 0).sum(1) + prefix + index


def oracle(model, tokenizer, kit, rows, component, layers, index=-1, steps=1):
    """``{layer: (rows, width) per-coordinate estimate}`` and the base metric per row."""
    module, side = _modules(model)[component]
    embed, embed_side = _modules(model)["embeddings"]
    base = kit.encode(tokenizer, [r["input"] for r in rows])
    cf = kit.encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])
    metric = _logit_diff(tokenizer, rows)
    kept = {}

    def keep(name):
        return lambda tensor: kept.__setitem__(name, tensor.detach().clone()) or tensor
    with torch.no_grad():
        _forward(model, cf, [(module(l), side, keep(("cf", l))) for l in layers]
                 + [(embed(0), embed_side, keep(("cf", "embed")))])
    total = {l: 0.0 for l in layers}
    for k in range(steps):
        shifts = {}

        def shifted(l):
            def edit(tensor):
                kept.setdefault(("base", l), tensor.detach().clone())
                shifts[l] = torch.zeros_like(tensor, requires_grad=True)
                return tensor + shifts[l]
            return edit

        def interpolate(tensor, alpha=k / steps):
            kept.setdefault(("base", "embed"), tensor.detach().clone())
            return tensor + alpha * (kept[("cf", "embed")] - tensor)
        path = [(embed(0), embed_side, interpolate)] if steps > 1 else []
        values = metric(_forward(model, base, path + [(module(l), side, shifted(l))
                                                      for l in layers]))
        kept.setdefault("metric", values.detach())
        grads = torch.autograd.grad(values.sum(), [shifts[l] for l in layers])
        for l, grad in zip(layers, grads):
            total[l] = total[l] + grad / steps
    at_base, at_cf = _positions(tokenizer, base, index), _positions(tokenizer, cf, index)
    rows_index = torch.arange(len(rows))
    effects = {}
    for l in layers:
        delta = kept[("cf", l)][rows_index, at_cf] - kept[("base", l)][rows_index, at_base]
        effects[l] = delta * total[l][rows_index, at_base]
    return effects, kept["metric"]


def document(kit, resolved, component, *, layers="all", unit="site", steps=1, positions=None,
             table="pairs"):
    doc = kit.patching_document(resolved, component=component, table=table)
    step = {"kind": "attribute", "interventions": "patch",
            "rows": {"base": table, "counterfactual": table}, "layers": layers, "unit": unit,
            "metrics": ["logit_diff"], "steps": steps,
            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}
    if component in ("ln_final",):
        doc["sites"]["target"].pop("layers")
        step.pop("layers")
    if positions:
        step["positions"] = positions
    doc["steps"] = {"attribute": step}
    return doc


def _table(out) -> list[dict]:
    return json.loads((out / "logit_diff.json").read_text())


@pytest.fixture(scope="module")
def llama(tiny, oracle):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    return resolved, model, tokenizer


def _run(kit, tmp_path, document_, pairs=PAIRS, batch_size=None):
    root = tmp_path / "data"
    data_root = kit.write_table(root, "pairs", kit.pair_rows(pairs))
    kit.run_compiled(document_, data_root, tmp_path / "out", batch_size=batch_size)
    return _table(tmp_path / "out")


@pytest.mark.parametrize("pairs", [PAIRS, RAGGED], ids=["equal_lengths", "padded"])
def test_every_heads_estimate_equals_autograd_through_hooks(kit, llama, tmp_path, pairs):
    resolved, model, tokenizer = llama
    table = _run(kit, tmp_path, document(kit, resolved, "attention_premix", unit="head"), pairs)
    effects, base = oracle(model, tokenizer, kit, kit.pair_rows(pairs), "attention_premix", [0, 1])
    assert len(table) == 2 * 4 * len(pairs)
    for entry in table:
        place, row = entry["coordinates"], int(entry["example_id"].split("-")[1])
        expected = effects[place["layers"]][row].reshape(4, 4)[place["heads"]].sum()
        assert entry["effect"] == pytest.approx(float(expected), abs=1e-5)
        assert entry["value"] == pytest.approx(float(base[row] + expected), abs=1e-5)


def test_windows_of_rows_give_the_estimates_of_one_batch(kit, llama, tmp_path):
    resolved = llama[0]
    doc = document(kit, resolved, "mlp_activation", unit="feature", layers=[1])
    whole = _run(kit, tmp_path / "one", doc)
    split = _run(kit, tmp_path / "two", doc, batch_size=2)
    assert [e["coordinates"] for e in whole] == [e["coordinates"] for e in split]
    for one, two in zip(whole, split):
        assert one["effect"] == pytest.approx(two["effect"], abs=1e-6)


def test_each_mlp_neurons_estimate_equals_autograd_through_hooks(kit, llama, tmp_path):
    resolved, model, tokenizer = llama
    table = _run(kit, tmp_path, document(kit, resolved, "mlp_activation", unit="feature",
                                         layers=[1]))
    effects, _ = oracle(model, tokenizer, kit, kit.pair_rows(PAIRS), "mlp_activation", [1])
    assert len(table) == 64 * len(PAIRS)
    for entry in table:
        row = int(entry["example_id"].split("-")[1])
        expected = effects[1][row, entry["coordinates"]["units"]]
        assert entry["effect"] == pytest.approx(float(expected), abs=1e-5)


def test_residual_positions_are_scored_per_label_as_autograd_scores_them(kit, llama, tmp_path):
    resolved, model, tokenizer = llama
    positions = {"first": 0, "END": -1}
    table = _run(kit, tmp_path, document(kit, resolved, "block_output", positions=positions),
                 RAGGED)
    for label, index in positions.items():
        effects, _ = oracle(model, tokenizer, kit, kit.pair_rows(RAGGED), "block_output",
                            [0, 1], index=index)
        for entry in (e for e in table if e["coordinates"]["pos"] == label):
            row = int(entry["example_id"].split("-")[1])
            expected = effects[entry["coordinates"]["layers"]][row].sum()
            assert entry["effect"] == pytest.approx(float(expected), abs=1e-5), label


def test_integrated_gradients_average_the_gradients_along_the_embedding_path(kit, llama,
                                                                            tmp_path):
    resolved, model, tokenizer = llama
    table = _run(kit, tmp_path, document(kit, resolved, "attention_premix", unit="head",
                                         steps=3))
    effects, _ = oracle(model, tokenizer, kit, kit.pair_rows(PAIRS), "attention_premix",
                        [0, 1], steps=3)
    plain, _ = oracle(model, tokenizer, kit, kit.pair_rows(PAIRS), "attention_premix", [0, 1])
    moved = 0.0
    for entry in table:
        place, row = entry["coordinates"], int(entry["example_id"].split("-")[1])
        expected = effects[place["layers"]][row].reshape(4, 4)[place["heads"]].sum()
        assert entry["effect"] == pytest.approx(float(expected), abs=1e-5)
        moved += abs(float(expected - plain[place["layers"]][row].reshape(4, 4)[place["heads"]].sum()))
        assert entry["estimand_version"] == "logit_diff/v1 ig-3"
    assert moved > 1e-4  # the path's other points changed the gradients


@pytest.mark.parametrize("steps", [1, 4], ids=["atp", "integrated_gradients"])
def test_where_the_metric_is_linear_in_the_site_the_estimate_is_exact_patching(
        kit, llama, tmp_path, steps):
    # lm_head has no bias: logit_diff is linear in what the final norm hands it.
    resolved, model, tokenizer = llama
    table = _run(kit, tmp_path, document(kit, resolved, "ln_final", steps=steps))
    rows = kit.pair_rows(PAIRS)
    base = kit.encode(tokenizer, [r["input"] for r in rows])
    cf = kit.encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])
    kept = {}

    def keep(tensor):
        kept["cf"] = tensor[:, -1].clone()
        return tensor

    def swap(tensor):
        tensor = tensor.clone()
        tensor[:, -1] = kept["cf"]
        return tensor
    with torch.no_grad():
        _forward(model, cf, [(model.model.norm, "output", keep)])
        patched = _logit_diff(tokenizer, rows)(_forward(model, base, [(model.model.norm,
                                                                       "output", swap)]))
    assert len(table) == len(rows)
    for entry in table:
        row = int(entry["example_id"].split("-")[1])
        assert entry["coordinates"] == {}
        assert entry["value"] == pytest.approx(float(patched[row]), abs=1e-5)


def test_the_table_keeps_the_exact_tables_columns_and_adds_coordinates_and_effect(
        kit, llama, tmp_path):
    table = _run(kit, tmp_path, document(kit, llama[0], "attention_premix", unit="head",
                                         layers=[1]))
    assert set(table[0]) == {"example_id", "metric", "value", "effect", "eligible",
                             "coordinates", "positions", "reason", "unit", "estimand_version",
                             "produced_by"}
    assert [e["coordinates"] for e in table[::len(PAIRS)]] == [
        {"layers": 1, "heads": h} for h in range(4)]
    assert all(e["eligible"] and e["unit"] == "logit" for e in table)


@pytest.mark.parametrize("name", ["ioi_head_attribution", "ioi_layer_attribution"])
def test_each_shipped_attribution_document_is_the_rendering_of_its_conf_twin(name):
    from pathlib import Path

    from causalab.document import digest
    from causalab.hydra.rendering import render

    shipped = Path(__file__).resolve().parents[2] / "documents" / "real" / f"{name}.json"
    assert digest(render([f"experiment={name}", "model=smollm2"])) == digest(
        json.loads(shipped.read_text()))


@pytest.mark.slow
def test_on_smollm2_attribution_ranks_the_exact_sweeps_top_three_heads_among_its_top_ten(
        tmp_path, smollm2_dir):
    from pathlib import Path

    from causalab.pipeline import run_document

    repo = Path(__file__).resolve().parents[2]
    shipped = json.loads((repo / "documents" / "real" / "ioi_head_attribution.json").read_text())
    run_document(shipped, out=str(tmp_path), data_root=str(repo / "documents" / "data"))
    cells: dict = {}
    for entry in _table(tmp_path):
        place = entry["coordinates"]
        cells.setdefault((place["layers"], place["heads"]), []).append(entry["value"])
    ranked = sorted(cells, key=lambda unit: -sum(cells[unit]) / len(cells[unit]))
    # The exact 270-point sweep on the 120 rows (docs/real-models.md, "IOI on SmolLM2"): L23 H3,
    # L29 H1, L23 H0 move S - IO the most towards S; L24 H4 and L29 H0 the most the other way.
    assert {(23, 3), (29, 1), (23, 0)} <= set(ranked[:10]), ranked[:10]
    assert {(24, 4), (29, 0)} & set(ranked[-5:]), ranked[-5:]
