"""Names a reader sees (explain, MLflow, tables) and save files, refused at ``causalab validate``.

Each case is the corpus's patching document changed in one way and validated through the
command line: one line on stderr naming the JSON path, a non-zero exit, nothing else. The
metric-key case is checked against MLflow's own key rule, imported here and nowhere in the
document room.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from causalab.cli.main import main
from causalab.document.names import mlflow_key

REPO = Path(__file__).resolve().parents[2]
PATCHING = REPO / "documents" / "v2" / "patching.json"


def _renamed(node: tuple, old: str, new: str):
    def change(doc):
        table = doc
        for part in node:
            table = table[part]
        table[new] = table.pop(old)
    return change


def _two_steps(first: str, second: str):
    def change(doc):
        step = doc["steps"].pop("patch")
        doc["steps"] = {first: {**step, "saves": []}, second: {**step, "saves": []}}
    return change


def _save(path: str):
    def change(doc):
        doc["steps"]["patch"]["saves"][0]["file_path"] = path
    return change


PATCH = ("interventions", "patch")
CASES = {
    "a_blank_site": (_renamed(("sites",), "target", "  "), "sites.  "),
    "an_empty_site": (_renamed(("sites",), "target", ""), "sites."),
    "a_blank_read": (_renamed(PATCH + ("reads",), "v_cf", "  "), "interventions.patch.reads.  "),
    "a_blank_model": (_renamed(PATCH + ("models",), "patched", " "),
                      "interventions.patch.models. "),
    "a_blank_metric": (_renamed(PATCH + ("metrics",), "logit_diff", "\t"),
                       "interventions.patch.metrics.\\t"),
    "a_newline_in_a_step": (_renamed(("steps",), "patch", "pa\ntch"), "steps.pa\\ntch"),
    "a_nul_in_a_role": (_renamed(("roles",), "base", "ba\x00se"), "roles.ba\\x00se"),
    "a_trailing_space": (_renamed(("interventions",), "patch", "patch "), "interventions.patch "),
    "two_steps_one_mlflow_key": (_two_steps("s🔥", "s💧"), "steps.s💧"),
    "a_save_with_no_stem": (_save(".json"), "steps.patch.saves.0.file_path"),
    "a_save_in_a_folder_with_no_stem": (_save("sub/.json"), "steps.patch.saves.0.file_path"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_unreadable_name_or_a_stemless_save_is_refused_at_validate_in_one_line(
        case, tmp_path, capsys):
    change, place = CASES[case]
    doc = json.loads(PATCHING.read_text())
    change(doc)
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    status = main(["validate", str(path)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status != 0 and out == ""
    assert len(lines) == 1 and lines[0].startswith(f"error: {place}: "), err


def test_the_collision_is_one_mlflow_key_by_mlflow_s_own_rule():
    """The refusal's premise: MLflow itself accepts both sanitised names as one key, and the
    document room's copy of the rule agrees with MLflow on every character class."""
    from mlflow.utils.validation import _validate_metric_name

    for key in ("iia/s🔥", "iia/s💧", "a b:c.d-e/f", "x\ny", "ü/é"):
        safe = mlflow_key(key)
        _validate_metric_name(safe)
    assert mlflow_key("iia/s🔥") == mlflow_key("iia/s💧") == "iia/s_"


def test_distinct_readable_names_still_validate(tmp_path, capsys):
    doc = json.loads(PATCHING.read_text())
    _two_steps("s🔥", "water")(doc)
    _renamed(("sites",), "target", "résidu 0")(doc)
    doc["interventions"]["patch"]["reads"]["v_cf"]["site"] = "résidu 0"
    doc["interventions"]["patch"]["writes"]["patch"]["site"] = "résidu 0"
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
