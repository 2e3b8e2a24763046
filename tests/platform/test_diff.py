"""``causalab diff A B``: two runs of one sweep are the same; an edited data table is not.

The head-patching sweep (four points on the tiny Llama) runs into two output folders and,
tracked with ``rerun``, twice into one store: both pairs diff to exit status 0. A copy of
the data whose first row's counterfactual answer is changed runs into a third folder; its
diff exits 1 and names every point and the metrics that moved, whose new values are the means
of the edited tables computed here.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import causalab
from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "documents" / "data"
HEADS = str(REPO / "documents" / "v2" / "head_patching.json")
POINTS = ["heads=0", "heads=1", "heads=2", "heads=3"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    edited = root / "data"
    shutil.copytree(DATA / "weekdays", edited / "weekdays")
    table = edited / "weekdays" / "train.json"
    rows = json.loads(table.read_text(encoding="utf-8"))
    rows[0]["cf_answer"] = " Monday" if rows[0]["cf_answer"] != " Monday" else " Tuesday"
    table.write_text(json.dumps(rows), encoding="utf-8")
    for name, data in (("one", DATA), ("two", DATA), ("edited", edited)):
        causalab.run(HEADS, out=str(root / name), data_root=str(data))
    return root


def _diff(capsys, *argv) -> tuple[int, str]:
    status = main(["diff", *map(str, argv)])
    return status, capsys.readouterr().out


def test_two_runs_of_one_sweep_are_the_same(folders, capsys):
    status, out = _diff(capsys, folders / "one", folders / "two")
    assert status == 0, out
    assert out.strip() == "diff: 4 point(s) matched, 16 metric(s) equal; the same within 1e-06"


def test_an_edited_data_table_names_the_points_and_metrics_that_moved(folders, capsys):
    status, out = _diff(capsys, folders / "one", folders / "edited", "--json")
    assert status == 1
    result = json.loads(out)
    moved = {(m["point"], m["metric"]) for m in result["moved"]}
    assert {point for point, _ in moved} == set(POINTS)
    assert {metric for _, metric in moved} <= {"iia/patch", "logit_diff/patch"}
    assert all((point, "logit_diff/patch") in moved for point in POINTS)
    for entry in result["moved"]:  # the new value is the edited table's mean, computed here
        table = json.loads((folders / "edited" / entry["point"] /
                            f"{entry['metric'].split('/')[0]}.json").read_text())
        values = [row["value"] for row in table if row["eligible"]]
        assert entry["b"] == pytest.approx(sum(values) / len(values), abs=1e-12)
    status, text = _diff(capsys, folders / "one", folders / "edited", "--tol", "100")
    assert status == 0, text  # a tolerance wider than any logit difference moved


def test_the_text_report_names_each_moved_metric_on_its_own_line(folders, capsys):
    status, out = _diff(capsys, folders / "one", folders / "edited")
    assert status == 1
    lines = out.strip().splitlines()
    assert lines[-1].startswith("diff: 4 point(s) matched,") and "moved beyond 1e-06" in lines[-1]
    assert any(line.startswith("heads=0  logit_diff/patch: ") for line in lines)



def test_a_run_id_the_store_does_not_hold_is_one_line_naming_the_side(folders, tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).search_experiments()  # a store, made by MLflow, without that run
    capsys.readouterr()  # MLflow's own lines as it made the store
    status = main(["diff", str(folders / "one"), "0123456789abcdef", "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert status != 0
    assert "0123456789abcdef: no such folder or run in" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err

@pytest.mark.slow  # two tracked sweeps into a store; the folder tests above cover the comparison
def test_two_tracked_runs_of_one_sweep_diff_by_their_parents(folders, tmp_path, capsys,
                                                             monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parents = []
    for _ in range(2):
        result = causalab.run(HEADS, track=True, tracking_uri=uri, experiment="diff",
                              rerun=True, data_root=str(DATA))
        from mlflow import MlflowClient

        point = MlflowClient(uri).get_run(next(iter(result.runs.values())))
        parents.append(point.data.tags["mlflow.parentRunId"])
    status, out = _diff(capsys, parents[0], parents[1], "--tracking-uri", uri)
    assert status == 0, out
    assert out.strip().startswith("diff: 4 point(s) matched")
    status, out = _diff(capsys, parents[0], folders / "edited", "--tracking-uri", uri)
    assert status == 1 and "heads=0  logit_diff/patch: " in out  # a run against a folder


def test_a_side_that_is_neither_a_folder_nor_a_run_is_one_line(tmp_path, capsys):
    status = main(["diff", str(tmp_path / "missing.d"), str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 2 and captured.err.count("\n") == 1
    assert "missing.d: not an output folder" in captured.err
