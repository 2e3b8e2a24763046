"""The documents/real/ corpus (docs/format.md §16.2): Llama-3.2-1B at its pinned commit, weekdays_full.

Validating needs nothing. Compiling needs the checkpoint's config and tokenizer, which come from
the hub cache: where the cache lacks them the compile test skips with the resolver's reason
(tests/QUARANTINE.md). A stand-in with Llama-3.2-1B's shape (16 layers, 32 heads of 64, hidden
2048) and the built-in tokenizer compiles every document offline, so a site out of range, a
head past the count or a sweep that lowers wrongly is caught without the hub. No weights load.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "documents" / "real"
DATA = REPO / "documents" / "data"
KEY = "meta-llama/Llama-3.2-1B"
REVISION = "4e20de362430cd3b72f300e6b0f18e50e7166e08"
# docs/format.md §16.2: the five documents and the points each lowers to.
POINTS = {
    "weekdays_layer_sweep": 32,
    "weekdays_head_patching": 96,
    "weekdays_behavior": 1,
    "weekdays_das": 4,
    "weekdays_pattern_patching": 32,
}
def _raw(name: str) -> dict:
    from causalab.document import load_json

    return load_json((REAL / f"{name}.json").read_text())


def test_the_real_corpus_holds_the_five_documents_of_format_16_2():
    # documents/real/ioi_* pin SmolLM2 (tests/engine/test_smollm2_ioi.py), not Llama-3.2-1B.
    assert {p.stem for p in REAL.glob("weekdays_*.json")} == set(POINTS)


@pytest.mark.parametrize("name", sorted(POINTS))
def test_each_real_document_pins_llama_3_2_1b_at_its_commit_in_fp32(name):
    raw = _raw(name)
    assert raw["model"]["key"] == KEY
    assert raw["model"]["revision"] == REVISION
    assert raw["model"]["dtype"] == "fp32"
    assert len(raw["header"]["description"]) > 80


@pytest.mark.parametrize("name", sorted(POINTS))
def test_each_real_document_validates_offline_into_its_points(name):
    from causalab.document import validate

    points = validate(_raw(name))
    assert len(points) == POINTS[name]


def test_the_layer_sweep_ties_read_and_write_positions_into_one_named_axis():
    from causalab.document import validate

    labels = [point.label for point, _ in validate(_raw("weekdays_layer_sweep"))]
    assert labels[:2] == ["layers=0,pos=-4", "layers=0,pos=-1"]
    assert labels[-1] == "layers=15,pos=-1"


def test_the_pattern_patching_runs_under_eager_attention():
    assert _raw("weekdays_pattern_patching")["model"]["attn_implementation"] == "eager"


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> str:
    """A config-and-tokenizer directory shaped like Llama-3.2-1B, around the built-in tokenizer."""
    from causalab.models.readers import LLAMA_3_2_1B_SHAPE, shape_stand_in

    return shape_stand_in(tmp_path_factory.mktemp("llama_3_2_1b_shape"), LLAMA_3_2_1B_SHAPE)


@pytest.mark.parametrize("name", sorted(POINTS))
def test_each_real_document_compiles_against_a_stand_in_of_llama_3_2_1b_shape(name, stand_in):
    from causalab.compile import compile_document
    from causalab.pipeline import points_of

    raw = copy.deepcopy(_raw(name))
    raw["model"]["key"] = stand_in
    plan = compile_document(raw, data_root=str(DATA))
    assert len(points_of(plan)) == POINTS[name]


@pytest.mark.parametrize("name", sorted(POINTS))
def test_each_real_document_compiles_against_the_pinned_checkpoint(name):
    from causalab.compile import compile_document
    from causalab.errors import ModelError
    from causalab.models import resolve
    from causalab.pipeline import points_of

    try:
        resolve(KEY, REVISION)
    except ModelError as error:
        pytest.skip(f"needs the Llama-3.2-1B checkpoint from the hub: {error}")
    plan = compile_document(_raw(name), data_root=str(DATA))
    assert len(points_of(plan)) == POINTS[name]
