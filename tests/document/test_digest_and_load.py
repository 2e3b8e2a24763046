"""The point digest (docs/format.md §2) and the JSON reader's own refusals (V3, V4, bad JSON)."""
from __future__ import annotations

import hashlib
import json

import pytest

from causalab.document import digest, load_json, lower
from causalab.errors import DocumentError
from document_examples import dbm, patching


def _reversed_keys(node):
    if isinstance(node, dict):
        return {k: _reversed_keys(node[k]) for k in reversed(list(node))}
    if isinstance(node, list):
        return [_reversed_keys(v) for v in node]
    return node


def test_the_digest_is_sha256_of_compact_sorted_json_without_header():
    doc = patching()
    body = {k: v for k, v in doc.items() if k != "header"}
    expected = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                              .encode()).hexdigest()
    assert digest(doc) == expected and len(expected) == 64


def test_editing_the_description_leaves_the_digest_unchanged():
    doc = patching()
    before = digest(doc)
    doc["header"]["description"] = "something else entirely"
    assert digest(doc) == before
    del doc["header"]
    assert digest(doc) == before


def test_key_order_does_not_change_the_digest():
    doc = patching()
    assert digest(_reversed_keys(doc)) == digest(doc)


def test_two_spellings_of_one_experiment_digest_differently():
    explicit = patching()
    assert explicit["interventions"]["patch"]["reads"]["v_cf"]["featurizer"] == "identity"
    omitted = patching()
    del omitted["interventions"]["patch"]["reads"]["v_cf"]["featurizer"]
    assert digest(explicit) != digest(omitted)


def test_every_sweep_point_has_its_own_digest():
    digests = {digest(p.document) for p in lower(dbm())}
    assert len(digests) == 4


def test_a_document_loads_from_a_file_path(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(patching()))
    assert load_json(path) == patching()
    assert load_json(str(path)) == patching()


def test_a_duplicate_key_is_refused_at_the_path_of_its_object():
    text = '{"steps": {"a": {"kind": "observe"}, "b": [{"x": 1, "x": 2}]}}'
    with pytest.raises(DocumentError) as caught:
        load_json(text)
    assert caught.value.path == ("steps", "b", 0)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"],
                         ids=["nan", "infinity", "minus_infinity", "overflow"])
def test_a_non_finite_number_is_refused_at_its_path(literal):
    with pytest.raises(DocumentError) as caught:
        load_json('{"a": {"b": [0, %s]}}' % literal)
    assert caught.value.path == ("a", "b", 1)


def test_bad_json_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "model": {},\n  "roles": \n}\n')
    with pytest.raises(DocumentError) as caught:
        load_json(path)
    assert "broken.json" in str(caught.value) and "line 4" in str(caught.value)


def test_a_missing_file_is_a_document_error(tmp_path):
    with pytest.raises(DocumentError):
        load_json(tmp_path / "absent.json")


def test_the_digest_answers_to_both_import_spellings():
    from causalab.document import digest as exported
    from causalab.document.digest import digest as from_module

    doc = patching()
    assert exported is from_module
    assert exported(doc) == digest(doc)


def test_bad_json_text_can_carry_its_file_name():
    with pytest.raises(DocumentError) as caught:
        load_json('{"a": 1,,}', name="documents/v2/x.json")
    assert "documents/v2/x.json: line 1" in str(caught.value)
