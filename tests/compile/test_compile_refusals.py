"""Compile-time refusals (docs/format.md §14.2): each rule is refused at its JSON path."""
from __future__ import annotations

import json
import time

import pytest

from causalab.errors import CompileError

PATCH = ("interventions", "patch")


def refused(compile_doc, document, family="llama"):
    with pytest.raises(CompileError) as err:
        compile_doc(document, family)
    return err.value


def fit_document(patching) -> dict:
    doc = patching
    doc["featurizers"] = {"rot": {"kind": "subspace", "k": 4}}
    doc["interventions"]["patch"]["reads"]["v_cf"]["featurizer"] = "rot"
    doc["interventions"]["patch"]["writes"]["patch"]["featurizer"] = "rot"
    doc["steps"] = {"fit": {
        "kind": "fit", "interventions": "patch", "params": ["rot"],
        "rows": {"base": "days#train", "counterfactual": "days#train"},
        "objective": [[1.0, "logit_diff"]], "epochs": 2, "pairs": 1, "seed": 3,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "early_stop": {"metric": "iia", "mode": "max", "patience": 2},
        "eval": {"rows": {"base": "days#test", "counterfactual": "days#test"}}}}
    return doc


@pytest.mark.parametrize("ref, why", [
    ("nowhere", "missing"), ("../days", "escapes"), ("days#validation", "empty split")])
def test_a_bad_dataset_reference_is_refused_at_its_role(compile_doc, patching, ref, why):
    patching["steps"]["patch"]["rows"]["base"] = ref
    assert refused(compile_doc, patching).path == ("steps", "patch", "rows", "base")


def test_duplicate_example_ids_are_refused(compile_doc, patching, data_root):
    rows = json.loads((data_root / "days.json").read_text())
    rows[1]["example_id"] = rows[0]["example_id"]
    (data_root / "dup.json").write_text(json.dumps(rows))
    patching["steps"]["patch"]["rows"]["counterfactual"] = "dup"
    assert refused(compile_doc, patching).path == ("steps", "patch", "rows", "counterfactual")


def test_an_answer_cell_that_is_no_string_is_refused_not_read_as_its_text(compile_doc,
                                                                          patching, data_root):
    # An integer 7 was scored as the token " 7"'s text "7", an answer no one wrote.
    rows = json.loads((data_root / "days.json").read_text())
    rows[1]["cf_answer"] = 7
    (data_root / "numbers.json").write_text(json.dumps(rows))
    patching["steps"]["patch"]["rows"] = {"base": "numbers#train", "counterfactual": "numbers#train"}
    error = refused(compile_doc, patching)
    assert error.path == ("interventions", "patch", "metrics", "iia", "expected")
    assert error.message.startswith("row 1: 7 is not a string")


@pytest.mark.parametrize("field", ["counterfactual_inputs[3]", "nothing", "counterfactual_inputs"])
def test_a_role_field_that_is_absent_or_not_a_string_is_refused(compile_doc, patching, field):
    patching["roles"]["counterfactual"]["field"] = field
    assert refused(compile_doc, patching).path == ("steps", "patch", "rows", "counterfactual")


def test_roles_with_different_row_counts_are_refused(compile_doc, patching):
    patching["steps"]["patch"]["rows"]["counterfactual"] = "days"
    assert refused(compile_doc, patching).path == ("steps", "patch", "rows", "counterfactual")


@pytest.mark.parametrize("site, part", [
    ({"component": "block_output", "layers": [5]}, "layers"),
    ({"component": "resid_post", "layers": [0]}, "component"),
    ({"component": "attention_probs", "layers": [0], "heads": [0]}, "component"),
    ({"component": "attention_premix", "layers": [0], "heads": [4]}, "heads"),
    ({"component": "block_output", "layers": [0], "units": [99]}, "units"),
])
def test_a_site_this_checkpoint_cannot_place_is_refused(compile_doc, patching, site, part):
    patching["sites"]["target"] = site
    assert refused(compile_doc, patching).path == ("sites", "target", part)


def test_k_above_the_site_width_is_refused(compile_doc, patching):
    doc = fit_document(patching)
    doc["featurizers"]["rot"]["k"] = 17
    assert refused(compile_doc, doc).path == ("featurizers", "rot", "k")


def test_a_featurizer_at_a_site_without_width_is_refused(compile_doc, patching):
    doc = fit_document(patching)
    doc["model"]["attn_implementation"] = "eager"
    doc["sites"]["target"] = {"component": "attention_probs", "layers": [0], "heads": [0]}
    assert refused(compile_doc, doc).path == ("featurizers", "rot")


@pytest.mark.parametrize("features", [[0, 0], [4]])
def test_write_features_outside_the_feature_space_are_refused(compile_doc, patching, features):
    doc = fit_document(patching)
    doc["interventions"]["patch"]["writes"]["patch"]["features"] = features
    assert refused(compile_doc, doc).path == PATCH + ("writes", "patch", "features")


def test_an_operand_read_through_another_featurizer_is_refused(compile_doc, patching):
    doc = fit_document(patching)
    doc["interventions"]["patch"]["reads"]["v_cf"]["featurizer"] = "identity"
    assert refused(compile_doc, doc).path == PATCH + ("writes", "patch", "operand")


def test_an_operand_as_narrow_as_the_written_features_is_accepted(compile_doc, patching):
    doc = fit_document(patching)
    doc["featurizers"]["narrow"] = {"kind": "subspace", "k": 2}
    doc["interventions"]["patch"]["reads"]["v_cf"]["featurizer"] = "narrow"
    doc["interventions"]["patch"]["writes"]["patch"]["features"] = [0, 3]
    compile_doc(doc, "llama")


def _harvest(patching, reduce: dict, rows="days#train") -> dict:
    patching["steps"] = {
        "harvest": {"kind": "observe", "rows": {"counterfactual": rows},
                    "interventions": {"reads": {"acts": {"site": "target", "pos": {"all": True},
                                                         "input": "counterfactual"}}},
                    "outputs": {"published": {"read": "acts", **reduce}}},
        "patch": patching["steps"]["patch"]}
    patching["interventions"]["patch"]["writes"]["patch"]["operand"] = {"ref": "published"}
    return patching


def test_a_pca_basis_as_an_operand_is_refused(compile_doc, patching):
    doc = _harvest(patching, {"reduce": "pca", "k": 2})
    assert refused(compile_doc, doc).path == PATCH + ("writes", "patch", "operand")


def test_an_unreduced_operand_over_other_rows_is_refused(compile_doc, patching):
    doc = _harvest(patching, {"reduce": "none"}, rows="days")
    doc["steps"]["harvest"]["interventions"]["reads"]["acts"]["pos"] = -1
    assert refused(compile_doc, doc).path == PATCH + ("writes", "patch", "operand")


def test_pca_with_fewer_vectors_than_k_is_refused(compile_doc, patching):
    doc = _harvest(patching, {"reduce": "pca", "k": 3})
    doc["steps"]["harvest"]["interventions"]["reads"]["acts"]["pos"] = -1
    assert refused(compile_doc, doc).path == ("steps", "harvest", "outputs", "published", "k")


def test_an_attention_pattern_from_prompts_of_other_lengths_is_refused(compile_doc, patching,
                                                                        data_root):
    rows = json.loads((data_root / "days.json").read_text())
    rows[0]["counterfactual_inputs"] = ["So if today is Saturday, then tomorrow is"]
    (data_root / "uneven.json").write_text(json.dumps(rows))
    patching["model"]["attn_implementation"] = "eager"
    patching["sites"]["target"] = {"component": "attention_probs", "layers": [0], "heads": [1]}
    patching["steps"]["patch"]["rows"] = {"base": "uneven", "counterfactual": "uneven"}
    error = refused(compile_doc, patching)
    assert error.path == PATCH + ("writes", "patch", "operand") and "row 0" in str(error)


def test_models_that_feed_each_other_in_a_cycle_are_refused(compile_doc, patching):
    body = patching["interventions"]["patch"]
    body["reads"]["v_cf"]["model"] = "other"
    body["reads"]["w"] = {"site": "target", "pos": -1, "input": "base", "model": "patched"}
    body["writes"]["back"] = {"site": "target", "pos": -1, "mechanism": "swap", "operand": "w"}
    body["models"]["other"] = {"input": "counterfactual", "writes": ["back"]}
    assert refused(compile_doc, patching).path == PATCH + ("models",)


def test_a_stacked_generated_read_above_256_mib_is_refused(compile_doc, patching):
    body = patching["interventions"]["patch"]
    body["decode"] = 100000
    body["reads"]["steps"] = {"site": "head", "pos": {"frame": "generated", "last": 2},
                              "model": "patched", "input": "base"}
    assert refused(compile_doc, patching).path == PATCH + ("reads", "steps", "pos")


def test_an_anchor_variable_found_nowhere_is_refused_naming_both_places(compile_doc, patching):
    patching["interventions"]["patch"]["reads"]["v_cf"]["pos"] = {
        "index": -1, "scope": {"variable": "colour"}}
    error = refused(compile_doc, patching)
    assert error.path == PATCH + ("reads", "v_cf", "pos", "scope", "variable")
    assert "counterfactual_inputs_variables[0].colour" in str(error) and "'colour'" in str(error)


def test_a_chat_segment_without_a_chat_template_is_refused(compile_doc, patching, builtin):
    tokenizer = builtin["gpt2"][2]
    patching["interventions"]["patch"]["reads"]["v_cf"]["pos"] = {
        "index": -1, "scope": {"segment": "user"}}
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        error = refused(compile_doc, patching, "gpt2")
    finally:
        tokenizer.chat_template = template
    assert error.path == PATCH + ("reads", "v_cf", "pos", "scope", "segment")


@pytest.mark.parametrize("pos", [{"index": 40}, {"last": 12}, {"span": [3, 30]}])
def test_a_fixed_cut_that_some_row_cannot_fit_is_refused(compile_doc, patching, pos):
    body = patching["interventions"]["patch"]
    body["reads"]["v_cf"]["pos"] = body["writes"]["patch"]["pos"] = pos  # operand fits write
    error = refused(compile_doc, patching)
    assert error.path == PATCH + ("reads", "v_cf", "pos")
    assert "v_cf" in str(error) and "[0, 1]" in str(error) and "out_of_range" in str(error)


def test_a_metric_column_that_no_row_has_is_refused(compile_doc, patching):
    patching["interventions"]["patch"]["metrics"]["logit_diff"]["b"] = "base_anwser"
    assert refused(compile_doc, patching).path == PATCH + ("metrics", "logit_diff", "b")


def test_an_answer_of_several_tokens_is_refused(compile_doc, patching, data_root):
    rows = json.loads((data_root / "days.json").read_text())
    rows[1]["cf_answer"] = " Xylophoneday"
    (data_root / "long.json").write_text(json.dumps(rows))
    patching["steps"]["patch"]["rows"] = {"base": "long#train", "counterfactual": "long#train"}
    assert refused(compile_doc, patching).path == PATCH + ("metrics", "iia", "expected")


def test_a_metric_with_no_column_eligible_row_is_refused(compile_doc, patching, data_root):
    rows = json.loads((data_root / "days.json").read_text())
    for row in rows:
        row["cf_answer"] = None if row["split"] == "train" else row["cf_answer"]
    (data_root / "empty.json").write_text(json.dumps(rows))
    patching["steps"]["patch"]["rows"] = {"base": "empty#train", "counterfactual": "empty#train"}
    assert refused(compile_doc, patching).path == PATCH + ("metrics", "iia", "expected")


def test_a_fit_update_batch_without_an_eligible_row_is_refused(compile_doc, patching, data_root):
    rows = json.loads((data_root / "days.json").read_text())
    rows[0]["cf_answer"] = ""
    (data_root / "gap.json").write_text(json.dumps(rows))
    doc = fit_document(patching)
    doc["steps"]["fit"]["rows"] = {"base": "gap#train", "counterfactual": "gap#train"}
    error = refused(compile_doc, doc)
    assert error.path[:3] == PATCH + ("metrics",) and error.path[-1] in ("expected", "a")


def test_fit_and_eval_rows_that_share_rows_are_refused_with_the_count(compile_doc, patching):
    doc = fit_document(patching)
    doc["steps"]["fit"]["eval"]["rows"] = {"base": "days", "counterfactual": "days"}
    error = refused(compile_doc, doc)
    assert error.path[:4] == ("steps", "fit", "eval", "rows") and "share 2 rows" in str(error)


def test_the_same_ref_for_fit_and_eval_is_allowed(compile_doc, patching):
    doc = fit_document(patching)
    doc["steps"]["fit"]["eval"]["rows"] = dict(doc["steps"]["fit"]["rows"])
    assert compile_doc(doc).children[1].eval.rows == 2


def _with_base_input(data_root, name: str, text: str) -> str:
    """``name`` (a table like days.json whose row Fri-Sun has ``text`` as its input)."""
    rows = json.loads((data_root / "days.json").read_text())
    rows[1]["input"] = text
    (data_root / f"{name}.json").write_text(json.dumps(rows))
    return f"{name}#train"


def test_a_prompt_past_the_checkpoints_positions_is_refused_at_compile_naming_its_row(
        compile_doc, patching, data_root, builtin):
    positions = builtin["llama"][1].max_position_embeddings
    text = "If today is Friday" + ", tomorrow is" * positions
    patching["steps"]["patch"]["rows"]["base"] = _with_base_input(data_root, "long", text)
    error = refused(compile_doc, patching)
    assert error.path == ("steps", "patch", "rows", "base")
    assert "Fri-Sun" in error.message and str(positions) in error.message


def test_a_fifty_megabyte_prompt_is_refused_from_its_head_in_one_line(compile_doc, patching,
                                                                      data_root):
    text = "Friday " * (50 * 2 ** 20 // 7)
    patching["steps"]["patch"]["rows"]["base"] = _with_base_input(data_root, "huge", text)
    started = time.monotonic()
    error = refused(compile_doc, patching)
    assert error.path == ("steps", "patch", "rows", "base")
    assert "Fri-Sun" in error.message and "\n" not in error.message
    assert time.monotonic() - started < 30  # the head is tokenized, not 50 MB


def test_a_data_table_nested_a_hundred_thousand_deep_is_refused_naming_its_file(
        compile_doc, patching, data_root):
    (data_root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    patching["steps"]["patch"]["rows"]["base"] = "deep"
    error = refused(compile_doc, patching)
    assert error.path == ("steps", "patch", "rows", "base")
    assert "deep.json" in error.message and "\n" not in error.message
