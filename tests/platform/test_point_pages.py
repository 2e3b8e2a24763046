"""What a point's and a sweep's pages say in MLflow, as plain data: each point run's description
(its scores, their 95 % intervals and their controls, rounded), the names that tell a
multirun's points apart, the coordinate their scores are logged against as MLflow's step, the
parent's description with its plots, and the MLflow app that makes a first visit open
model-training pages. The pages themselves, in a real browser: tests/platform/test_mlflow_ui.py.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from causalab.scores import naming, summary
from causalab.tracking import landing, points, runs as store

POINT = {"iia/test": 0.6666667, "iia/test.lo": 0.41666, "iia/test.hi": 0.9166, "iia/control": 0.0,
         "iia/control.lo": 0.0, "iia/control.hi": 0.0, "n/iia/test": 12.0, "n/iia/control": 12.0,
         "logit_diff/test": 4.37312, "logit_diff/test.lo": 1.0811, "logit_diff/test.hi": 7.6699,
         "logit_diff/control": -9.5961, "train/loss": 0.25, "eval/iia": 0.66}


def test_a_point_s_description_opens_on_its_main_score_its_interval_and_its_control_rounded():
    text = summary.description(POINT, title="causalab:weekday-llama · block_input L2 pos -1")
    first, *rest = text.split("\n\n")
    assert first == ("**iia/test 0.667** [0.42, 0.92] · control **iia/control 0.000** "
                     "[0.00, 0.00] · 12 rows")
    assert rest[0] == r"- logit\_diff/test 4.373 [1.08, 7.67] · control logit\_diff/control -9.596"
    assert r"*causalab:weekday-llama · block\_input L2 pos -1*" in rest[1]
    assert "95 % interval over the rows: Clopper-Pearson" in rest[1]
    assert "0.6666667" not in text and "train/loss" not in text  # rounded; a fit's series apart


def test_a_description_names_what_a_point_has_a_score_without_control_or_interval_and_no_score():
    assert summary.description({"iia/patch": 0.5, "n/iia/patch": 4.0}) == \
        "**iia/patch 0.500** · 4 rows"
    assert summary.description({"iia/patch": float("nan")}).startswith("**iia/patch none**")
    assert summary.description({"n/iia/test": 3.0}) == ""


def test_a_point_run_sends_its_description_with_its_numbers(tmp_path):
    run = points.PointRun.of("k=4", {"steps": {"test": {}, "control": {}}},
                             "causalab:tiny-llama · block_input L1")
    run.run_id, run.at = "r1", 4
    run.score("test", "iia", 2 / 3, 12)
    run.interval("test", "iia", 0.42, 0.92)
    run.score("control", "iia", 0.0, 12)
    sent = []
    run.flush(lambda call, run_id, **batch: sent.append(batch))
    (batch,) = sent
    assert batch["tags"][store.NOTE].startswith("**iia/test 0.667** [0.42, 0.92] · control "
                                                "**iia/control 0.000** · 12 rows")
    # logged at the point's value of its sweep's axis, so MLflow charts them against it
    assert {point.step for point in batch["metrics"]} == {4}


def test_a_sweep_s_scores_are_logged_against_its_first_whole_number_coordinate_that_varies():
    assert points.step_axis([{"k": 1}, {"k": 4}, {"k": 16}]) == "k"
    assert points.step_axis([{"model": "a", "layers": [0]}, {"model": "b", "layers": [1]}]) == \
        "layers"
    assert points.step_axis([{"pos": {"frame": "p", "index": -1}},
                             {"pos": {"frame": "p", "index": -4}}]) == "pos"
    assert points.step_axis([{"lr": 0.1}, {"lr": 0.01}]) is None
    assert points.step_axis([{"method": "das"}, {"method": "pca"}]) is None
    assert points.step_at({"k": "16"}, "k") == 16 and points.step_at({"k": 4}, None) is None


def test_a_multirun_s_point_names_carry_what_varies_across_its_jobs_with_short_model_names():
    assert naming.run_label({"model": "gpt2"}) == "model=gpt2"
    assert naming.run_label({"model.key": "causalab:weekday-gpt2", "site.layer": "2"}) == \
        "model=weekday-gpt2 layer=2"
    assert naming.short_model("meta-llama/Llama-3.2-1B") == "Llama-3.2-1B"
    assert naming.run_label({}) == ""


def test_a_multirun_hands_its_jobs_the_keys_it_sweeps():
    from omegaconf import OmegaConf

    from causalab.hydra.callbacks import swept_keys
    from causalab.hydra.jobs import decode, encode

    config = OmegaConf.create({"hydra": {"overrides": {"task": [
        "experiment=das", "model=llama,gpt2,qwen2", "+model.control=null,random_init",
        "site.layer=range(0,2)", "run.data_root=/d"]}, "sweeper": {"params": {"seed": "0,1"}}}})
    assert swept_keys(config) == ["model", "model.control", "site.layer", "seed"]
    assert decode(encode({"run_id": "p", "varied": ["model"]}))["varied"] == ["model"]


def _sweep(models: tuple[str, ...] = ("llama",)) -> list:
    return [({"model": f"causalab:weekday-{m}", "k": k},
             {"iia/test": min(1.0, k / 16), "iia/control": 0.0, "ce/test": 2.0, "ce/control": 9.0})
            for m in models for k in (1, 4, 16)]


def test_the_compare_view_charts_both_scores_against_the_step_axis_log_for_a_log_grid_0_to_1():
    charts, (section,) = landing.view_charts(_sweep(), ["k"], step_axis="k")
    assert [(c["type"], c["selectedMetricKeys"]) for c in charts] == [
        ("LINE", ["iia/test"]), ("LINE", ["iia/control"])]
    for chart in charts:
        assert chart["xAxisKey"] == "step" and chart["useGlobalXaxisKey"] is False
        assert chart["xAxisScaleType"] == "log" and chart["displayPoints"] is True
        assert chart["range"]["yMin"] < 0 < 1 < chart["range"]["yMax"] < 1.1
        assert 10 ** chart["range"]["xMin"] < 1 and 10 ** chart["range"]["xMax"] > 16
    assert section["columns"] == 2 and 2 * section["cardHeight"] > 700  # readable, both in view
    layers = [({"layers": [layer]}, {"logit_diff/test": 3.0 - layer}) for layer in range(4)]
    (chart,) = landing.view_charts(layers, ["layers"], step_axis="layers")[0]
    assert chart["xAxisScaleType"] == "linear" and "yMin" not in chart["range"]


def test_a_multirun_s_view_groups_its_points_by_model_and_shows_the_model_s_short_name():
    points_ = _sweep(("llama", "gpt2", "qwen2"))
    state = json.loads(json.loads(landing.view_state(points_, ["model", "k"], name="das",
                                                       created_ms=1, step_axis="k"))["state"])
    assert state["groupBy"] == {"aggregateFunction": "average",
                                "groupByKeys": [{"mode": "param", "groupByData": "model"}]}
    assert state["selectedColumns"][:2] == ["params.`model`", "params.`k`"]
    # a single sweep's points stay one dot each; without a step axis, scatters by param
    alone = json.loads(json.loads(landing.view_state(_sweep(), ["k"], name="das", created_ms=1,
                                                       step_axis="k"))["state"])
    assert "groupBy" not in alone
    charts, _ = landing.view_charts(points_, ["model", "k"], step_axis=None)
    assert [c["type"] for c in charts] == ["SCATTER", "SCATTER"]


def test_the_parent_s_description_draws_a_narrow_plot_in_place_and_links_a_wide_one():
    text = landing.description("3", "abc", 9, {"plots/sweep_curve.png": 560,
                                                "plots/ranking.png": 1480},
                               note="first on iia/test: model_x k=16")
    lines = text.split("\n\n")
    assert lines[0].startswith("**9 points** · ") and "(#/experiments/3/runs/abc/artifacts/" \
        "summary.html)" in lines[0]
    assert lines[1] == ("[![plots/sweep_curve.png](get-artifact?path=plots/sweep_curve.png"
                        "&run_uuid=abc)](#/experiments/3/runs/abc/artifacts/plots/sweep_curve.png)")
    assert "[plots/ranking.png](#/experiments/3/runs/abc/artifacts/plots/ranking.png)" in lines[2]
    assert lines[3] == r"first on iia/test: model\_x k=16"
    assert landing.png_width(b"\x89PNG\r\n\x1a\n" + bytes(8) + (560).to_bytes(4, "big") +
                             bytes(4)) == 560 and landing.png_width(b"GIF89a") == 0


def test_on_a_server_with_a_login_each_user_s_runs_go_to_an_experiment_of_their_own(
        monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    assert store.default_experiment("http://h:5000") == "causalab"
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    assert store.default_experiment("http://h:5000") == "causalab-bob"
    assert store.default_experiment("sqlite:////tmp/x/mlflow.db") == "causalab"


def test_a_403_with_a_login_names_the_user_the_experiment_and_the_way_out(monkeypatch):
    from mlflow.exceptions import MlflowException

    from causalab.tracking.reach import translated

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    error = MlflowException("API request to endpoint /api/2.0/mlflow/runs/create failed with "
                            "error code 403 != 200. Response body: 'Permission denied'")
    found = translated(error, "http://h:5000", "causalab-admin")
    assert "HTTP 403: user 'bob' has no permission on experiment 'causalab-admin'" in \
        found.message and "'causalab-bob'" in found.message and "\n" not in found.message
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    assert "set MLFLOW_TRACKING_USERNAME" in translated(error, "http://h:5000").message


def test_the_mlflow_app_page_stores_model_training_and_a_closed_assistant_before_mlflow_runs():
    from causalab.server import mlflow_app

    index = '<!doctype html><html><head><meta charset="utf-8"/><script defer src="m.js">' \
            '</script></head><body></body></html>'
    served = mlflow_app.page(index)
    assert served.startswith('<!doctype html><html><head><script>')
    assert served.index("localStorage") < served.index('src="m.js"')
    assert '"mlflow.workflowType_v1": "\\"machine_learning\\""' in served
    assert "getItem(k)===null" in served  # a choice the browser made is kept


def test_the_pinned_mlflow_ui_reads_the_browser_keys_the_app_page_sets_and_serves_its_index():
    """Guards causalab/server/mlflow_app.py against an MLflow upgrade: its bundle keeps these
    choices under these keys (``useLocalStorage``'s ``<key>_v<version>``, JSON), GenAI its
    default, and its Flask app serves index.html from the view the app replaces."""
    import mlflow.server

    from causalab.server import mlflow_app

    bundle = "".join(path.read_text(errors="replace") for path in
                     Path(mlflow.server.app.static_folder, "static", "js").glob("main.*.js"))
    assert re.search(r"=\((\w),(\w)\)=>`\$\{\1\}_v\$\{\2\}`", bundle)
    for key in mlflow_app.FIRST_VISIT:
        name, version = key.rsplit("_v", 1)
        assert f'key:"{name}",version:{version}' in bundle, key
    assert 'e.MACHINE_LEARNING="machine_learning"' in bundle
    assert mlflow_app.INDEX_ENDPOINT in mlflow.server.app.view_functions
    assert mlflow.server.app.url_map.bind("h").match("/")[0] == mlflow_app.INDEX_ENDPOINT


def test_causalab_s_mlflow_apps_are_registered_with_mlflow():
    """``make setup`` installs the package with its ``mlflow.app`` entry points."""
    from causalab.server import mlflow_app

    assert mlflow_app.registered(mlflow_app.APP) and mlflow_app.registered(mlflow_app.AUTH_APP)
    assert mlflow_app.app_arguments() == ("--app-name", "causalab")
    assert mlflow_app.app_arguments(auth=True) == ("--app-name", "causalab-auth")


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.org"])
def test_a_server_beyond_loopback_without_auth_is_refused_in_one_line(host, tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo))
    done = subprocess.run([sys.executable, "-m", "causalab", "server", "start", "--host", host,
                           "--root", str(tmp_path / "stack")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: --host: {host} is ")
    assert "--auth" in done.stderr and "--insecure" in done.stderr
    assert not (tmp_path / "stack").exists()  # refused before anything was made


def test_loopback_hosts_and_auth_or_insecure_pass_the_host_check():
    from causalab.server.auth import check_host

    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_host(host, auth=False)
    check_host("0.0.0.0", auth=True)
    check_host("0.0.0.0", auth=False, insecure=True)
