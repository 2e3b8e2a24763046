"""The exported JSON Schema, checked by an independent validator (``jsonschema``).

The authored form must accept every corpus document as written, sweeps included, and each
lowered point must fit the point form; a mistake causalab refuses should fail here too.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from causalab.document import json_schema, lower, point_schema

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted(p for p in (REPO / "documents").rglob("*.json")
                if p.relative_to(REPO / "documents").parts[0] not in ("data", "artifacts"))
IDS = [str(p.relative_to(REPO / "documents").with_suffix("")) for p in CORPUS]


@pytest.fixture(scope="module")
def authored() -> jsonschema.Draft202012Validator:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def point() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(point_schema())


def _errors(validator: jsonschema.Draft202012Validator, document: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:160]}"
            for e in validator.iter_errors(document)]


def test_the_corpus_is_found_and_holds_sweeps():
    assert len(CORPUS) >= 31
    assert sum('"sweep"' in p.read_text() for p in CORPUS) >= 13


@pytest.mark.parametrize("path", CORPUS, ids=IDS)
def test_every_corpus_document_validates_as_written_and_at_every_point(path, authored, point):
    raw = json.loads(path.read_text())
    assert _errors(authored, raw) == []
    for lowered in lower(raw):
        assert _errors(point, lowered.document) == [], lowered.label


def _das() -> dict:
    return json.loads((REPO / "documents" / "v2" / "das_rank_sweep.json").read_text())


def test_a_sweep_wrapper_is_not_a_point(point):
    assert _errors(point, _das())


def test_a_sweep_under_model_is_refused_by_the_schema(authored):
    raw = _das()
    raw["model"]["dtype"] = {"sweep": ["fp32", "bf16"]}
    assert any(e.startswith("model") for e in _errors(authored, raw))


def test_a_misspelled_key_inside_a_swept_document_is_refused(authored):
    raw = _das()
    site = next(iter(raw["sites"].values()))
    site["layer"] = site.pop("layers")
    assert _errors(authored, raw)


def test_a_swept_value_must_fit_the_slot_it_replaces(authored):
    raw = _das()
    name = next(iter(raw["sites"]))
    bad = copy.deepcopy(raw)
    bad["sites"][name]["layers"] = {"sweep": ["zero", "one"]}
    assert _errors(authored, bad)
    bad["sites"][name]["layers"] = {"sweep": {"range": [0, 2]}}  # ints, but layers is a list
    assert _errors(authored, bad)
    good = copy.deepcopy(raw)
    good["sites"][name]["layers"] = [{"sweep": {"range": [0, 2]}, "as": "layer"}]
    assert _errors(authored, good) == []
