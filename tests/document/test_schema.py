"""The schema: round trips, sugar, strictness, the JSON Schema, and the vocab tables."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from causalab.document import Document, json_schema, validate, validate_point
from causalab.document import vocab
from causalab.document.positions import Position, as_position
from causalab.document.schema import Fit, Observe, Weights
from causalab.errors import DocumentError
from document_examples import das, dbm, decode_probe, patching, point

EXAMPLES = [patching, das, lambda: point(dbm(), 2), lambda: point(decode_probe(), 1)]
IDS = ["patching", "das", "dbm", "decode"]


@pytest.mark.parametrize("build", EXAMPLES, ids=IDS)
def test_a_validated_document_round_trips_through_its_dump(build):
    document = validate_point(build())
    dumped = document.model_dump(mode="json")
    again = Document.model_validate(json.loads(json.dumps(dumped)))
    assert again == document
    assert validate_point(dumped) == document


def test_steps_are_discriminated_on_kind_and_keep_their_order():
    document = validate_point(das())
    assert list(document.steps) == ["fit", "score", "export"]
    assert [type(s) for s in document.steps.values()] == [Fit, Observe, Weights]


def test_a_bare_integer_position_is_the_index_sugar():
    document = validate_point(patching())
    read = document.interventions["patch"].reads["v_cf"]
    assert read.pos == Position(index=-1) == as_position(-1) == as_position({"index": -1})
    assert read.pos.width == 1 and not read.pos.ragged


@pytest.mark.parametrize("spec, width, ragged", [
    ({"index": 0}, 1, False), ({"last": 3}, 3, False), ({"span": [2, 5]}, 3, False),
    ({"span": [-3, -1]}, 2, False), ({"span": [1, -1]}, None, True), ({"all": True}, None, True),
    ({"index": -1, "scope": {"variable": "entity"}}, 1, True),
], ids=["index", "last", "span", "negative_span", "mixed_span", "all", "anchored"])
def test_a_position_knows_its_static_width_and_raggedness(spec, width, ragged):
    position = as_position(spec)
    assert (position.width, position.ragged) == (width, ragged)


def test_defaults_are_filled_as_the_format_says():
    document = validate_point(patching())
    read = document.interventions["patch"].reads["v_cf"]
    write = document.interventions["patch"].writes["patch"]
    assert (read.model, read.featurizer, read.view) == ("original", "identity", "raw")
    assert write.params == {} and write.features is None
    assert document.model.attn_implementation is None and document.featurizers == {}
    metric = document.interventions["patch"].metrics["iia"]
    assert metric.token_form == "space_prefixed" and (metric.a, metric.b) == (
        "cf_answer", "base_answer")


def test_an_output_given_as_a_bare_string_is_an_unreduced_read():
    output = validate_point(patching()).steps["patch"].outputs["source"]
    assert (output.read, output.reduce, output.k) == ("v_cf", "none", None)


def test_an_int_is_accepted_where_a_number_is_expected_and_stays_an_int():
    doc = das()
    doc["steps"]["fit"]["objective"] = [[1, "ce"]]
    doc["steps"]["fit"]["optimizer"]["lr"] = 1
    fit = validate_point(doc).steps["fit"]
    assert fit.objective == [(1, "ce")] and fit.optimizer.lr == 1


def test_a_list_step_may_name_a_qualified_save_and_keeps_its_outputs_private():
    doc = patching()
    doc["interventions"]["other"] = json.loads(json.dumps(doc["interventions"]["patch"]))
    step = doc["steps"]["patch"]
    step["interventions"] = ["patch", "other", {**doc["interventions"]["patch"]}]
    step["saves"] = [{"value": "other/iia", "file_path": "iia.json"},
                     {"value": "patch[2]/iia", "file_path": "iia.json"}]
    assert validate_point(doc)
    doc["steps"]["later"] = {"kind": "observe", "rows": dict(step["rows"]), "interventions": {
        "reads": {"x": {"site": "target", "pos": -1, "input": "base"}},
        "writes": {"w": {"site": "target", "pos": -1, "mechanism": "swap",
                         "operand": {"ref": "source"}}},
        "models": {"m": {"input": "base", "writes": ["w"]}}}}
    with pytest.raises(DocumentError) as caught:
        validate_point(doc)
    assert caught.value.path == ("steps", "later", "interventions", "writes", "w", "operand")


def test_a_ref_to_an_earlier_output_is_accepted():
    doc = patching()
    doc["steps"]["ablate"] = {"kind": "observe", "rows": {"base": "weekdays/data"},
                              "interventions": {
        "reads": {"logits": {"site": "head", "pos": -1, "input": "base", "model": "m"}},
        "writes": {"w": {"site": "target", "pos": -1, "mechanism": "add_scaled",
                         "operand": {"ref": "source"}, "params": {"scale": 4}},
                   "r": {"site": "target", "pos": -1, "mechanism": "renormalize"}},
        "models": {"m": {"input": "base", "writes": ["w", "r"]}}}}
    assert validate_point(doc).steps["ablate"].interventions.writes["w"].operand.ref == "source"


def test_the_json_schema_accepts_a_bare_integer_at_every_pos():
    schema = json_schema()
    text = json.dumps(schema)
    for node in ("Read", "Write"):
        pos = schema["$defs"][node]["properties"]["pos"]
        assert {"type": "integer"} in pos["anyOf"], node
    assert '"additionalProperties": false' in text


def test_schema_literals_are_built_from_the_vocabulary_keys():
    schema = json_schema()["$defs"]
    assert set(schema["Write"]["properties"]["mechanism"]["enum"]) == set(vocab.MECHANISMS)
    kinds = set(schema["Featurizer"]["properties"]["kind"]["enum"])
    assert kinds == set(vocab.FEATURIZER_KINDS) - {"identity"}
    assert set(schema["Output"]["properties"]["reduce"]["enum"]) == set(vocab.REDUCE_MODES)


def test_the_vocabularies_have_the_sizes_the_format_names():
    assert len(vocab.COMPONENTS) == 21 and vocab.MAX_POINTS == 1000
    assert [r["columns"] for r in vocab.METRIC_KINDS.values()] == [
        ("expected",), ("a", "b"), ("target",), ("token",), ("token",), ("a", "b")]
    per_head = {n for n, r in vocab.COMPONENTS.items() if r["per_head"]}
    assert per_head == {"attention_query", "attention_key", "attention_scores",
                        "attention_probs", "attention_z", "attention_premix"}
    whole = {n for n, r in vocab.COMPONENTS.items() if r["whole_model"]}
    assert whole == {"input_ids", "embeddings", "ln_final", "lm_head", "logits"}


def test_vocab_renders_every_table_and_its_payload_is_json():
    text = vocab.render_vocab()
    for word in list(vocab.COMPONENTS) + list(vocab.MECHANISMS) + ["identity", "logit_diff(a, b)",
                                                                    "match/v1", "index=int"]:
        assert word in text
    payload = json.loads(json.dumps(vocab.vocab_payload()))
    assert payload["metric_kinds"]["logit_diff"] == ["a", "b"]
    assert payload["units"]["token_prob"] == {"unit": "probability",
                                              "estimand_version": "token_prob/v1"}
    assert payload["components"]["attention_query"]["interior"] is True
    assert payload["components"]["attention_probs"]["needs"] == ["attn_implementation=eager"]


def test_importing_the_document_room_loads_no_heavy_library():
    code = ("import sys, causalab.document, causalab.document.vocab, causalab.document.sweep; "
            "print([m for m in ('torch', 'transformers', 'nnsight', 'nnterp', 'mlflow', "
            "'hydra', 'safetensors') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_validate_returns_each_point_with_its_document():
    checked = validate(dbm())
    assert [p.coordinates["objective"] for p, _ in checked] == [0.0001, 0.002, 0.01, 0.05]
    assert all(isinstance(d, Document) for _, d in checked)
