"""A store causalab made, moved or copied as a folder, keeps working where it now is.

Real tracked runs of the corpus patching document on the tiny Llama into a plain-folder store
(``mlflow.db`` and ``mlartifacts/`` in it), then ``shutil.move`` / ``copytree`` of that folder.
What is checked is read with MLflow's own client: where a run says its artifacts are, and the
bytes it downloads, against the files the run wrote to ``--out``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from mlflow import MlflowClient

from causalab.pipeline import run_document
from causalab.tracking import TrackingEvents, stored
from causalab.tracking import runs as store

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
PATCHING = json.loads((REPO / "documents" / "v2" / "patching.json").read_text())
EXPERIMENT = "moved"


def _track(folder: Path, out: Path, rerun: bool = False) -> TrackingEvents:
    with TrackingEvents(tracking_uri=str(folder), experiment=EXPERIMENT, out=str(out),
                        rerun=rerun) as events:
        run_document(PATCHING, out=str(out), data_root=DATA, events=events)
    return events


def _client(folder: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")


def _points(folder: Path) -> list:
    client = _client(folder)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    return [run for run in client.search_runs([experiment])
            if run.data.tags.get(store.KIND) == "point"]


def test_a_moved_store_reads_and_writes_its_artifacts_where_it_now_is(tmp_path):
    first = _track(tmp_path / "a", tmp_path / "out1")
    point, label = next(iter(first.point_runs.values())), next(iter(first.point_runs))
    table = next(p for p in (tmp_path / "out1" / label).iterdir() if p.suffix == ".json"
                 and p.name != "document.json")
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert not (tmp_path / "a").exists()

    again = _track(tmp_path / "b", tmp_path / "out2")  # causalab opens it: rebased first
    assert again.skipped and not again.point_runs  # every stored file found where it now is
    client = _client(tmp_path / "b")
    here = (tmp_path / "b" / "mlartifacts").resolve().as_uri()
    assert client.get_run(point).info.artifact_uri.startswith(here)
    assert client.get_experiment_by_name(EXPERIMENT).artifact_location.startswith(here)
    got = Path(client.download_artifacts(point, table.name, str(tmp_path / "down")))
    assert got.read_bytes() == table.read_bytes()

    _track(tmp_path / "b", tmp_path / "out3", rerun=True)
    assert not (tmp_path / "a").exists()  # nothing written where the store used to be
    newest = max(_points(tmp_path / "b"), key=lambda run: run.info.start_time)
    assert newest.info.artifact_uri.startswith(here)
    assert Path(client.download_artifacts(newest.info.run_id, table.name,
                                          str(tmp_path / "down3"))).is_file()


def test_a_copied_store_is_rebased_alone_and_the_original_keeps_its_place(tmp_path):
    _track(tmp_path / "a", tmp_path / "out1")
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    _track(tmp_path / "c", tmp_path / "out2", rerun=True)
    original = (tmp_path / "a" / "mlartifacts").resolve().as_uri()
    copy = (tmp_path / "c" / "mlartifacts").resolve().as_uri()
    assert all(run.info.artifact_uri.startswith(original) for run in _points(tmp_path / "a"))
    assert all(run.info.artifact_uri.startswith(copy) for run in _points(tmp_path / "c"))
    assert len(_points(tmp_path / "c")) == 2 * len(_points(tmp_path / "a"))


def test_a_link_whose_origin_is_gone_for_good_is_not_done_and_says_why(tmp_path):
    client = _client(tmp_path)
    experiment = client.create_experiment("gone")
    link = client.create_run(experiment, tags={store.PRODUCED_BY: "d" * 64,
                                               store.REUSED_FROM: "0" * 32}).info.run_id
    client.set_terminated(link, "FINISHED")
    done, why = stored.done_runs(client, experiment, {"d" * 64: {}})
    assert done == {} and "is gone from the store" in why["d" * 64] and link in why["d" * 64]
