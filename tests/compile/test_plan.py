"""The compiled plan: forwards, taps, batches, metrics, featurizers, nesting, JSON and explain."""
from __future__ import annotations

import json
import random
import re

import causalab.compile
from causalab.compile.explain import explain, explain_payload
from causalab.compile.plan import Featurizers, Fit, Observe, Plan, plan_from_json, plan_to_json


def test_the_patching_plan_has_one_forward_per_named_pair_in_dependency_order(compile_doc, patching):
    plan = compile_doc(patching)
    assert (plan.name, plan.directory) == ("<root>", "")
    (step,) = plan.children
    forwards = step.pass_.forwards
    assert [(f.model, f.input) for f in forwards] == [("original", "counterfactual"), ("patched", "base")]
    assert forwards[1].taps == (("write", "patch"), ("read", "logits"))
    assert step.pass_.example_ids == ("Thu-Sat", "Fri-Sun") and step.pass_.rows == 2


def test_writes_come_before_reads_at_one_address_and_taps_follow_component_order(compile_doc, patching):
    body = patching["interventions"]["patch"]
    patching["sites"]["early"] = {"component": "embeddings"}
    body["reads"]["seen"] = {"site": "target", "pos": -1, "input": "base", "model": "patched"}
    body["reads"]["embedded"] = {"site": "early", "pos": 0, "input": "base", "model": "patched"}
    body["writes"]["nudge"] = {"site": "target", "pos": -1, "mechanism": "add_scaled",
                               "operand": 1.0, "params": {"scale": 0.5}}
    body["models"]["patched"]["writes"] = ["patch", "nudge"]
    (step,) = compile_doc(patching).children
    assert step.pass_.forwards[1].taps == (
        ("read", "embedded"), ("write", "patch"), ("write", "nudge"), ("read", "seen"),
        ("read", "logits"))


def test_prompt_batches_are_left_padded_once_with_the_tokenizer_prefix(compile_doc, patching, builtin):
    for family, prefix in (("llama", 1), ("gpt2", 0)):
        (step,) = compile_doc(patching, family).children
        batch = step.pass_.inputs["base"]
        tokenizer = builtin[family][2]
        assert batch.prefix == prefix and batch.pad_id == tokenizer.pad_token_id
        for row, prompt in enumerate(batch.prompts):
            ids = tokenizer(prompt)["input_ids"]
            assert batch.input_ids[row][-len(ids):] == tuple(ids)
            assert batch.attention_mask[row] == (0,) * (batch.tokens - len(ids)) + (1,) * len(ids)


def test_metric_columns_become_single_token_ids_with_column_eligible_rows(compile_doc, patching, builtin):
    patching["steps"]["patch"]["rows"] = {"base": "days", "counterfactual": "days"}
    (step,) = compile_doc(patching).children
    tokenizer = builtin["llama"][2]
    iia, diff = step.pass_.metrics
    one = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"][0]
    assert iia.columns == ("cf_answer",) and iia.token_ids == (
        tuple(one(s) for s in (" Sunday", " Monday", " Wednesday")),)
    assert diff.columns == ("cf_answer", "base_answer") and diff.eligible == (0, 1, 2)
    assert (iia.unit, iia.estimand_version, diff.unit) == ("fraction", "match/v1", "logit")
    assert (iia.model, iia.input) == ("patched", "base")


def _fit(patching):
    patching["featurizers"] = {"rot": {"kind": "subspace", "k": 4}}
    for kind in ("reads", "writes"):
        name = "v_cf" if kind == "reads" else "patch"
        patching["interventions"]["patch"][kind][name]["featurizer"] = "rot"
    patching["steps"] = {
        "fit": {"kind": "fit", "interventions": "patch", "params": ["rot"],
                "rows": {"base": "days#train", "counterfactual": "days#train"},
                "objective": [[1, "logit_diff"]], "epochs": 3, "pairs": 1, "seed": 7,
                "optimizer": {"name": "adamw", "lr": 0.01},
                "early_stop": {"metric": "iia", "patience": 2},
                "eval": {"rows": {"base": "days#test", "counterfactual": "days#test"},
                         "saves": [{"value": "iia", "file_path": "heldout.json"}]}},
        "export": {"kind": "weights", "names": ["rot"],
                   "saves": [{"value": "rot", "file_path": "rot.safetensors"}]}}
    return patching


def test_fit_batches_are_shuffled_per_epoch_from_the_seed(compile_doc, patching):
    featurizers, fit, weights = compile_doc(_fit(patching)).children
    rng = random.Random(7)
    expected = []
    for _ in range(3):
        order = [0, 1]
        rng.shuffle(order)
        expected.append(((order[0],), (order[1],)))
    assert isinstance(fit, Fit) and fit.batches == tuple(expected)
    assert (fit.train.rows, fit.eval.rows, fit.objective, fit.early_stop_mode) == (2, 1, ((1.0, "logit_diff"),), "max")
    assert fit.eval_saves[0].kind == "table" and weights.saves[0].kind == "tensor"


def test_the_featurizers_node_fills_d_seed_stamp_and_trainer(compile_doc, patching, builtin):
    plan = compile_doc(_fit(patching))
    node = plan.children[0]
    assert isinstance(node, Featurizers) and node.name == "featurizers"
    (rot,) = node.featurizers
    ref = builtin["llama"][0]
    assert (rot.d, rot.k, rot.seed, rot.trained_by) == (16, 4, 7, "fit")
    assert rot.stamp == {
        "kind": "subspace", "k": "4", "d": "16", "parametrization": "cayley", "site": "target",
        "component": "block_output", "layer": "0", "model_key": ref.key,
        "model_revision": ref.revision, "model_dtype": "fp32", "featurizer_dtype": "fp32",
        "produced_by": plan.digest, "engine": "causalab"}


def test_a_list_of_interventions_nests_one_plan_per_entry(compile_doc, patching):
    body = patching["interventions"]["patch"]
    patching["interventions"]["again"] = json.loads(json.dumps(body))
    step = patching["steps"]["patch"]
    step["interventions"] = ["patch", "again"]
    step["saves"] = [{"value": "patch/iia", "file_path": "iia.json"},
                     {"value": "again/logit_diff", "file_path": "diff.json"}]
    first, second = compile_doc(patching, label="layers=0").children
    assert (first.name, first.directory) == ("patch", "layers=0/patch/patch")
    assert second.directory == "layers=0/patch/again"
    assert first.children[0].saves[0].value == "iia" and second.children[0].saves[0].value == "logit_diff"


def test_a_bare_save_of_generated_ids_goes_to_the_one_list_entry_that_decodes(compile_doc,
                                                                              patching):
    patching["interventions"]["probe"] = {
        "decode": 2,
        "reads": {"step": {"site": "head", "input": "base",
                           "pos": {"frame": "generated", "index": 0}}},
        "metrics": {"p": {"kind": "token_prob", "of": "step", "token": "base_answer"}}}
    step = patching["steps"]["patch"]
    step["interventions"] = ["patch", "probe"]
    step["rows"] = {"base": "days#train", "counterfactual": "days#train"}
    step["saves"] = [{"value": "original.generated", "file_path": "ids.safetensors"}]
    first, second = compile_doc(patching).children
    assert first.children[0].saves == ()
    assert [s.value for s in second.children[0].saves] == ["original.generated"]


def test_a_plan_round_trips_through_json(compile_doc, patching):
    plan = compile_doc(_fit(patching))
    again = plan_from_json(json.loads(json.dumps(plan_to_json(plan))))
    assert again == plan and again.children[1].batches == plan.children[1].batches


def test_a_swept_document_compiles_to_one_point_plan_per_label(patching, data_root):
    patching["sites"]["target"]["layers"] = {"sweep": [[0], [1]]}
    plan = causalab.compile.compile_document(patching, data_root=str(data_root))
    assert [c.name for c in plan.children] == ["layers=0", "layers=1"]
    assert [c.directory for c in plan.children] == ["layers=0", "layers=1"]
    assert plan.children[1].coordinates == {"layers": (1,)}
    assert plan.children[1].document["sites"]["target"]["layers"] == [1]
    assert plan.children[0].digest != plan.children[1].digest
    assert explain_payload(plan)["steps"] == ["layers=0", "layers=1"]


GRAMMAR = [
    r"^<root>: Plan$",
    r"^  featurizers: Featurizers$",
    r"^      rot: subspace k=4 d=16 cayley seed=7 trained=True$",
    r"^  fit: Fit  3 epochs x 2 updates  lr=0\.01 objective=\(\(1\.0, 'logit_diff'\),\) "
    r"params=\('rot',\)  early_stop='iia' patience=2  saves=\['heldout\.json'\]$",
    r"^      forward 'original' on 'counterfactual'  \(2 rows x \d+ tokens\)$",
    r"^        read  'v_cf' at block_output\[0\] pos=\{index:-1\} via 'rot'$",
    r"^      forward 'patched' on 'base'  \(2 rows x \d+ tokens\)$",
    r"^        write 'patch' at block_output\[0\] pos=\{index:-1\} swap\(v_cf\) via 'rot'$",
    r"^        read  'logits' at lm_head pos=\{index:-1\} via 'identity'$",
    r"^  export: Weights  names=\['rot'\]  saves=\['rot\.safetensors'\]$",
]


def test_explain_follows_the_line_grammar(compile_doc, patching):
    lines = explain(compile_doc(_fit(patching))).splitlines()
    assert len(lines) == len(GRAMMAR)
    for line, pattern in zip(lines, GRAMMAR):
        assert re.match(pattern, line), line


def test_explain_spells_anchors_literals_params_and_features(compile_doc, patching):
    body = patching["interventions"]["patch"]
    body["reads"]["v_cf"]["pos"] = {"index": -1, "scope": {"variable": "entity"}}
    body["writes"]["patch"].update(pos={"all": True, "scope": {"variable": "entity"}},
                                   mechanism="add_scaled", operand=0.5, params={"scale": 2.0},
                                   features=[1, 3])
    text = explain(compile_doc(patching))
    assert "read  'v_cf' at block_output[0] pos={index:-1 scope:{variable:entity}} via 'identity'" in text
    assert ("write 'patch' at block_output[0] pos={all scope:{variable:entity}} "
            "add_scaled(0.5, scale=2.0) via 'identity' on its features [1, 3]") in text
    assert "Observe  metrics=['iia/match', 'logit_diff/logit_diff']  saves=['iia.json']" in text
    observe = compile_doc(patching).children[0]
    assert isinstance(observe, Observe) and observe.pass_.dynamic
    assert isinstance(compile_doc(patching), Plan)


def test_the_points_of_a_sweep_share_one_prompt_batch_per_rows_and_field(patching, data_root):
    """Tokenized once per compile: points reading the same rows with the same field get the
    very same batch; a point whose field differs gets its own, of its own prompts."""
    patching["sites"]["target"]["layers"] = {"sweep": [[0], [1]]}
    patching["roles"]["base"]["field"] = {"sweep": ["input", "counterfactual_inputs[0]"]}
    plan = causalab.compile.compile_document(patching, data_root=str(data_root))
    batches = {c.name: c.children[0].pass_.inputs for c in plan.children}
    assert len(batches) == 4
    by_field: dict = {}
    for inputs in batches.values():
        by_field.setdefault(inputs["base"].field, []).append(inputs["base"])
        assert inputs["counterfactual"] is next(iter(batches.values()))["counterfactual"]
    assert sorted(by_field) == ["counterfactual_inputs[0]", "input"]
    for field_path, found in by_field.items():
        assert len(found) == 2 and found[0] is found[1]
    assert by_field["input"][0].prompts == tuple(r["input"] for r in json.loads(
        (data_root / "days.json").read_text()) if r["split"] == "train")
    assert by_field["counterfactual_inputs[0]"][0].prompts == (
        next(iter(batches.values()))["counterfactual"].prompts)
