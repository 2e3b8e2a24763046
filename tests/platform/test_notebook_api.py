"""The notebook API as docs/tour.md's cells use it, run twice as a notebook would rerun them.

`causalab.run("documents/v2/das_rank_sweep.json", track=True)` (a fit-only sweep over three
ranks) is tracked to a temporary SQLite store, then run again: the rerun reuses every point
and still gives back the same tables, scores and values, read from the store. `search_points`
carries a fit's final eval and loss, `causalab.render` stays callable, a Result shows itself
as a table, a run given no `out=` leaves no folder behind once its process ends, and MLflow's
HTTP settings are as they were after a tracked run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

import causalab
from causalab.tracking.reach import DEADLINES

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
RANK_SWEEP = str(REPO / "documents" / "v2" / "das_rank_sweep.json")


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    """The rank sweep tracked once, then the same cell again; both results and the store."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    settings = {name: os.environ.get(name) for name in DEADLINES}
    first = causalab.run(RANK_SWEEP, track=True, tracking_uri=uri, experiment="notebook",
                         data_root=DATA)
    again = causalab.run(RANK_SWEEP, track=True, tracking_uri=uri, experiment="notebook",
                         data_root=DATA)
    return {"first": first, "again": again, "uri": uri, "client": MlflowClient(uri),
            "settings": settings}


def test_a_tracked_run_leaves_the_notebooks_mlflow_settings_as_they_were(twice):
    """causalab's deadlines hold for its own calls alone: a notebook's own MLflow calls after
    a tracked run keep MLflow's HTTP settings (or the user's)."""
    assert {name: os.environ.get(name) for name in DEADLINES} == twice["settings"]


def test_a_rerun_reuses_every_point_and_gives_back_the_same_tables(twice):
    first, again = twice["first"], twice["again"]
    assert sorted(again.skipped) == ["k=1", "k=16", "k=4"] and again.runs == {}
    assert sorted(again.tables) == sorted(first.tables)
    assert "k=4/heldout_logit_diff.json" in again.tables
    for name, frame in first.tables.items():
        assert again.tables[name].equals(frame), name
    assert again.table("heldout_logit_diff.json").equals(first.table("heldout_logit_diff.json"))
    # The reused points' files are where a fresh run writes them.
    assert (Path(again.out) / "k=16" / "rot.safetensors").is_file()


def test_a_rerun_gives_back_each_points_coordinates_and_scores(twice):
    first, again = twice["first"], twice["again"]
    assert again.coordinates == first.coordinates == {
        "k=1": {"k": 1}, "k=4": {"k": 4}, "k=16": {"k": 16}}
    runs = {p: twice["client"].get_run(run_id) for p, run_id in first.runs.items()}
    for point, run in runs.items():
        stored = {k: v for k, v in run.data.metrics.items() if not k.startswith("n/")}
        assert set(stored) == {"train/loss", "eval/logit_diff"}
        assert again.scores[point] == stored
        assert first.scores[point] == pytest.approx(stored, rel=1e-6)


def test_search_points_carries_the_fits_final_eval_and_loss_of_every_point(twice):
    frame = causalab.search_points("notebook", tracking_uri=twice["uri"])
    assert sorted(frame["k"].tolist()) == [1, 4, 16]
    assert {"eval/logit_diff", "train/loss"} <= set(frame.columns)
    client = twice["client"]
    for _, row in frame.iterrows():
        history = client.get_metric_history(row["run_id"], "eval/logit_diff")
        last = max(history, key=lambda m: (m.step, m.timestamp))
        assert row["eval/logit_diff"] == last.value
        assert not frame["train/loss"].isna().any()


def test_a_result_shows_its_points_coordinates_and_scores_as_a_table(twice):
    first, again = twice["first"], twice["again"]
    shown = repr(again)
    assert shown.splitlines()[0].startswith("Result: 3 point(s), 3 reused from the store")
    assert {"point", "k", "reused"} <= set(shown.splitlines()[1].split())
    frame = first.points()
    assert frame["point"].tolist() == ["k=1", "k=4", "k=16"] and frame["k"].tolist() == [1, 4, 16]
    page = again._repr_html_()
    assert page.count("<tr") == 4 and "k=16" in page


def test_causalab_render_stays_callable_after_its_module_is_imported():
    import importlib

    document = causalab.render(["experiment=patching", "model=tiny_llama"])
    importlib.import_module("causalab.hydra.rendering")  # a submodule named render shadowed it
    assert causalab.render(["experiment=patching", "model=tiny_llama"]) == document
    assert callable(causalab.render) and callable(causalab.run)


_CELL = """
import json, sys, causalab
result = causalab.run(sys.argv[1], data_root=sys.argv[2], **json.loads(sys.argv[3]))
print(result.out)
"""


@pytest.mark.parametrize("given", [False, True], ids=["no out", "out given"])
def test_a_run_given_no_out_removes_its_folder_when_the_process_ends(given, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    options = {"out": str(tmp_path / "mine")} if given else {}
    done = subprocess.run([sys.executable, "-c", _CELL, str(REPO / "documents" / "v2" /
                                                            "patching.json"), DATA,
                           json.dumps(options)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = Path(done.stdout.strip().splitlines()[-1])
    assert out.is_dir() == given
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("causalab-")]


def test_search_points_shows_one_sweep_by_default_and_every_point_when_asked(twice):
    """Two documents in one experiment (the rank sweep, then the two-layer logit lens): by
    default the table is the newest sweep's points alone, not both with NaN beside each."""
    uri, name = twice["uri"], "notebook-scope"
    ranks = causalab.run(RANK_SWEEP, track=True, tracking_uri=uri, experiment=name,
                         data_root=DATA)
    lens = causalab.run(str(REPO / "documents" / "v2" / "logit_lens.json"), track=True,
                        tracking_uri=uri, experiment=name, data_root=DATA)
    newest = causalab.search_points(name, tracking_uri=uri)
    assert sorted(newest["run_id"]) == sorted(lens.runs.values())
    assert "k" not in newest.columns and "iia/test" not in newest.columns
    parent = newest.attrs["sweep"]
    assert set(newest["parent_run_id"]) == {parent}
    by_id = causalab.search_points(name, sweep=parent, tracking_uri=uri)
    assert sorted(by_id["run_id"]) == sorted(newest["run_id"])
    mine = causalab.search_points(ranks, tracking_uri=uri)
    assert sorted(mine["run_id"]) == sorted(ranks.runs.values()) and len(mine) == 3
    assert sorted(mine["k"].tolist()) == [1, 4, 16]
    every = causalab.search_points(name, sweep="all", tracking_uri=uri)
    assert len(every) == 5 and every.attrs["sweep"] is None
