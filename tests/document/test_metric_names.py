"""`iia` names an interchange-intervention accuracy (a `match` metric) and nothing else: no shipped
document or experiment calls another metric that, and `causalab validate` warns, in one line on
stderr and without refusing, about a document that does."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from causalab.cli.main import main
from causalab.document import naming_warnings

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (REPO / "documents").rglob("*.json")
                 if not {"data", "artifacts"} & set(p.relative_to(REPO / "documents").parts))
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def _metrics(document: dict):
    """(path, name, kind) of every metric of a raw document, read here without causalab."""
    for name, body in (document.get("interventions") or {}).items():
        entries = enumerate(body) if isinstance(body, list) else [(None, body)]
        for index, entry in entries:
            for metric, spec in (entry.get("metrics") or {}).items():
                at = ("interventions", name) + (() if index is None else (index,))
                yield at + ("metrics", metric), metric, spec.get("kind")


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_no_shipped_document_calls_a_metric_iia_unless_it_is_a_match(path):
    document = json.loads(path.read_text())
    wrong = [at for at, name, kind in _metrics(document) if name == "iia" and kind != "match"]
    assert wrong == [] and naming_warnings(document) == []


def test_no_experiment_renders_a_metric_iia_unless_it_is_a_match():
    from causalab.hydra.rendering import render

    for experiment in EXPERIMENTS:
        document = render([f"experiment={experiment}", "model=tiny_llama"])
        wrong = [at for at, name, kind in _metrics(document) if name == "iia" and kind != "match"]
        assert wrong == [], experiment


def test_validate_warns_in_one_line_about_a_logit_difference_called_iia_and_still_passes(
        tmp_path, capsys):
    document = json.loads((REPO / "documents" / "v2" / "das_apply.json").read_text())
    metrics = document["interventions"]["das"]["metrics"]
    document["interventions"]["das"]["metrics"] = {"iia": metrics.pop("logit_diff"), **metrics}
    document["steps"]["apply"]["saves"][0]["value"] = "iia"
    path = tmp_path / "misnamed.json"
    path.write_text(json.dumps(document))
    status = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert status == 0 and "valid document" in out
    (line,) = err.splitlines()
    assert line.startswith("warning: interventions.das.metrics.iia: ") and "logit_diff" in line


def test_a_match_called_iia_and_a_logit_difference_called_logit_diff_draw_no_warning():
    document = {"interventions": {"patch": [{"metrics": {
        "iia": {"kind": "match"}, "logit_diff": {"kind": "logit_diff"}}}]}}
    assert naming_warnings(document) == []
    document["interventions"]["patch"][0]["metrics"]["iia"]["kind"] = "cross_entropy"
    assert [path for path, _ in naming_warnings(document)] == [
        ("interventions", "patch", 0, "metrics", "iia")]
