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


DAS = REPO / "documents" / "v2" / "das.json"
EVIL = "../../evil"


def _renamed_all(path: Path, old: str, new: str) -> dict:
    return json.loads(path.read_text().replace(f'"{old}"', json.dumps(new)))


def _as_axis(doc: dict) -> dict:
    doc["sites"]["target"]["layers"] = {"sweep": [[0], [1]], "as": EVIL}
    return doc


def _featurizer_file(doc: dict) -> dict:
    doc["featurizers"]["rot"]["file_path"] = "~/rot.safetensors"
    return doc


def _saved_to(path: str):
    def change(doc: dict) -> dict:
        doc["steps"]["patch"]["saves"][0]["file_path"] = path
        return doc
    return change


# Names that become a folder, a file or an MLflow key, and save paths with a shell form: each
# refused at validate at its own path. (name, document, expected path)
STORED = {
    "a_metric": (lambda: _renamed_all(PATCHING, "logit_diff", EVIL),
                 f"interventions.patch.metrics.{EVIL}"),
    "a_site": (lambda: _renamed_all(PATCHING, "target", EVIL), f"sites.{EVIL}"),
    "a_featurizer": (lambda: _renamed_all(DAS, "rot", EVIL), f"featurizers.{EVIL}"),
    "a_step": (lambda: _renamed_all(PATCHING, "patch", EVIL), f"interventions.{EVIL}"),
    "a_read": (lambda: _renamed_all(PATCHING, "v_cf", "a/b"), "interventions.patch.reads.a/b"),
    "a_role": (lambda: _renamed_all(PATCHING, "base", ".."), "roles..."),
    "a_model": (lambda: _renamed_all(PATCHING, "patched", "x\\y"),
                "interventions.patch.models.x\\y"),
    "a_name_past_255_bytes": (lambda: _renamed_all(PATCHING, "head", "é" * 128), "sites."),
    "an_axis": (lambda: _as_axis(json.loads(PATCHING.read_text())),
                "sites.target.layers.as"),
    "a_save_under_home": (lambda: _saved_to("~/x.json")(json.loads(PATCHING.read_text())),
                          "steps.patch.saves.0.file_path"),
    "a_save_under_a_variable": (lambda: _saved_to("$HOME/x.json")(
        json.loads(PATCHING.read_text())), "steps.patch.saves.0.file_path"),
    "a_featurizer_file_under_home": (lambda: _featurizer_file(json.loads(DAS.read_text())),
                                     "featurizers.rot.file_path"),
}


@pytest.mark.parametrize("case", list(STORED))
def test_a_name_that_is_stored_or_a_shell_form_is_refused_at_validate_at_its_path(
        case, tmp_path, capsys):
    make, place = STORED[case]
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(make()))
    status = main(["validate", str(path)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 1 and out == ""
    assert len(lines) == 1 and lines[0].startswith(f"error: {place}"), err


@pytest.mark.parametrize("case", ["a_metric", "a_site", "a_featurizer", "a_save_under_home"])
def test_run_refuses_a_stored_bad_name_in_one_line_before_anything_runs(case, tmp_path, capsys,
                                                                       monkeypatch):
    """``causalab run`` refuses what validate refuses, before the model loads: exit 1, one
    line, no ``--out`` and no tracking store."""
    make, place = STORED[case]
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(make()))
    monkeypatch.chdir(tmp_path)
    status = main(["run", str(path), "--out", str(tmp_path / "out"),
                   "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 1 and out == ""
    assert len(lines) == 1 and lines[0].startswith(f"error: {place}"), err
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "~").exists()


def test_mlflow_itself_refuses_the_keys_the_safe_name_rule_keeps_out():
    """The rule's premise, by MLflow's own validation: a metric key or a swept param key built
    from ``../../evil`` is refused by the store (after its point ran), one from a safe name is
    not."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_metric_name, _validate_param_name

    for bad in (f"{EVIL}/patch", f"sites.{EVIL}.layers"):
        with pytest.raises(MlflowException):
            (_validate_metric_name if "/patch" in bad else _validate_param_name)(bad)
    _validate_metric_name("logit diff/patch")
    _validate_param_name("sites.résidu 0.layers")
