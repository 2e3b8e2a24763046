"""``verify`` on an attribute step: its exact effects against exact patching by torch hooks.

On the built-in tiny Llama (2 layers x 4 heads), every head's exact END patching effect is
computed by a hook swapping that head's slice of the out-projection's input with the
counterfactual's; the step's verified units, their exact effects, ratios and bound must
agree with them and with the step's own table, for ``verify: N`` and for a tolerance.
"""
from __future__ import annotations

import json

import pytest
import torch

HEADS, HEAD_DIM = 4, 4


def _exact(model, tokenizer, kit, rows) -> dict:
    """``{(layer, head): mean over rows of patched minus base logit_diff}``."""
    base = kit.encode(tokenizer, [r["input"] for r in rows])
    cf = kit.encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])
    ids = [[tokenizer(r[c], add_special_tokens=False)["input_ids"][0] for r in rows]
           for c in ("cf_answer", "base_answer")]

    def metric(logits):
        return logits[range(len(rows)), ids[0]] - logits[range(len(rows)), ids[1]]
    layers, kept, found = model.model.layers, {}, {}
    with torch.no_grad():
        handles = [layers[l].self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, l=l: kept.__setitem__(l, a[0][:, -1].clone())) for l in (0, 1)]
        model(**cf)
        for handle in handles:
            handle.remove()
        start = metric(model(**base).logits[:, -1])
        for l in (0, 1):
            for h in range(HEADS):
                cut = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)

                def swap(m, a, l=l, cut=cut):
                    value = a[0].clone()
                    value[:, -1, cut] = kept[l][:, cut]
                    return (value,)
                handle = layers[l].self_attn.o_proj.register_forward_pre_hook(swap)
                found[(l, h)] = float((metric(model(**base).logits[:, -1]) - start).mean())
                handle.remove()
    return found


def _head_document(kit, resolved, saved: bool = True, **fields) -> dict:
    """The tiny model's head attribute step over the pairs, with ``fields`` (its verify)."""
    doc = kit.patching_document(resolved, component="attention_premix")
    step = {"kind": "attribute", "interventions": "patch",
            "rows": {"base": "pairs", "counterfactual": "pairs"},
            "layers": "all", "unit": "head", "metrics": ["logit_diff"], **fields}
    if saved:
        step["saves"] = [{"value": "logit_diff", "file_path": "logit_diff.json"}]
    doc["steps"] = {"attribute": step}
    return doc


def test_verify_patches_the_top_and_drawn_heads_exactly_as_hooks_do(kit, tiny, oracle,
                                                                    tmp_path):
    report, estimate, exact = _head_step(kit, tiny, oracle, tmp_path, 2)
    top = sorted(estimate, key=lambda k: -abs(estimate[k]))[:2]
    verified = [_key(u) for u in report["units"]]
    assert [u["chosen"] for u in report["units"]] == ["top", "top", "drawn", "drawn"]
    assert verified[:2] == top and not set(verified[2:]) & set(top)
    for unit, key in zip(report["units"], verified):
        # Mean over 3 rows of float32 logit differences: rounding near 1e-6.
        assert unit["exact"] == pytest.approx(exact[key], abs=1e-5)
        assert unit["estimate"] == pytest.approx(estimate[key], abs=1e-9)
        assert unit["ratio"] == pytest.approx(estimate[key] / exact[key], rel=1e-3)
    left = [abs(v) for k, v in estimate.items() if k not in verified]
    factor = max([1.0] + [abs(exact[k]) / abs(estimate[k]) for k in verified[2:]])
    assert report["bound"]["unverified"] == 4
    assert report["bound"]["largest_exact_bound"] == pytest.approx(max(left) * factor, rel=1e-3)


def test_with_graddrop_verify_ranks_units_by_atp_stars_magnitude(kit, tiny, tmp_path):
    resolved = tiny("tiny-llama")
    doc = _head_document(kit, resolved, verify=3, graddrop=True)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(kit.PAIRS))
    kit.run_compiled(doc, data_root, tmp_path / "out")
    table = json.loads((tmp_path / "out" / "logit_diff.json").read_text())
    report = json.loads((tmp_path / "out" / "attribute.verify.json").read_text())["logit_diff"]
    cells = {}
    for entry in table:
        cells.setdefault(_key(entry), []).append(entry)
    magnitude = {}
    for key, rows in cells.items():
        effect = sum(e["effect"] for e in rows) / len(rows)
        layers = [sum(e["graddrop_layers"][l] for e in rows) / len(rows) for l in (0, 1)]
        # AtP*: Σ_l |ĉ_l| / (L − 1) over L = 2 layers, against |AtP|.
        magnitude[key] = max(abs(effect), abs(layers[0]) + abs(layers[1]))
    top = sorted(magnitude, key=lambda k: -magnitude[k])[:3]
    chosen = [_key(u) for u in report["units"] if u["chosen"] == "top"]
    assert chosen == top
    verified = {_key(u) for u in report["units"]}
    assert report["bound"]["largest_exact_bound"] >= max(
        v for k, v in magnitude.items() if k not in verified)


def test_verify_runs_every_unit_at_the_last_column_fused_and_matches_hooks(
        kit, tiny, oracle, tmp_path, monkeypatch):
    """``verify: 4`` on 8 heads patches all of them, at both layers, stacked in one trace of
    the last column over the base's kept keys from the embeddings; every exact effect is the
    whole-forward hook's (fp32 rounding)."""
    from causalab.engine import runner

    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    rows = kit.pair_rows(kit.PAIRS)
    doc = _head_document(kit, resolved, saved=False, verify=4)
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    seen, original = [], runner.run_trace

    def record(model_, job, live):
        seen.append(job)
        return original(model_, job, live)
    monkeypatch.setattr(runner, "run_trace", record)
    kit.run_compiled(doc, data_root, tmp_path / "out")
    report = json.loads((tmp_path / "out" / "attribute.verify.json").read_text())["logit_diff"]
    patched = [job for job in seen if job.kind == "forward"]
    assert [(job.tail, job.copies, job.resume) for job in patched] == [(True, 8, None)]
    exact = _exact(model, tokenizer, kit, rows)
    assert len(report["units"]) == 8
    for unit in report["units"]:
        key = _key(unit)
        # One column over kept keys sums in another order than the whole forward: ~1e-7.
        assert unit["exact"] == pytest.approx(exact[key], abs=1e-5)


def _head_step(kit, tiny, oracle, tmp_path, verify: int | dict) -> tuple[dict, dict, dict]:
    """The head step run with ``verify`` (a count or a tolerance): its report, the table's mean estimate
    per head, and every head's exact effect by the hooks."""
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    rows = kit.pair_rows(kit.PAIRS)
    doc = _head_document(kit, resolved, verify=verify)
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    kit.run_compiled(doc, data_root, tmp_path / "out")
    table = json.loads((tmp_path / "out" / "logit_diff.json").read_text())
    report = json.loads((tmp_path / "out" / "attribute.verify.json").read_text())["logit_diff"]
    cells = {}
    for entry in table:
        cells.setdefault(_key(entry), []).append(entry["effect"])
    estimate = {key: sum(v) / len(v) for key, v in cells.items()}
    return report, estimate, _exact(model, tokenizer, kit, rows)


def _key(entry: dict) -> tuple:
    return entry["coordinates"]["layers"], entry["coordinates"]["heads"]


# On this model every head's exact effect is 0.2e-3 to 2.6e-3 (logit_diff), so a tolerance
# of 2.1e-3 leaves some heads unverified and needs more than one round of one top unit.
TOLERANCE = 0.0021


def test_with_a_tolerance_the_rounds_go_on_until_the_bound_is_below_it(kit, tiny, oracle,
                                                                       tmp_path):
    report, estimate, exact = _head_step(kit, tiny, oracle, tmp_path,
                                       {"bound": TOLERANCE, "round": 1})
    bound = report["bound"]
    verified = {_key(u): u for u in report["units"]}
    left = set(exact) - set(verified)
    assert bound["stopped"] == "bound" and bound["rounds"] > 1 and left
    assert bound["judged_by"] == "logit_diff"
    assert bound["largest_exact_bound"] < TOLERANCE == bound["tolerance"]
    assert bound["verified"] == len(verified) == 2 * bound["rounds"]
    # The bound speaks for the unverified heads only as far as the drawn sample does: it
    # holds exactly when their worst AtP underestimate is no worse than the drawn heads'.
    # Against the hooks every head's |exact| / |estimate| here is within 1.2, so no
    # unverified head may exceed the bound by more than that.
    worst = max(abs(exact[k]) / abs(estimate[k]) for k in exact)
    assert worst <= 1.2
    for key in left:
        assert abs(exact[key]) <= bound["largest_exact_bound"] * 1.2
        assert abs(estimate[key]) <= bound["largest_estimate"]
    for key, unit in verified.items():
        # A mean over 3 rows of float32 logit differences, the last column alone over kept
        # keys against the whole forward: rounding near 1e-7, far below AtP's 1e-5 errors.
        assert unit["exact"] == pytest.approx(exact[key], abs=1e-6)
        assert unit["estimate"] == pytest.approx(estimate[key], abs=1e-9)


def test_with_a_tolerance_a_large_negative_head_is_verified_first(kit, tiny, oracle,
                                                                  tmp_path):
    """Units are ranked by |estimate|: the head whose patch lowers logit_diff most is this
    model's largest effect, and a signed ranking would have put it last."""
    report, estimate, exact = _head_step(kit, tiny, oracle, tmp_path,
                                       {"bound": TOLERANCE, "round": 1})
    negative = min(exact, key=exact.get)
    assert exact[negative] < 0 and abs(exact[negative]) == max(abs(v) for v in exact.values())
    first = report["units"][0]
    assert (_key(first), first["chosen"]) == (negative, "top")
    assert first["exact"] == pytest.approx(exact[negative], abs=1e-6)
    ranking = report["ranking"]
    assert (_key(ranking[0]), ranking[0]["exact"]) == (negative, True)
    assert ranking[0]["effect"] == pytest.approx(exact[negative], abs=1e-6)
    magnitudes = [abs(e["effect"]) for e in ranking]
    assert magnitudes == sorted(magnitudes, reverse=True)
    verified = {_key(u) for u in report["units"]}
    assert all(e["exact"] == (_key(e) in verified) for e in ranking)


def test_when_the_cap_stops_the_rounds_the_report_says_so(kit, tiny, oracle, tmp_path):
    report, _, exact = _head_step(kit, tiny, oracle, tmp_path,
                                {"bound": 1e-9, "round": 2, "max_units": 3})
    bound = report["bound"]
    assert (bound["stopped"], bound["verified"], bound["max_units"]) == ("cap", 3, 3)
    assert [u["chosen"] for u in report["units"]] == ["top", "top", "drawn"]
    assert bound["unverified"] == len(exact) - 3
    assert bound["largest_exact_bound"] >= bound["tolerance"]


def test_a_tolerance_below_every_effect_verifies_every_unit(kit, tiny, oracle, tmp_path):
    report, _, exact = _head_step(kit, tiny, oracle, tmp_path, {"bound": 1e-9, "round": 3})
    bound = report["bound"]
    assert (bound["stopped"], bound["verified"], bound["unverified"]) == ("all", 8, 0)
    assert bound["largest_exact_bound"] == 0.0
    for unit in report["units"]:
        assert unit["exact"] == pytest.approx(exact[_key(unit)], abs=1e-6)
