"""MIB's circuit scores (CPR, CMD) of an edge step against circuits patched and integrated by hand.

The step runs on the trained weekday GPT-2 built-in (GPT-2's layout, the family MIB's circuit
track uses first). The hand side reads only the step's edge table: it ranks the edges itself
(by ``|score|`` for CMD, by signed score towards the counterfactual for CPR), takes MIB's
budgets as written in MIB's evaluation (``int(p · |edges|)`` for p = 0.1 % … 50 % and the
whole model), patches every edge outside each circuit with ``gpt2_oracle``'s own hooks,
normalises, and integrates with the trapezoid over the nominal fractions, written out here.
"""
from __future__ import annotations

import json

import pytest
import torch

import gpt2_oracle
from day_pairs import EQUAL_PAIRS

# MIB's evaluation points (MIB_circuit_track/evaluation.py): fractions of the edges.
FRACTIONS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


def _edge_step(kit, resolved, tmp_path, **options):
    doc = kit.patching_document(resolved, component="attention_output", layer=0)
    doc["steps"] = {"circuit": {"kind": "attribute", "interventions": "patch",
                                "rows": {"base": "pairs", "counterfactual": "pairs"},
                                "metrics": ["logit_diff"], "edges": True, **options}}
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    plan = kit.run_compiled(doc, data_root, tmp_path / "out")
    table = json.loads((tmp_path / "out" / "circuit.edges.json").read_text())
    record = json.loads((tmp_path / "out" / "circuit.faithfulness.json").read_text())
    return plan, table, record


@pytest.fixture(scope="module")
def weekday_gpt2(tiny):
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    resolved = tiny("weekday-gpt2")
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(resolved.path)
    base = dict(tokenizer([p[0] for p in EQUAL_PAIRS], return_tensors="pt"))
    cf = dict(tokenizer([p[1] for p in EQUAL_PAIRS], return_tensors="pt"))
    # The step's logit_diff: logit(cf answer) - logit(base answer).
    a = torch.tensor([tokenizer(p[3]).input_ids[-1] for p in EQUAL_PAIRS])
    b = torch.tensor([tokenizer(p[2]).input_ids[-1] for p in EQUAL_PAIRS])
    rows = torch.arange(len(EQUAL_PAIRS))

    def metric(logits):
        return logits[rows, a] - logits[rows, b]
    return resolved, model, base, cf, metric


def _hand_faithfulness(model, base, cf, metric, ranked: list[dict], n: int,
                       m_base: float, m_cf: float) -> float:
    cf_out = gpt2_oracle.outputs(model, cf)
    outside: dict = {}
    for edge in ranked[n:]:
        outside.setdefault(edge["receiver"], []).append(edge["sender"])

    def add(senders):
        return lambda now: sum(cf_out[s] - now[s] for s in senders)
    hand = float(gpt2_oracle.run(model, base, metric,
                                 {r: add(s) for r, s in outside.items()}).mean())
    return (hand - m_cf) / (m_base - m_cf)


def test_cpr_and_cmd_equal_a_hand_integration_of_hand_patched_circuits(kit, tmp_path,
                                                                       weekday_gpt2):
    resolved, model, base, cf, metric = weekday_gpt2
    _, table, record = _edge_step(kit, resolved, tmp_path, steps=3)
    m_base = float(gpt2_oracle.run(model, base, metric, {}).mean())
    m_cf = float(gpt2_oracle.run(model, cf, metric, {}).mean())
    toward = 1.0 if m_cf > m_base else -1.0
    rankings = {"absolute": sorted(table, key=lambda e: -abs(e["score"])),
                "signed": sorted(table, key=lambda e: -toward * e["score"])}
    sizes = [int(p * len(table)) for p in FRACTIONS]
    assert sizes == [0, 0, 2, 4, 9, 23, 47, 95, 239, 479]
    kept = {r: [{(e["sender"], e["receiver"]) for e in ranked[:n]} for n in sizes]
            for r, ranked in rankings.items()}
    assert kept["signed"] != kept["absolute"]  # the two rankings keep other circuits here
    assert record["mib"]["ks"] == sizes and record["mib"]["points"] == FRACTIONS
    hand = {}
    for ranking, ranked in rankings.items():
        hand[ranking] = [_hand_faithfulness(model, base, cf, metric, ranked, n, m_base, m_cf)
                         for n in sizes]
        print(ranking, [f"{f:.4f}" for f in hand[ranking]])
        assert record["mib"][ranking]["faithfulness"] == pytest.approx(hand[ranking], abs=1e-4)
    cpr = cmd = 0.0
    for i in range(len(FRACTIONS) - 1):
        width = FRACTIONS[i + 1] - FRACTIONS[i]
        cpr += width * (hand["signed"][i] + hand["signed"][i + 1]) / 2
        cmd += width * (abs(1 - hand["absolute"][i]) + abs(1 - hand["absolute"][i + 1])) / 2
    print(f"CPR {record['mib']['cpr']:.5f} (hand {cpr:.5f}), "
          f"CMD {record['mib']['cmd']:.5f} (hand {cmd:.5f})")
    assert record["mib"]["cpr"] == pytest.approx(cpr, abs=1e-5)
    assert record["mib"]["cmd"] == pytest.approx(cmd, abs=1e-5)
    assert record["mib"]["direction"] == toward
    assert not record["floor"]["below"]  # a trained model's gap of 22 logits


def test_a_gap_below_the_floor_is_flagged_in_the_file_and_the_picture(kit, tiny, tmp_path):
    from causalab.plots import faithfulness

    # The random tiny GPT-2 barely tells the two days apart: a gap of about 0.001 logit.
    plan, _, record = _edge_step(kit, tiny("tiny-gpt2"), tmp_path, circuit_k=[10])
    floor = record["floor"]
    assert floor["below"] and abs(floor["gap"]) < 0.01 and floor["floor"] == 0.1
    assert "0.1 logit" in floor["why"]
    reports = kit.step(plan, "circuit").results["edges"]
    assert faithfulness.tags({"circuit": reports}) == {
        "causalab.below_floor": json.dumps(["circuit/logit_diff"])}
    canvas = faithfulness.canvas(reports)
    hatched = [c for c in canvas.axes[0].collections if c.get_hatch() == faithfulness.HATCH]
    assert hatched
    assert "gap below floor" in canvas.axes[0].get_legend().get_texts()[0].get_text()


def test_the_floor_flags_a_gap_within_two_standard_errors():
    from causalab.engine.attribution import mib

    assert not mib.floor("logit_diff", 0.5, 0.2)["below"]
    assert mib.floor("logit_diff", 0.5, 0.3)["below"]  # 0.5 < 2 · 0.3
    assert mib.floor("token_prob", 0.005, None)["below"]  # one row: the unit's floor alone
    assert mib.floor("logit_diff", float("nan"), None)["below"]
