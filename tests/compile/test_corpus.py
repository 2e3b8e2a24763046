"""The shipped corpus: every document validates, compiles on the built-in tiny Llama and
round-trips through ``explain --json``; the shipped tables are what docs/format.md §4.3 says they are.

Compiling needs the config and tokenizer only, never weights. A document that loads a bundle
made by running another document (``rot``, ``pca``) compiles once that artifact is shipped.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "documents" / "v2"
DATA = REPO / "documents" / "data"
DOCUMENTS = sorted(p.stem for p in CORPUS.glob("*.json"))
# docs/format.md §16.1, plus the rank sweep and the matched-rank control.
LISTED = {
    "patching", "zero_ablation", "mean_ablation", "steer_renormalize", "logit_lens", "das",
    "das_apply", "dbm", "pca_harvest", "pca_control", "neuron_patching", "head_patching",
    "sae_feature_ablation", "entity_patch", "entity_mean_ablation", "attention_knockout",
    "attention_pattern_patching", "generate_probe", "generated_answer", "das_rank_sweep",
    "das_control",
}
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _raw(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.json").read_text())


def _bundles(raw: dict) -> list[str]:
    return [f["file_path"] for f in raw.get("featurizers", {}).values() if f.get("file_path")]


def test_the_corpus_holds_every_listed_document():
    assert set(DOCUMENTS) == LISTED


@pytest.mark.parametrize("name", DOCUMENTS)
def test_each_document_says_what_it_shows_and_pins_the_built_in_tiny_llama(name):
    from causalab.models import resolve

    raw = _raw(name)
    assert len(raw["header"]["description"]) > 80
    model = raw["model"]
    assert model["key"] == "causalab:tiny-llama" and model["dtype"] == "fp32"
    assert model["revision"] == resolve("causalab:tiny-llama").revision


@pytest.mark.parametrize("name", DOCUMENTS)
def test_each_document_validates_at_every_point(name):
    from causalab.document import load_json, validate

    points = validate(load_json((CORPUS / f"{name}.json").read_text()))
    assert points


@pytest.mark.parametrize("name", DOCUMENTS)
def test_each_document_compiles_and_its_plan_round_trips_through_explain_json(name, capsys):
    import causalab.compile
    from causalab.compile.plan import plan_from_json

    raw = _raw(name)
    missing = [p for p in _bundles(raw) if not (REPO / p).is_file()]
    if missing:
        pytest.skip(f"artifact not shipped yet: {missing} (scripts/make_artifacts.py)")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # bundle paths are relative to the working directory
        status = main(["explain", "--json", f"documents/v2/{name}.json", "--data-root", str(DATA)])
        out, err = capsys.readouterr()
        assert status == 0, err
        plan = causalab.compile.compile_document(raw, data_root=str(DATA))
    payload = json.loads(out)
    assert plan_from_json(payload) == plan
    assert payload["text"].startswith("<root>: Plan")


@pytest.mark.parametrize("name, rows, splits", [
    ("weekdays/train", 4, {"all": 4}),
    ("weekdays/data", 4, {"train": 2, "test": 2}),
    ("weekdays_full/data", 42, {"train": 24, "valid": 6, "test": 12}),
    ("weekdays_aligned/data", 6, {"all": 6}),
    ("weekdays/said", 4, {"all": 4}),
    ("counting/train", 4, {"all": 4}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_each_shipped_table_has_its_rows_and_splits(name, rows, splits):
    table = json.loads((DATA / f"{name}.json").read_text())
    assert len(table) == rows
    found: dict[str, int] = {}
    for row in table:
        found[row["split"]] = found.get(row["split"], 0) + 1
        assert row["answer"] == row["base_answer"] and row["label"] == row["cf_answer"]
        assert row["base_answer"].startswith(" ") and row["cf_answer"].startswith(" ")
    assert found == splits
    assert len({row["example_id"] for row in table}) == rows


def test_weekdays_full_holds_every_ordered_pair_of_distinct_days():
    table = json.loads((DATA / "weekdays_full" / "data.json").read_text())
    pairs = {(row["entity"], row["cf_entity"]) for row in table}
    assert pairs == {(a, b) for a in DAYS for b in DAYS if a != b}
    assert {row["example_id"] for row in table} >= {"Sun-Mon", "Mon-Sun"}
    assert not any("counterfactual_inputs_variables" in row for row in table)
    for row in table:
        following = DAYS[(DAYS.index(row["entity"]) + 1) % 7]
        assert row["base_answer"] == " " + following
        assert row["input"] == f"If today is {row['entity']}, tomorrow is"


def test_weekdays_train_holds_thursday_to_sunday():
    table = json.loads((DATA / "weekdays" / "train.json").read_text())
    assert [row["entity"] for row in table] == ["Thursday", "Friday", "Saturday", "Sunday"]


def test_every_answer_cell_is_one_token_on_the_tiny_llama():
    from causalab.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve("causalab:tiny-llama").path)
    # The ioi table's answers are names on SmolLM2's tokenizer (tests/engine/test_smollm2_ioi.py).
    for path in (p for p in DATA.rglob("*.json") if p.parent.name not in ("ioi", "ioi_names")):
        for row in json.loads(path.read_text()):
            for column in ("base_answer", "cf_answer", "said"):
                if row.get(column):
                    ids = tokenizer(row[column], add_special_tokens=False)["input_ids"]
                    assert len(ids) == 1, (path.name, row["example_id"], column)


def test_aligned_pairs_tokenize_to_one_length_on_the_tiny_llama():
    from causalab.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve("causalab:tiny-llama").path)
    for row in json.loads((DATA / "weekdays_aligned" / "data.json").read_text()):
        base, counterfactual = row["input"], row["counterfactual_inputs"][0]
        assert len(tokenizer(base)["input_ids"]) == len(tokenizer(counterfactual)["input_ids"])


def test_chat_rows_are_user_assistant_user_messages():
    table = json.loads((DATA / "weekdays" / "chat.json").read_text())
    assert table
    for row in table:
        assert [m["role"] for m in row["chat"]] == ["user", "assistant", "user"]
