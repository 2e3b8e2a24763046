"""The DAS rank sweep as a researcher meets it: from Python as DataFrames, in MLflow's real UI.

``experiment=das`` (three ranks, its random-subspace control) is rendered from the shipped
Hydra configs onto the tiny Llama (layer 1, one epoch, to stay fast), run once through
``causalab.run`` tracked to the session's real ``mlflow server``, and then read back: as
params and metrics through MlflowClient, as tables through ``causalab.read_table`` and
``causalab.search_points``, and as pages in Debian's Chromium driven by Playwright.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

import causalab
from causalab.hydra.rendering import render
from causalab.tracking import runs as store
from causalab.tracking import stored

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def das(mlflow_server, tmp_path_factory):
    """experiment=das on the tiny Llama, tracked once; its result, runs and experiment id."""
    experiment = f"das-ui-{tmp_path_factory.getbasetemp().name}"
    document = render(["experiment=das", "model=tiny_llama", "site.layer=1",
                       "steps.fit.epochs=1"])
    out = tmp_path_factory.mktemp("das")
    result = causalab.run(document, out=str(out), track=True, tracking_uri=mlflow_server,
                          experiment=experiment, data_root=DATA)
    client = MlflowClient(mlflow_server)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=100)
    points = {r.info.run_name: r for r in runs if r.data.tags.get(store.KIND) == "point"}
    return {"result": result, "points": points, "experiment": experiment, "out": out,
            "experiment_id": found.experiment_id, "client": client, "document": document}


def test_the_experiment_is_made_as_a_model_training_experiment(das):
    tags = das["client"].get_experiment(das["experiment_id"]).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_das_point_logs_at_most_forty_params_with_its_rank_and_site(das):
    assert sorted(das["points"]) == ["k=1", "k=16", "k=4"]
    for name, run in das["points"].items():
        params = run.data.params
        assert len(params) <= 40, sorted(params)
        assert params["k"] == name.split("=")[1]
        assert params["model.key"] == "causalab:tiny-llama"
        assert params["component"] == "block_input" and params["layer"] == "1"
        assert params["fit.lr"] == "0.02" and params["featurizer"] == "subspace"


def test_each_test_metric_has_its_control_beside_it_and_counts_apart(das):
    for run in das["points"].values():
        metrics = run.data.metrics
        listed = sorted(metrics)  # the order MLflow's metric list and compare table show
        scores = [key for key in listed if not key.endswith((".lo", ".hi"))]
        for name in ("iia", "logit_diff", "ce"):
            test, control = f"{name}/test", f"{name}/control"
            assert abs(scores.index(test) - scores.index(control)) == 1, listed
            for score in (test, control):  # each interval's ends sort right after its score
                at = listed.index(score)
                assert listed[at + 1:at + 3] == [f"{score}.hi", f"{score}.lo"], listed
            assert metrics[f"n/{name}/test"] == 12
        counts = [key for key in listed if key.startswith("n/")]
        assert listed[-len(counts) - 1:-1] == counts and listed[-1] == "train/loss"


def test_read_table_of_a_runs_uri_is_the_saved_table_and_its_mean_is_the_metric(das,
                                                                                 mlflow_server):
    run = das["points"]["k=4"]
    table = causalab.read_table(f"runs:/{run.info.run_id}/test_iia.json",
                                tracking_uri=mlflow_server)
    assert {"example_id", "value", "eligible", "reason"} <= set(table.columns)
    local = json.loads((das["out"] / "k=4" / "test_iia.json").read_text())
    assert table["example_id"].tolist() == [row["example_id"] for row in local]
    kept = [row["value"] for row in local if row["eligible"]]
    # The metric is a float32 mean logged as float64: equal to the plain mean within 1e-6.
    assert run.data.metrics["iia/test"] == pytest.approx(sum(kept) / len(kept), abs=1e-6)


def test_the_run_result_holds_every_points_tables_as_one_dataframe(das):
    frame = das["result"].table("control_iia.json")
    assert sorted(frame["point"].unique()) == ["k=1", "k=16", "k=4"]
    assert len(frame) == 3 * 12 and frame["eligible"].all()
    assert set(das["result"].runs) == {"k=1", "k=4", "k=16"}


def test_search_points_is_one_row_per_point_with_its_rank_and_scores(das, mlflow_server):
    frame = causalab.search_points(das["experiment"], tracking_uri=mlflow_server)
    assert sorted(frame["k"].tolist()) == [1, 4, 16]
    for _, row in frame.iterrows():
        run = das["points"][f"k={row['k']}"]
        assert row["iia/test"] == run.data.metrics["iia/test"]
        assert row["iia/control"] == run.data.metrics["iia/control"]
        assert row["produced_by"] == run.data.tags[store.PRODUCED_BY]
        assert row["model"] == "causalab:tiny-llama"


def test_every_point_run_has_its_run_record(das):
    for run in das["points"].values():
        names = {a.path for a in das["client"].list_artifacts(run.info.run_id)}
        assert {"run.json", "document.json", "test_iia.json", "plots"} <= names


def test_a_new_parent_asking_for_done_points_links_each_one_with_its_metrics(das,
                                                                             mlflow_server,
                                                                             tmp_path):
    from causalab.pipeline import run_document
    from causalab.tracking import TrackingEvents

    client = das["client"]
    parent = store.create_run(client, das["experiment_id"], "again", {store.KIND: "multirun"})
    events = TrackingEvents(tracking_uri=mlflow_server, experiment=das["experiment"],
                            out=str(tmp_path), parent_run_id=parent)
    run_document(das["document"], out=str(tmp_path), data_root=DATA, events=events)
    events.wait()
    assert sorted(events.skipped) == ["k=1", "k=16", "k=4"]
    (sweep,) = store.children(client, das["experiment_id"], parent)
    links = store.children(client, das["experiment_id"], sweep.info.run_id)
    assert sorted(r.info.run_name for r in links) == ["k=1", "k=16", "k=4"]
    for link in links:
        origin = das["points"][link.info.run_name]
        assert link.data.tags[store.REUSED_FROM] == origin.info.run_id
        assert link.data.metrics["iia/test"] == origin.data.metrics["iia/test"]
        assert link.data.params["k"] == origin.data.params["k"]
    k4 = das["points"]["k=4"]
    done, _ = stored.done_runs(client, das["experiment_id"], {
        k4.data.tags[store.PRODUCED_BY]: json.loads(k4.data.tags[stored.INPUTS])})
    assert done == {k4.data.tags[store.PRODUCED_BY]: k4.info.run_id}


def test_the_ui_opens_on_the_runs_table_and_compares_k_with_both_iia_scores(
        das, mlflow_server, tmp_path):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian chromium is missing: run `make setup`"
    ids = [das["points"][name].info.run_id for name in ("k=1", "k=4", "k=16")]
    compare = (f"{mlflow_server}/#/compare-runs?runs={json.dumps(ids)}"
               f"&experiments={json.dumps([das['experiment_id']])}")
    shot = tmp_path / "compare.png"
    with sync_playwright() as driver:
        browser = driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=_FLAGS,
            viewport={"width": 1500, "height": 1100})
        try:
            page = browser.new_page()
            page.goto(store.runs_page(mlflow_server, das["experiment_id"]))
            page.get_by_text("Run Name").first.wait_for(timeout=60_000)
            body = page.inner_text("body")
            assert "/runs" in page.url and "matching runs" in body
            assert "No data available for the selected time range" not in body
            page.goto(compare)
            page.get_by_text("iia/control").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shot), full_page=True)
            rows = page.inner_text("body").splitlines()
        finally:
            browser.close()
    print(f"compare page screenshot: {shot}")
    assert {"k", "iia/test", "iia/control"} <= {row.strip() for row in rows}
    assert shot.stat().st_size > 10_000
    assert not math.isnan(das["points"]["k=1"].data.metrics["iia/control"])


def test_a_runs_uri_resolves_with_no_track_when_a_tracking_uri_is_set(das, mlflow_server,
                                                                      tmp_path, monkeypatch,
                                                                      capsys):
    from causalab.cli.main import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("CAUSALAB_HOME", str(tmp_path / "home"))
    run = das["points"]["k=4"]
    point = json.loads((das["out"] / "k=4" / "document.json").read_text())
    apply = json.loads((REPO / "documents" / "v2" / "das_apply.json").read_text())
    apply["model"] = point["model"]
    apply["sites"]["target"] = point["sites"]["target"]
    apply["featurizers"]["rot"].update(k=4, file_path=f"runs:/{run.info.run_id}/rot.safetensors")
    apply["interventions"]["das"]["reads"]["v_cf"]["pos"] = -1
    apply["steps"]["apply"]["rows"] = point["steps"]["test"]["rows"]
    document = tmp_path / "apply.json"
    document.write_text(json.dumps(apply))
    status = main(["run", str(document), "--no-track", "--device-map", "cpu",
                   "--out", str(tmp_path / "out"), "--data-root", DATA])
    assert status == 0, capsys.readouterr().err
    applied = json.loads((tmp_path / "out" / "logit_diff.json").read_text())
    scored = json.loads((das["out"] / "k=4" / "test_logit_diff.json").read_text())
    # The same rotation at the same site on the same rows: equal within float32 noise.
    assert [r["value"] for r in applied] == pytest.approx([r["value"] for r in scored], abs=1e-5)


def test_the_run_result_holds_a_published_mean_as_the_tensor_a_plain_forward_gives(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer, resolve

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        result = causalab.run("documents/v2/mean_ablation.json", out=str(tmp_path),
                              data_root=DATA)
    published = result.value("mean")
    path = resolve("causalab:tiny-llama").path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(path)
    rows = json.loads((REPO / "documents" / "data" / "weekdays_full" / "data.json").read_text())
    # One unpadded forward per row: block 0's output at the last token, averaged over rows.
    with torch.no_grad():
        last = [model(**tokenizer(row["input"], return_tensors="pt"), output_hidden_states=True)
                .hidden_states[1][0, -1] for row in rows if row.get("split") == "train"]
    expected = torch.stack(last).mean(0)
    assert published.reshape(-1).shape == expected.shape
    # float32 sums over 30 rows in another order: equal within 1e-5.
    assert torch.allclose(published.reshape(-1).float(), expected, atol=1e-5)
    assert set(result.tables) == {"clean.json", "ablated.json"}
