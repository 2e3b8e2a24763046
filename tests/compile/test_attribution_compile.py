"""Attribute steps compile without weights (docs/format.md §9.7) and refuse at their JSON path.

Configs and tokenizers of the built-in tiny Llama only; nothing here loads a weight.
"""
from __future__ import annotations

import json
import math

import pytest

from causalab.errors import CausalabError

PATCH = ("interventions", "patch")
STEP = ("steps", "attribute")


def attribute(patching: dict, **fields) -> dict:
    """The interchange of the ``patching`` fixture scored by an attribute step."""
    step = {"kind": "attribute", "interventions": "patch",
            "rows": {"base": "days", "counterfactual": "days"}, "metrics": ["logit_diff"],
            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}
    step.update(fields)
    patching["steps"] = {"attribute": {k: v for k, v in step.items() if v is not None}}
    return patching


def refused(compile_doc, document) -> tuple:
    with pytest.raises(CausalabError) as err:
        compile_doc(document)
    return err.value.path


def test_a_head_attribution_compiles_to_one_node_with_every_layer_and_head(compile_doc,
                                                                        patching):
    patching["sites"]["target"]["component"] = "attention_premix"
    plan = compile_doc(attribute(patching, layers="all", unit="head"))
    node = plan.children[0]
    assert type(node).__name__ == "Attribute"
    assert node.layers == (0, 1)
    assert [a.component for a in node.addresses] == ["attention_premix"] * 2
    assert [a.heads for a in node.addresses] == [(0, 1, 2, 3)] * 2
    assert node.metrics == ("logit_diff",) and node.steps == 1 and node.labels == (None,)


def test_the_plan_of_an_attribute_step_round_trips_through_json(compile_doc, patching):
    from causalab.compile.plan import plan_from_json, plan_to_json

    plan = compile_doc(attribute(patching, layers=[1, 0], positions={
        "day": {"index": -1, "scope": {"variable": "entity"}}, "end": -1}))
    again = plan_from_json(json.loads(json.dumps(plan_to_json(plan))))
    assert again == plan
    assert again.children[0].labels == ("day", "end")


def test_explain_shows_the_attribute_step_and_each_position_label(compile_doc, patching):
    from causalab.compile.explain import explain

    text = explain(compile_doc(attribute(patching, layers="all", steps=4, positions={
        "day": {"index": -1, "scope": {"variable": "entity"}}})))
    assert "attribute: Attribute  block_output[0,1] unit=site (2 units)" in text
    assert "integrated gradients, 4 steps" in text
    assert "day: (a_cf at pos={index:-1 scope:{variable:entity}}" in text


def test_attention_output_heads_are_attributed_at_their_premix_slices(compile_doc, patching):
    patching["sites"]["target"]["component"] = "attention_output"
    node = compile_doc(attribute(patching, unit="head")).children[0]
    assert node.addresses[0].component == "attention_premix"
    assert node.addresses[0].heads == (0, 1, 2, 3)


def test_a_match_metric_is_refused_at_its_kind_when_every_metric_is_attributed(compile_doc,
                                                                            patching):
    assert refused(compile_doc, attribute(patching, metrics=None)) == PATCH + (
        "metrics", "iia", "kind")


def test_a_listed_match_metric_is_refused_at_its_place_in_the_list(compile_doc, patching):
    assert refused(compile_doc, attribute(patching, metrics=["logit_diff", "iia"])) == STEP + (
        "metrics", 1)


def test_a_metric_the_intervention_lacks_is_refused_at_its_place_in_the_list(compile_doc,
                                                                          patching):
    assert refused(compile_doc, attribute(patching, metrics=["nope"])) == STEP + ("metrics", 0)


def test_a_write_that_is_not_a_swap_is_refused_at_its_mechanism(compile_doc, patching):
    patching["interventions"]["patch"]["writes"]["patch"]["mechanism"] = "add_scaled"
    assert refused(compile_doc, attribute(patching)) == PATCH + ("writes", "patch", "mechanism")


def test_a_metric_read_off_the_patched_model_is_refused_at_its_read(compile_doc, patching):
    body = patching["interventions"]["patch"]
    body["reads"]["clean"] = {"site": "head", "pos": -1, "input": "base"}
    body["metrics"]["clean_diff"] = {"kind": "logit_diff", "of": "clean", "a": "cf_answer",
                                     "b": "base_answer"}
    assert refused(compile_doc, attribute(patching, metrics=["clean_diff"])) == PATCH + (
        "metrics", "clean_diff", "of")


def test_a_head_unit_at_a_component_without_heads_is_refused_at_the_unit(compile_doc, patching):
    assert refused(compile_doc, attribute(patching, unit="head")) == STEP + ("unit",)


def test_a_layer_past_the_model_is_refused_at_its_place_in_the_list(compile_doc, patching):
    assert refused(compile_doc, attribute(patching, layers=[0, 7])) == STEP + ("layers", 1)


def test_integrated_gradients_over_prompts_of_other_lengths_is_refused_at_steps(
        compile_doc, patching, data_root):
    rows = json.loads((data_root / "days.json").read_text())
    rows[0]["counterfactual_inputs"] = ["Tomorrow follows Saturday, so if today is Saturday, "
                                        "tomorrow is"]
    (data_root / "ragged.json").write_text(json.dumps(rows))
    document = attribute(patching, steps=3, rows={"base": "ragged", "counterfactual": "ragged"})
    assert refused(compile_doc, document) == STEP + ("steps",)
    compile_doc(attribute(patching, steps=1, rows={"base": "ragged", "counterfactual": "ragged"}))


def test_a_table_past_the_row_bound_is_refused_at_the_unit(compile_doc, patching, monkeypatch):
    from causalab.compile import attribution

    monkeypatch.setattr(attribution, "MAX_ATTRIBUTION_ROWS", 10)
    patching["sites"]["target"]["component"] = "mlp_activation"
    assert refused(compile_doc, attribute(patching, unit="feature")) == STEP + ("unit",)


def test_a_save_of_a_metric_the_step_does_not_score_is_refused_at_its_value(compile_doc,
                                                                         patching):
    document = attribute(patching)
    document["steps"]["attribute"]["saves"].append({"value": "iia", "file_path": "iia.json"})
    assert refused(compile_doc, document) == STEP + ("saves", 1, "value")


def test_the_qk_fix_outside_a_query_or_key_head_unit_is_refused_at_qk_fix(compile_doc,
                                                                          patching):
    patching["sites"]["target"]["component"] = "attention_premix"
    document = attribute(patching, unit="head", qk_fix=True)
    assert refused(compile_doc, document) == STEP + ("qk_fix",)


def test_the_qk_fix_needs_eager_attention_for_the_scores_and_pattern(compile_doc, patching):
    patching["sites"]["target"]["component"] = "attention_query"
    assert refused(compile_doc, attribute(patching, unit="head", qk_fix=True))[:3] == (
        STEP + ("qk_fix",))
    patching["model"]["attn_implementation"] = "eager"
    node = compile_doc(attribute(patching, unit="head", qk_fix=True)).children[0]
    assert [a.component for a in node.partners + node.scores + node.patterns] == [
        "attention_key", "attention_scores", "attention_probs"]


@pytest.mark.parametrize("field", ["qk_fix", "graddrop"])
def test_a_correction_with_integrated_gradients_is_refused_at_its_field(compile_doc, patching,
                                                                        field):
    patching["sites"]["target"]["component"] = "attention_query"
    patching["model"]["attn_implementation"] = "eager"
    document = attribute(patching, unit="head", steps=2, **{field: True})
    assert refused(compile_doc, document) == STEP + (field,)


def test_graddrop_gates_every_layers_attention_and_mlp_outputs(compile_doc, patching):
    patching["sites"]["target"]["component"] = "attention_premix"
    node = compile_doc(attribute(patching, unit="head", layers="all",
                                 graddrop=True)).children[0]
    assert [(a.component, a.layer) for a in node.gates] == [
        ("attention_output", 0), ("mlp_output", 0), ("attention_output", 1), ("mlp_output", 1)]


def test_explain_names_the_corrections_and_verify(compile_doc, patching):
    from causalab.compile.explain import explain

    patching["sites"]["target"]["component"] = "attention_premix"
    text = explain(compile_doc(attribute(patching, unit="head", graddrop=True, verify=3)))
    assert "estimate=atp + GradDrop + verify 3" in text


def test_explain_says_when_a_tolerance_stops_verify_and_at_most_how_far(compile_doc, patching):
    from causalab.compile.explain import explain

    patching["sites"]["target"]["component"] = "attention_premix"
    plan = compile_doc(attribute(patching, unit="head", layers="all",
                                 verify={"bound": 0.05, "round": 1, "max_units": 64}))
    node = plan.children[0]
    assert (node.verify, node.verify_bound, node.verify_cap, len(node.units)) == (1, 0.05, 64, 8)
    assert ("estimate=atp + verifies until the bound is below 0.05, at most 8 units "
            "(2 a round)") in explain(plan)


def test_a_plan_with_a_tolerance_round_trips_through_json(compile_doc, patching):
    from causalab.compile.plan import plan_from_json, plan_to_json

    patching["sites"]["target"]["component"] = "attention_premix"
    plan = compile_doc(attribute(patching, unit="head", verify={"bound": 1}))
    again = plan_from_json(json.loads(json.dumps(plan_to_json(plan))))
    assert again == plan and again.children[0].verify_bound == 1.0


# A tolerance is a finite positive number, its round and cap positive integers.
BAD_VERIFY = [
    pytest.param({"bound": 0}, ("verify", "bound"), id="zero"),
    pytest.param({"bound": -0.05}, ("verify", "bound"), id="negative"),
    pytest.param({"bound": math.nan}, ("verify", "bound"), id="nan"),
    pytest.param({"bound": math.inf}, ("verify", "bound"), id="infinite"),
    pytest.param({"bound": "0.05"}, ("verify", "bound"), id="string"),
    pytest.param({"bound": True}, ("verify", "bound"), id="boolean"),
    pytest.param({"round": 2}, ("verify", "bound"), id="missing"),
    pytest.param({"bound": 0.05, "round": 0}, ("verify", "round"), id="empty-round"),
    pytest.param({"bound": 0.05, "max_units": 0}, ("verify", "max_units"), id="no-cap"),
    pytest.param({"bound": 0.05, "rounds": 2}, ("verify", "rounds"), id="unknown-key"),
    pytest.param(-1, ("verify",), id="negative-count"),
]


@pytest.mark.parametrize("verify, at", BAD_VERIFY)
def test_a_bad_verify_tolerance_is_refused_on_one_line_at_its_path(compile_doc, patching,
                                                                  verify, at):
    patching["sites"]["target"]["component"] = "attention_premix"
    with pytest.raises(CausalabError) as err:
        compile_doc(attribute(patching, unit="head", verify=verify))
    assert err.value.path == STEP + at
    assert "\n" not in str(err.value)


def test_a_tolerance_on_an_edge_step_is_refused_at_verify(compile_doc, patching):
    assert refused(compile_doc, attribute(patching, edges=True,
                                          verify={"bound": 0.05})) == STEP + ("verify",)
