"""Every validate-time refusal of docs/format.md §14.1 (V1–V28), each asserted by its JSON path."""
from __future__ import annotations

import json
import math

import pytest

from causalab.document import load_json, validate
from causalab.errors import CausalabError, DocumentError
from document_examples import TRAIN, dbm, das, decode_probe, patching, point

IV = ("interventions", "patch")
DAS = ("interventions", "das")


def _patch(doc: dict) -> dict:
    return doc["interventions"]["patch"]


def _das(doc: dict) -> dict:
    return doc["interventions"]["das"]


def _set(doc: dict, path: tuple, value) -> None:
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _drop(doc: dict, path: tuple) -> None:
    node = doc
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


def _case(rule: str, word: str, base, change, path: tuple):
    return pytest.param(base, change, path, id=f"{rule}-{word}")


def _text_duplicate_key() -> str:
    text = json.dumps(patching())
    return text.replace('"component": "lm_head"}',
                        '"component": "lm_head", "component": "logits"}')


def _text_nan() -> str:
    return json.dumps(das()).replace('"lr": 0.001', '"lr": NaN')


def _two_models(doc: dict, extra: dict, order: list) -> None:
    body = _patch(doc)
    body["writes"].update(extra)
    body["models"]["patched"]["writes"] = order


def _extra_read(body: dict, name: str, **fields) -> None:
    read = {"site": "head", "pos": -1, "input": "base"}
    read.update(fields)
    body["reads"][name] = read


def _list_step(doc: dict) -> None:
    doc["interventions"]["other"] = json.loads(json.dumps(_patch(doc)))
    step = doc["steps"]["patch"]
    step["interventions"] = ["patch", "other"]
    step["outputs"] = {}
    step["saves"] = [{"value": "iia", "file_path": "iia.json"}]


def _root_save_into_a_list_entry(doc: dict, root_path: str) -> None:
    """A list step ``compare`` saving ``iia.json`` (into ``compare/patch/``), then a root step
    saving ``root_path``."""
    doc["interventions"]["other"] = json.loads(json.dumps(_patch(doc)))
    doc["steps"] = {
        "compare": {"kind": "observe", "interventions": ["patch", "other"],
                    "rows": {"base": TRAIN, "counterfactual": TRAIN},
                    "saves": [{"value": "patch/iia", "file_path": "iia.json"}]},
        "root": {"kind": "observe", "interventions": "patch",
                 "rows": {"base": TRAIN, "counterfactual": TRAIN},
                 "saves": [{"value": "iia", "file_path": root_path}]}}


def _second_publisher(doc: dict) -> None:
    doc["steps"]["again"] = json.loads(json.dumps(doc["steps"]["patch"]))
    doc["steps"]["again"]["saves"] = []


def _fit_step(doc: dict) -> dict:
    return doc["steps"]["fit"]


CASES = [
    # V1 unknown key
    _case("V1", "top_level", patching, lambda d: d.update(extra=1), ("extra",)),
    _case("V1", "in_read", patching, lambda d: _patch(d)["reads"]["v_cf"].update(colour=1),
          IV + ("reads", "v_cf", "colour")),
    _case("V1", "in_position", patching,
          lambda d: _set(d, IV + ("reads", "v_cf", "pos"), {"index": -1, "from": 0}),
          IV + ("reads", "v_cf", "pos", "from")),
    _case("V1", "in_ref_operand", patching,
          lambda d: _set(d, IV + ("writes", "patch", "operand"), {"ref": "x", "as": 1}),
          IV + ("writes", "patch", "operand", "as")),
    _case("V1", "in_step", patching, lambda d: d["steps"]["patch"].update(save=[]),
          ("steps", "patch", "save")),
    # V2 missing required field
    _case("V2", "model_dtype", patching, lambda d: _drop(d, ("model", "dtype")),
          ("model", "dtype")),
    _case("V2", "read_input", patching, lambda d: _drop(d, IV + ("reads", "v_cf", "input")),
          IV + ("reads", "v_cf", "input")),
    _case("V2", "metric_column", patching, lambda d: _drop(d, IV + ("metrics", "iia", "b")),
          IV + ("metrics", "iia", "b")),
    _case("V2", "step_rows", patching, lambda d: _drop(d, ("steps", "patch", "rows")),
          ("steps", "patch", "rows")),
    _case("V2", "step_kind", patching, lambda d: _drop(d, ("steps", "patch", "kind")),
          ("steps", "patch", "kind")),
    _case("V2", "optimizer_lr", das, lambda d: _drop(d, ("steps", "fit", "optimizer", "lr")),
          ("steps", "fit", "optimizer", "lr")),
    # V3 wrong type, strictness, non-finite
    _case("V3", "empty_revision", patching, lambda d: _set(d, ("model", "revision"), ""),
          ("model", "revision")),
    _case("V3", "empty_model_key", patching, lambda d: _set(d, ("model", "key"), ""),
          ("model", "key")),
    _case("V3", "bool_for_int", das, lambda d: _set(d, ("steps", "fit", "epochs"), True),
          ("steps", "fit", "epochs")),
    _case("V3", "float_for_int", patching,
          lambda d: _set(d, ("sites", "target", "layers"), [0.0]),
          ("sites", "target", "layers", 0)),
    _case("V3", "numeric_string", das,
          lambda d: _set(d, ("steps", "fit", "optimizer", "lr"), "0.001"),
          ("steps", "fit", "optimizer", "lr")),
    _case("V3", "non_finite_value", das,
          lambda d: _set(d, ("steps", "fit", "optimizer", "lr"), math.inf),
          ("steps", "fit", "optimizer", "lr")),
    _case("V3", "non_finite_text", _text_nan, None, ("steps", "fit", "optimizer", "lr")),
    _case("V3", "bool_position", patching,
          lambda d: _set(d, IV + ("reads", "v_cf", "pos"), True), IV + ("reads", "v_cf", "pos")),
    _case("V3", "unknown_mechanism", patching,
          lambda d: _set(d, IV + ("writes", "patch", "mechanism"), "swapp"),
          IV + ("writes", "patch", "mechanism")),
    _case("V3", "unknown_metric_kind", patching,
          lambda d: _set(d, IV + ("metrics", "iia", "kind"), "accuracy"),
          IV + ("metrics", "iia", "kind")),
    _case("V3", "unknown_dtype", patching, lambda d: _set(d, ("model", "dtype"), "fp8"),
          ("model", "dtype")),
    _case("V3", "objective_weight_string", das,
          lambda d: _set(d, ("steps", "fit", "objective"), [["1.0", "ce"]]),
          ("steps", "fit", "objective", 0, 0)),
    # V4 duplicate key
    _case("V4", "duplicate_key", _text_duplicate_key, None, ("sites", "head")),
    # V5 steps
    _case("V5", "empty_steps", patching, lambda d: _set(d, ("steps",), {}), ("steps",)),
    _case("V5", "step_named_featurizers", patching,
          lambda d: d["steps"].update(featurizers=d["steps"].pop("patch")),
          ("steps", "featurizers")),
    # V6 sweep lowering
    _case("V6", "swept_model", patching,
          lambda d: _set(d, ("model", "dtype"), {"sweep": ["fp32", "bf16"]}), ("model", "dtype")),
    _case("V6", "swept_header", patching,
          lambda d: _set(d, ("header", "description"), {"sweep": ["a", "b"]}),
          ("header", "description")),
    _case("V6", "empty_sweep", patching,
          lambda d: _set(d, ("sites", "target", "layers"), {"sweep": []}),
          ("sites", "target", "layers")),
    _case("V6", "malformed_range", patching,
          lambda d: _set(d, ("sites", "target", "layers", 0), {"sweep": {"range": [0]}}),
          ("sites", "target", "layers", 0)),
    _case("V6", "range_step_zero", patching,
          lambda d: _set(d, ("sites", "target", "layers", 0), {"sweep": {"range": [0, 4, 0]}}),
          ("sites", "target", "layers", 0)),
    _case("V6", "unknown_spelling", patching,
          lambda d: _set(d, ("sites", "target", "layers", 0), {"sweep": {"values": [0, 1]}}),
          ("sites", "target", "layers", 0)),
    _case("V6", "named_axis_mismatch", patching,
          lambda d: (_set(d, IV + ("reads", "v_cf", "pos"), {"sweep": [-2, -1], "as": "pos"}),
                     _set(d, IV + ("writes", "patch", "pos"), {"sweep": [-1], "as": "pos"})),
          IV + ("writes", "patch", "pos")),
    _case("V6", "duplicate_labels", patching,
          lambda d: _set(d, ("steps", "patch", "rows", "base"), {"sweep": ["w/x", "w_x"]}),
          ("steps", "patch", "rows", "base")),
    _case("V6", "too_many_points", patching,
          lambda d: _set(d, ("sites", "target", "layers", 0), {"sweep": {"range": [0, 10**9]}}),
          ("sites", "target", "layers", 0)),
    # V7 undeclared names
    _case("V7", "site_in_read", patching, lambda d: _set(d, IV + ("reads", "v_cf", "site"), "x"),
          IV + ("reads", "v_cf", "site")),
    _case("V7", "site_in_write", patching,
          lambda d: _set(d, IV + ("writes", "patch", "site"), "x"), IV + ("writes", "patch", "site")),
    _case("V7", "role_in_read", patching,
          lambda d: _set(d, IV + ("reads", "v_cf", "input"), "x"), IV + ("reads", "v_cf", "input")),
    _case("V7", "role_in_model", patching,
          lambda d: _set(d, IV + ("models", "patched", "input"), "x"),
          IV + ("models", "patched", "input")),
    _case("V7", "role_in_rows", patching,
          lambda d: _set(d, ("steps", "patch", "rows", "x"), "weekdays/data"),
          ("steps", "patch", "rows", "x")),
    _case("V7", "model_in_read", patching,
          lambda d: _set(d, IV + ("reads", "logits", "model"), "x"),
          IV + ("reads", "logits", "model")),
    _case("V7", "featurizer_in_read", patching,
          lambda d: _set(d, IV + ("reads", "v_cf", "featurizer"), "x"),
          IV + ("reads", "v_cf", "featurizer")),
    _case("V7", "featurizer_in_write", patching,
          lambda d: _set(d, IV + ("writes", "patch", "featurizer"), "x"),
          IV + ("writes", "patch", "featurizer")),
    _case("V7", "featurizer_in_params", das, lambda d: _set(d, ("steps", "fit", "params"), ["x"]),
          ("steps", "fit", "params", 0)),
    _case("V7", "featurizer_in_names", das,
          lambda d: _set(d, ("steps", "export", "names"), ["x"]), ("steps", "export", "names", 0)),
    _case("V7", "featurizer_in_anneal", lambda: point(dbm()),
          lambda d: _set(d, ("steps", "fit", "anneal"), {"x": {"start": 1, "end": 0.5}}),
          ("steps", "fit", "anneal", "x")),
    _case("V7", "intervention_on_step", patching,
          lambda d: _set(d, ("steps", "patch", "interventions"), "x"),
          ("steps", "patch", "interventions")),
    _case("V7", "intervention_in_list", patching,
          lambda d: _set(d, ("steps", "patch", "interventions"), ["patch", "x"]),
          ("steps", "patch", "interventions", 1)),
    _case("V7", "write_in_model", patching,
          lambda d: _set(d, IV + ("models", "patched", "writes"), ["x"]),
          IV + ("models", "patched", "writes", 0)),
    # V8 reserved and colliding names
    _case("V8", "model_named_original", patching,
          lambda d: _patch(d)["models"].update(original={"input": "base", "writes": []}),
          IV + ("models", "original")),
    _case("V8", "inline_name_collides", patching,
          lambda d: _set(d, ("steps", "patch", "interventions"), _patch(d)),
          ("steps", "patch", "interventions")),
    # V9 observe without interventions
    _case("V9", "observe_without_interventions", patching,
          lambda d: _drop(d, ("steps", "patch", "interventions")), ("steps", "patch")),
    _case("V9", "fit_without_interventions", das,
          lambda d: _drop(d, ("steps", "fit", "interventions")), ("steps", "fit")),
    # V10 rows for every role a forward runs on
    _case("V10", "observe_rows", patching,
          lambda d: _drop(d, ("steps", "patch", "rows", "counterfactual")),
          ("steps", "patch", "rows")),
    _case("V10", "eval_rows", das,
          lambda d: _drop(d, ("steps", "fit", "eval", "rows", "base")),
          ("steps", "fit", "eval", "rows")),
    # V11 sites
    _case("V11", "two_layers", patching, lambda d: _set(d, ("sites", "target", "layers"), [0, 1]),
          ("sites", "target", "layers")),
    _case("V11", "per_layer_without_layers", patching,
          lambda d: _drop(d, ("sites", "target", "layers")), ("sites", "target", "layers")),
    _case("V11", "whole_model_with_layers", patching,
          lambda d: _set(d, ("sites", "head", "layers"), [0]), ("sites", "head", "layers")),
    _case("V11", "heads_and_units", patching,
          lambda d: _set(d, ("sites", "target"), {"component": "attention_premix",
                                                  "layers": [0], "heads": [0], "units": [1]}),
          ("sites", "target", "units")),
    _case("V11", "heads_off_per_head", patching,
          lambda d: _set(d, ("sites", "target", "heads"), [0]), ("sites", "target", "heads")),
    _case("V11", "empty_units", patching, lambda d: _set(d, ("sites", "target", "units"), []),
          ("sites", "target", "units")),
    _case("V11", "duplicate_units", patching,
          lambda d: _set(d, ("sites", "target", "units"), [1, 1]), ("sites", "target", "units")),
]

POS = IV + ("reads", "v_cf", "pos")
WPOS = IV + ("writes", "patch", "pos")
CASES += [
    _case("V12", "zero_cuts", patching, lambda d: _set(d, POS, {"scope": {"variable": "entity"}}),
          POS),
    _case("V12", "two_cuts", patching, lambda d: _set(d, POS, {"index": -1, "last": 1}), POS),
    _case("V12", "last_zero", patching, lambda d: _set(d, POS, {"last": 0}), POS),
    _case("V12", "backwards_span", patching, lambda d: _set(d, POS, {"span": [3, 1]}), POS),
    _case("V12", "all_false", patching, lambda d: _set(d, POS, {"all": False}), POS),
    _case("V12", "empty_scope", patching, lambda d: _set(d, POS, {"index": -1, "scope": {}}), POS),
    _case("V12", "eos_in_prompt", patching,
          lambda d: _set(d, POS, {"index": -1, "scope": {"segment": "eos"}}), POS),
    _case("V12", "malformed_form", patching, lambda d: _set(d, POS, "last"), POS),
    *(_case("V12", f"segment_{name}", patching,
            lambda d, segment=segment: _set(d, POS, {"index": -1, "scope": {"segment": segment}}),
            POS)
      for name, segment in (("unknown_role", "robot"), ("index_not_a_number", "user[x]"),
                            ("negative_index", "user[-1]"), ("empty_index", "user[]"),
                            ("indexed_eos", "eos[0]"))),
    _case("V13", "generated_without_decode", patching,
          lambda d: _set(d, POS, {"frame": "generated", "index": 0}), POS),
    _case("V13", "step_past_decode", lambda: point(decode_probe(), 2),
          lambda d: _set(d, ("interventions", "probe", "decode"), 1),
          ("interventions", "probe", "reads", "step", "pos")),
    _case("V13", "write_with_generated_scope", patching,
          lambda d: (_set(d, IV + ("decode",), 2),
                     _set(d, WPOS, {"frame": "generated", "index": -1,
                                    "scope": {"variable": "said"}})), WPOS),
    _case("V13", "write_at_finished_cut", patching,
          lambda d: (_set(d, IV + ("decode",), 2),
                     _set(d, WPOS, {"frame": "generated", "last": 1})), WPOS),
    _case("V13", "wide_lm_head_under_decode", lambda: point(decode_probe()),
          lambda d: _extra_read(d["interventions"]["probe"], "wide", pos={"last": 2}),
          ("interventions", "probe", "reads", "wide", "pos")),
    _case("V14", "write_at_input_ids", patching,
          lambda d: _set(d, ("sites", "target"), {"component": "input_ids"}),
          IV + ("writes", "patch", "site")),
    _case("V15", "unexpected_param", patching,
          lambda d: _set(d, IV + ("writes", "patch", "params"), {"scale": 2.0}),
          IV + ("writes", "patch", "params")),
    _case("V15", "missing_param", patching,
          lambda d: _set(d, IV + ("writes", "patch", "mechanism"), "lerp"),
          IV + ("writes", "patch", "params")),
    _case("V15", "clamp_without_bounds", patching,
          lambda d: _set(d, IV + ("writes", "patch"), {"site": "target", "pos": -1,
                                                       "mechanism": "clamp"}),
          IV + ("writes", "patch", "params")),
    _case("V15", "clamp_bounds_backwards", patching,
          lambda d: _set(d, IV + ("writes", "patch"), {"site": "target", "pos": -1,
                                                       "mechanism": "clamp",
                                                       "params": {"lo": 5, "hi": 1}}),
          IV + ("writes", "patch", "params")),
    _case("V15", "float_gaussian_seed", patching,
          lambda d: _set(d, IV + ("writes", "patch"), {"site": "target", "pos": -1,
                                                       "mechanism": "gaussian",
                                                       "params": {"seed": 1.0}}),
          IV + ("writes", "patch", "params")),
    _case("V15", "lerp_weight_past_fp32", patching,
          lambda d: _set(d, IV + ("writes", "patch"), {"site": "target", "pos": -1,
                                                       "mechanism": "lerp", "operand": "v_cf",
                                                       "params": {"t": 1e308}}),
          IV + ("writes", "patch", "params", "t")),
    _case("V15", "literal_operand_past_fp32", patching,
          lambda d: _set(d, IV + ("writes", "patch", "operand"), -1e39),
          IV + ("writes", "patch", "operand")),
    _case("V15", "operand_on_renormalize", patching,
          lambda d: _set(d, IV + ("writes", "patch", "mechanism"), "renormalize"),
          IV + ("writes", "patch", "operand")),
    _case("V15", "no_operand_on_swap", patching,
          lambda d: _drop(d, IV + ("writes", "patch", "operand")),
          IV + ("writes", "patch", "operand")),
    _case("V16", "bare_operand_not_a_read", patching,
          lambda d: _set(d, IV + ("writes", "patch", "operand"), "mean"),
          IV + ("writes", "patch", "operand")),
    _case("V16", "logits_view_operand", patching,
          lambda d: _set(d, IV + ("reads", "v_cf", "view"), "logits"),
          IV + ("writes", "patch", "operand")),
    _case("V17", "operand_width", patching, lambda d: _set(d, WPOS, {"last": 2}), WPOS),
    _case("V18", "renormalize_first", patching,
          lambda d: _two_models(d, {"restore": {"site": "target", "pos": -1,
                                                "mechanism": "renormalize"}},
                                ["restore", "patch"]),
          IV + ("models", "patched", "writes")),
    _case("V18", "renormalize_alone", patching,
          lambda d: _two_models(d, {"restore": {"site": "target", "pos": -1,
                                                "mechanism": "renormalize"}}, ["restore"]),
          IV + ("models", "patched", "writes")),
    _case("V18", "two_absolute_writes", patching,
          lambda d: _two_models(d, {"zero": {"site": "target", "pos": {"last": 2},
                                             "mechanism": "swap", "operand": 0.0}},
                                ["patch", "zero"]),
          IV + ("models", "patched", "writes")),
    _case("V19", "logits_view_off_residual", patching,
          lambda d: (d["sites"].update(mlp={"component": "mlp_output", "layers": [0]}),
                     _extra_read(_patch(d), "lens", site="mlp", view="logits")),
          IV + ("reads", "lens", "view")),
    _case("V19", "logits_view_with_featurizer", das,
          lambda d: _set(d, DAS + ("reads", "v_cf", "view"), "logits"),
          DAS + ("reads", "v_cf", "view")),
    _case("V20", "read_named_generated", patching,
          lambda d: _extra_read(_patch(d), "x.generated"), IV + ("reads", "x.generated")),
    _case("V20", "metric_named_train_loss", patching,
          lambda d: _patch(d)["metrics"].update({"train/loss": _patch(d)["metrics"]["ce"]}),
          IV + ("metrics", "train/loss")),
    _case("V20", "output_named_mask", patching,
          lambda d: _set(d, ("steps", "patch", "outputs"), {"g.mask": "v_cf"}),
          ("steps", "patch", "outputs", "g.mask")),
    _case("V21", "of_not_a_read", patching,
          lambda d: _set(d, IV + ("metrics", "iia", "of"), "x"), IV + ("metrics", "iia", "of")),
    _case("V21", "of_wide_read", patching,
          lambda d: _set(d, IV + ("reads", "logits", "pos"), {"last": 2}),
          IV + ("metrics", "iia", "of")),
    _case("V21", "of_ragged_read", patching,
          lambda d: _set(d, IV + ("reads", "logits", "pos"),
                         {"all": True, "scope": {"variable": "entity"}}),
          IV + ("metrics", "iia", "of")),
    _case("V21", "of_not_vocabulary_shaped", patching,
          lambda d: _set(d, IV + ("metrics", "iia", "of"), "v_cf"),
          IV + ("metrics", "iia", "of")),
    # interchange's clean gap is read on the unpatched model, not the patched one
    _case("V21", "clean_gap_read_on_the_patched_model", patching,
          lambda d: _set(d, IV + ("metrics", "gap"), {
              "kind": "interchange", "of": "logits", "base_of": "logits",
              "counterfactual_of": "logits", "a": "cf_answer", "b": "base_answer"}),
          IV + ("metrics", "gap", "base_of")),
    _case("V21", "clean_gap_read_not_a_read", patching,
          lambda d: _set(d, IV + ("metrics", "gap"), {
              "kind": "interchange", "of": "logits", "base_of": "nothing",
              "counterfactual_of": "logits", "a": "cf_answer", "b": "base_answer"}),
          IV + ("metrics", "gap", "base_of")),
    _case("V22", "control_on_a_featurizer_it_does_not_load", das,
          lambda d: _set(d, ("featurizers", "rot", "control"), "random_init"),
          ("featurizers", "rot", "control")),
]

CASES += [
    _case("V22", "subspace_without_k", das, lambda d: _drop(d, ("featurizers", "rot", "k")),
          ("featurizers", "rot")),
    _case("V22", "gate_with_k", das,
          lambda d: _set(d, ("featurizers", "rot"), {"kind": "gate", "k": 2}),
          ("featurizers", "rot")),
    _case("V22", "gate_with_seed", das,
          lambda d: _set(d, ("featurizers", "rot"), {"kind": "gate", "seed": 2}),
          ("featurizers", "rot")),
    _case("V22", "pca_without_file", das,
          lambda d: _set(d, ("featurizers", "rot"), {"kind": "pca", "k": 2}),
          ("featurizers", "rot")),
    _case("V22", "loaded_with_seed", das,
          lambda d: _set(d, ("featurizers", "rot"), {"kind": "subspace", "k": 2, "seed": 1,
                                                     "file_path": "rot.safetensors"}),
          ("featurizers", "rot")),
    _case("V23", "featurizer_at_two_sites", das,
          lambda d: (d["sites"].update(other={"component": "block_output", "layers": [1]}),
                     _extra_read(_das(d), "x", site="other", featurizer="rot")),
          ("featurizers", "rot")),
    _case("V23", "featurizer_used_nowhere", das,
          lambda d: d["featurizers"].update(spare={"kind": "subspace", "k": 2}),
          ("featurizers", "spare")),
    _case("V8", "one_intervention_listed_twice", patching,
          lambda d: (_list_step(d), _set(d, ("steps", "patch", "interventions"),
                                         ["patch", "other", "patch"])),
          ("steps", "patch", "interventions", 2)),
    _case("V24", "use_before_fit", das,
          lambda d: _set(d, ("steps",), {"early": {**d["steps"]["score"], "saves": []},
                                          **d["steps"]}),
          ("steps", "early")),
    _case("V25", "params_naming_pca", das,
          lambda d: _set(d, ("featurizers", "rot"), {"kind": "pca", "k": 2,
                                                     "file_path": "pca.safetensors"}),
          ("steps", "fit", "params", 0)),
    _case("V25", "params_empty", das, lambda d: _set(d, ("steps", "fit", "params"), []),
          ("steps", "fit", "params")),
    _case("V25", "params_listing_one_featurizer_twice", das,
          lambda d: _set(d, ("steps", "fit", "params"), ["rot", "rot"]),
          ("steps", "fit", "params", 1)),
    _case("V25", "objective_term_unknown", das,
          lambda d: _set(d, ("steps", "fit", "objective"), [[1.0, "loss"]]),
          ("steps", "fit", "objective", 0, 1)),
    _case("V25", "mask_term_untrained_gate", lambda: point(dbm()),
          lambda d: _set(d, ("steps", "fit", "objective", 1, 1), "rot.mask"),
          ("steps", "fit", "objective", 1, 1)),
    _case("V25", "anneal_on_non_gate", das,
          lambda d: _set(d, ("steps", "fit", "anneal"), {"rot": {"start": 1, "end": 0.1}}),
          ("steps", "fit", "anneal", "rot")),
    _case("V25", "anneal_start_not_positive", lambda: point(dbm()),
          lambda d: _set(d, ("steps", "fit", "anneal", "mask", "start"), 0),
          ("steps", "fit", "anneal", "mask")),
    _case("V25", "early_stop_not_a_metric", das,
          lambda d: _set(d, ("steps", "fit", "early_stop", "metric"), "loss"),
          ("steps", "fit", "early_stop", "metric")),
    _case("V25", "optimizer_not_adamw", das,
          lambda d: _set(d, ("steps", "fit", "optimizer", "name"), "sgd"),
          ("steps", "fit", "optimizer", "name")),
    _case("V26", "weights_naming_sae", das,
          lambda d: (d["featurizers"].update(dictionary={"kind": "sae",
                                                         "file_path": "sae.safetensors",
                                                         "trust_unstamped": True}),
                     _extra_read(_das(d), "x", site="target", featurizer="dictionary"),
                     _set(d, ("steps", "export", "names"), ["rot", "dictionary"])),
          ("steps", "export", "names", 1)),
    _case("V27", "output_not_a_read", patching,
          lambda d: _set(d, ("steps", "patch", "outputs", "source"), "x"),
          ("steps", "patch", "outputs", "source")),
    _case("V27", "k_without_pca", patching,
          lambda d: _set(d, ("steps", "patch", "outputs", "source"),
                         {"read": "v_cf", "reduce": "mean", "k": 2}),
          ("steps", "patch", "outputs", "source")),
    _case("V27", "pca_without_k", patching,
          lambda d: _set(d, ("steps", "patch", "outputs", "source"),
                         {"read": "v_cf", "reduce": "pca"}),
          ("steps", "patch", "outputs", "source")),
    _case("V27", "output_named_like_read", patching,
          lambda d: _set(d, ("steps", "patch", "outputs"), {"v_cf": "v_cf"}),
          ("steps", "patch", "outputs", "v_cf")),
    _case("V27", "two_steps_publish_one_name", patching, _second_publisher,
          ("steps", "again", "outputs", "source")),
    _case("V27", "ref_to_unpublished", patching,
          lambda d: _set(d, IV + ("writes", "patch", "operand"), {"ref": "mean"}),
          IV + ("writes", "patch", "operand")),
    _case("V28", "value_not_produced", patching,
          lambda d: _set(d, ("steps", "patch", "saves", 0, "value"), "acc"),
          ("steps", "patch", "saves", 0, "value")),
    _case("V28", "metric_to_safetensors", patching,
          lambda d: _set(d, ("steps", "patch", "saves", 0, "file_path"), "iia.safetensors"),
          ("steps", "patch", "saves", 0, "file_path")),
    _case("V28", "tensor_to_json", patching,
          lambda d: _set(d, ("steps", "patch", "saves", 1, "file_path"), "source.json"),
          ("steps", "patch", "saves", 1, "file_path")),
    _case("V28", "absolute_path", patching,
          lambda d: _set(d, ("steps", "patch", "saves", 0, "file_path"), "/tmp/iia.json"),
          ("steps", "patch", "saves", 0, "file_path")),
    _case("V28", "escaping_path", patching,
          lambda d: _set(d, ("steps", "patch", "saves", 0, "file_path"), "a/../../iia.json"),
          ("steps", "patch", "saves", 0, "file_path")),
    _case("V28", "collides_with_run_json", patching,
          lambda d: _set(d, ("steps", "patch", "saves", 0, "file_path"), "run.json"),
          ("steps", "patch", "saves", 0, "file_path")),
    _case("V28", "eval_save_collides_later", das,
          lambda d: _set(d, ("steps", "score", "saves", 0, "file_path"), "./heldout_iia.json"),
          ("steps", "score", "saves", 0, "file_path")),
    _case("V28", "ambiguous_bare_name", patching, _list_step,
          ("steps", "patch", "saves", 0, "value")),
    _case("V28", "root_save_onto_a_list_entry_save", patching,
          lambda d: _root_save_into_a_list_entry(d, "compare/patch/iia.json"),
          ("steps", "root", "saves", 0, "file_path")),
    _case("V28", "root_save_inside_a_list_entry_file", patching,
          lambda d: _root_save_into_a_list_entry(d, "compare/patch/iia.json/deeper.json"),
          ("steps", "root", "saves", 0, "file_path")),
]


def _refusal(base, change) -> CausalabError:
    doc = base()
    if isinstance(doc, str):
        with pytest.raises(DocumentError) as caught:
            validate(load_json(doc))
        return caught.value
    change(doc)
    with pytest.raises(DocumentError) as caught:
        validate(doc)
    return caught.value


@pytest.mark.parametrize("base, change, path", CASES)
def test_a_bad_document_is_refused_at_the_path_of_its_rule(base, change, path):
    assert _refusal(base, change).path == path


@pytest.mark.parametrize("base", [patching, das, dbm, decode_probe],
                         ids=["patching", "das", "dbm", "decode"])
def test_the_unchanged_examples_are_valid(base):
    assert validate(base())


def test_every_rule_of_the_validate_table_has_a_case():
    rules = {param.id.split("-")[0] for param in CASES}
    assert rules == {f"V{n}" for n in range(1, 29)}


@pytest.mark.parametrize("path, value, message", [
    (("model",), "x", "expected an object, got a string"),
    (("sites", "target"), [1], "expected an object, got a list"),
    (("model", "revision"), "", "must not be empty"),
])
def test_a_refusal_speaks_of_json_types_never_of_the_schema_s_classes(path, value, message):
    # pydantic's "a valid dictionary or instance of ModelSpec" named a Python class.
    assert _refusal(patching, lambda d: _set(d, path, value)).message == message


def test_a_write_number_the_dtype_holds_is_accepted_however_large():
    doc = patching()
    _patch(doc)["writes"]["patch"].update(mechanism="lerp", params={"t": 1e20})
    assert validate(doc)
