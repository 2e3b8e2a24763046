"""The IOI tables' splits (scripts/make_ioi_data.py): held-out templates a reviewer trusts.

A template is read back from its rows alone: the words every row of it has (its names, places
and objects vary from row to row). The test rows' templates must come from families no
training row uses, and share with the training templates no word but the four the task's own
frame needs ("A and B ... the place ... a thing to"). The validation rows are carved from the
training templates; ``ioi_names`` also keeps the test rows' names out of every other row.
"""
from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "documents" / "data"
FRAME = {"and", "the", "a", "to"}  # what every IOI prompt says around its names
TABLES = ("ioi", "ioi_names")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _table(name: str) -> list[dict]:
    return json.loads((DATA / name / "data.json").read_text(encoding="utf-8"))


def templates(table: list[dict]) -> dict[int, tuple[str, list[str]]]:
    """template id -> (its split kind: test or training, the words in the order of its first
    row, kept where every row of the template has them)."""
    found: dict[int, list[dict]] = {}
    for row in table:
        found.setdefault(row["template"], []).append(row)
    shaped = {}
    for template, rows in found.items():
        common = set.intersection(*(set(_words(row["input"])) for row in rows))
        kinds = {"test" if row["split"] == "test" else "training" for row in rows}
        assert len(kinds) == 1, template  # a template is all test or all training
        shaped[template] = (kinds.pop(), [w for w in _words(rows[0]["input"]) if w in common])
    return shaped


@pytest.mark.parametrize("name", TABLES)
def test_the_test_rows_templates_share_no_family_with_training(name):
    table = _table(name)
    test = {row["family"] for row in table if row["split"] == "test"}
    training = {row["family"] for row in table if row["split"] != "test"}
    assert test and training and not test & training
    assert {row["split"] for row in table} == {"train", "valid", "test"}


@pytest.mark.parametrize("name", TABLES)
def test_held_out_templates_share_no_word_with_training_ones_but_the_task_s_frame(name):
    shaped = templates(_table(name))
    test = [words for kind, words in shaped.values() if kind == "test"]
    training = [words for kind, words in shaped.values() if kind == "training"]
    assert len(test) >= 3 and len(training) >= 8
    for held in test:
        for seen in training:
            assert set(held) & set(seen) <= FRAME, (held, seen)
            # Word-sequence similarity, frame words included (all a template shares can reach
            # 0.5): the near-paraphrases this split replaced reached 0.75.
            assert difflib.SequenceMatcher(None, held, seen).ratio() <= 0.5, (held, seen)


@pytest.mark.parametrize("name", TABLES)
def test_validation_rows_are_carved_from_the_training_templates(name):
    table = _table(name)
    shaped = templates(table)
    valid = [row for row in table if row["split"] == "valid"]
    assert len(valid) == 12
    assert all(shaped[row["template"]][0] == "training" for row in valid)
    assert len({row["example_id"] for row in table}) == len(table)


def _names(row: dict) -> set[str]:
    return {row["io"], row["s"], *(v["io"] for v in row["counterfactual_inputs_variables"])}


def test_the_held_out_names_table_keeps_its_test_names_out_of_every_other_row():
    table = _table("ioi_names")
    test = set().union(*(_names(r) for r in table if r["split"] == "test"))
    rest = set().union(*(_names(r) for r in table if r["split"] != "test"))
    assert len(test) >= 8 and len(rest) >= 20 and not test & rest
    # ioi/data.json shares them, as the option's other side.
    shared = _table("ioi")
    assert set().union(*(_names(r) for r in shared if r["split"] == "test")) & \
        set().union(*(_names(r) for r in shared if r["split"] != "test"))
