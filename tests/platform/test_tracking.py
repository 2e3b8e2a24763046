"""MLflow tracking against a real tracking server: runs, nesting, resume, failures, retrieval.

Documents run end to end through the pipeline on the tiny built-in Llama; what the server
holds is read back through MlflowClient and through its REST API with plain urllib.
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
from mlflow import MlflowClient

from causalab.compile.plan import ModelRef, Plan
from causalab.document import digest
from causalab.errors import CompileError, RunError
from causalab.pipeline import run_document
from causalab.results.listing import list_runs
from causalab.tracking import TrackingEvents, fetch, resolve_artifact, ui_command
from causalab.tracking import runs as store

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "documents" / "v2"
DATA = str(REPO / "documents" / "data")


def _corpus(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.json").read_text())


def _track(document: dict, server: str, experiment: str, out: Path, **options):
    """Run ``document`` tracked to ``server``; returns the listener (and re-raises errors)."""
    events = TrackingEvents(tracking_uri=server, experiment=experiment, out=str(out), **options)
    with events:  # as the CLI does: an error ends what is open once the uploads are done
        run_document(document, out=str(out), data_root=DATA, events=events)
    return events


def _runs(server: str, experiment: str) -> list:
    client = MlflowClient(server)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id], max_results=1000) if found else []


@pytest.fixture(scope="module")
def head_sweep(mlflow_server, tmp_path_factory):
    """head_patching.json (4 heads, 4 points) tracked once into its own experiment."""
    experiment = f"head-sweep-{tmp_path_factory.getbasetemp().name}"
    out = tmp_path_factory.mktemp("head-sweep")
    events = _track(_corpus("head_patching"), mlflow_server, experiment, out)
    return {"events": events, "experiment": experiment, "out": out,
            "runs": _runs(mlflow_server, experiment)}


def _children(runs: list, parent: str) -> list:
    return [r for r in runs if r.data.tags.get(store.PARENT) == parent]


def test_a_swept_document_is_one_parent_run_with_a_finished_child_per_point(head_sweep):
    parents = [r for r in head_sweep["runs"] if store.PARENT not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = _children(head_sweep["runs"], parents[0].info.run_id)
    assert len(children) == 4
    assert {r.info.status for r in children} == {"FINISHED"}
    assert sorted(r.data.params["heads"] for r in children) == ["0", "1", "2", "3"]
    assert sorted(r.info.run_name for r in children) == [f"heads={h}" for h in range(4)]


def test_each_child_is_tagged_with_the_digest_of_its_own_document_artifact(head_sweep, tmp_path):
    client = MlflowClient(head_sweep["events"].uri)
    for run in _children(head_sweep["runs"], head_sweep["events"].sweep_run_id):
        local = client.download_artifacts(run.info.run_id, "document.json", str(tmp_path))
        document = json.loads(Path(local).read_text())
        assert run.data.tags[store.PRODUCED_BY] == digest(document)
        assert run.data.tags[store.MODEL_KEY] == "causalab:tiny-llama"
        assert run.data.tags[store.VERSION]


def test_each_child_has_its_metric_tables_as_artifacts_and_a_metric_per_table(head_sweep):
    client = MlflowClient(head_sweep["events"].uri)
    for run in _children(head_sweep["runs"], head_sweep["events"].sweep_run_id):
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"document.json", "iia.json", "logit_diff.json"} <= names
        table = json.loads((head_sweep["out"] / run.info.run_name / "logit_diff.json").read_text())
        values = [row["value"] for row in table if row["eligible"]]
        # Each metric is named metric first, then its step (…/patch); row counts group apart under n/.
        assert run.data.metrics["logit_diff/patch"] == pytest.approx(sum(values) / len(values),
                                                                     abs=1e-6)
        assert run.data.metrics["n/logit_diff/patch"] == len(values)
        assert run.data.metrics["n/iia/patch"] == len(values)


def test_the_parent_holds_the_swept_document_and_the_run_record(head_sweep):
    client = MlflowClient(head_sweep["events"].uri)
    names = {a.path for a in client.list_artifacts(head_sweep["events"].sweep_run_id)}
    assert {"document.json", "run.json"} <= names


def test_the_server_rest_search_returns_the_children_with_their_swept_params(
        head_sweep, mlflow_server, rest_search):
    events = head_sweep["events"]
    query = f"tags.`mlflow.parentRunId` = '{events.sweep_run_id}'"
    found = rest_search(mlflow_server, events.experiment_id, query)
    heads = sorted(p["value"] for run in found for p in run["data"]["params"]
                   if p["key"] == "heads")
    assert heads == ["0", "1", "2", "3"]


def test_running_the_same_document_again_adds_no_finished_run(head_sweep, mlflow_server,
                                                              tmp_path):
    before = _runs(mlflow_server, head_sweep["experiment"])
    events = _track(_corpus("head_patching"), mlflow_server, head_sweep["experiment"], tmp_path)
    after = _runs(mlflow_server, head_sweep["experiment"])
    assert len(events.skipped) == 4 and not events.point_runs
    assert sorted(r.info.run_id for r in after) == sorted(r.info.run_id for r in before)


def test_list_runs_finds_a_point_by_its_digest(head_sweep, mlflow_server):
    run = _children(head_sweep["runs"], head_sweep["events"].sweep_run_id)[0]
    found = list_runs(produced_by=run.data.tags[store.PRODUCED_BY], tracking_uri=mlflow_server,
                      experiment=head_sweep["experiment"])
    assert [r["run_id"] for r in found] == [run.info.run_id]
    assert found[0]["status"] == "FINISHED" and found[0]["metrics"]["n/iia/patch"] == 4


def _failing_sweep() -> dict:
    """Three points; the middle one's write leaves the residual too large for the next norm
    (refused at the write at run time), the last is fine again."""
    document = _corpus("patching")
    document["interventions"]["patch"]["writes"]["patch"] = {
        "site": "target", "pos": -1, "mechanism": "add_scaled", "operand": "v_cf",
        "params": {"scale": {"sweep": [0.5, 1e38, 2.0]}}}
    return document


def test_a_point_that_raises_ends_failed_with_its_error_and_the_others_finish(
        mlflow_server, experiment_name, tmp_path):
    with pytest.raises(RunError):
        _track(_failing_sweep(), mlflow_server, experiment_name, tmp_path)
    runs = {r.info.run_name: r for r in _runs(mlflow_server, experiment_name)}
    assert runs["scale=0.5"].info.status == "FINISHED"
    failed = runs["scale=1e+38"]
    assert failed.info.status == "FAILED"
    assert "too large for a norm" in failed.data.tags[store.ERROR]
    assert runs["scale=2.0"].info.status == "FINISHED"
    assert runs["sweep"].info.status == "FAILED"


def _plan(label: str, directory: str) -> Plan:
    model = ModelRef("causalab:tiny-llama", "0" * 64, "fp32", None, "/nowhere")
    document = {"model": {"key": model.key}, "steps": {"s": {"kind": "observe"}}, "n": label}
    return Plan(name=label, directory=directory, children=(), model=model,
                digest=digest(document), document=document, coordinates={"n": label})


def test_an_interrupted_point_ends_killed(mlflow_server, experiment_name, tmp_path):
    events = TrackingEvents(tracking_uri=mlflow_server, experiment=experiment_name,
                            out=str(tmp_path))
    first, second = _plan("n=1", "n=1"), _plan("n=2", "n=2")
    events.run_start({"n": {"sweep": ["1", "2"]}}, [first, second])
    assert events.point_start(first)
    events.metric(first, "s", "iia", 0.5, 3)
    events.point_end(first, [], None)
    assert events.point_start(second)
    events.point_end(second, [], KeyboardInterrupt())
    events.close(KeyboardInterrupt())  # what the CLI's context exit does
    status = {r.info.run_name: r.info.status for r in _runs(mlflow_server, experiment_name)}
    assert status == {"n=1": "FINISHED", "n=2": "KILLED", "sweep": "KILLED"}


def test_a_listener_closed_by_an_error_leaves_nothing_running(mlflow_server, experiment_name,
                                                              tmp_path):
    point = _plan("1", "")
    with pytest.raises(ValueError):
        with TrackingEvents(tracking_uri=mlflow_server, experiment=experiment_name,
                            out=str(tmp_path)) as events:
            events.run_start({}, [Plan(name="", directory="", children=(), model=point.model,
                                       digest=point.digest, document=point.document)])
            events.point_start(point)
            raise ValueError("stopped")
    assert [r.info.status for r in _runs(mlflow_server, experiment_name)] == ["FAILED"]


def test_a_point_with_two_fits_logs_each_fits_numbers_under_its_step(
        mlflow_server, experiment_name, tmp_path):
    # One fit's keys are bare (train/loss); with two, each is prefixed by its step, and a
    # gate's kept fraction is logged beside the watched eval metric.
    model = ModelRef("causalab:tiny-llama", "0" * 64, "fp32", None, "/nowhere")
    document = {"model": {"key": model.key}, "steps": {
        "das": {"kind": "fit", "early_stop": {"metric": "iia"}},
        "gate": {"kind": "fit", "early_stop": {"metric": "logit_diff"}},
        "test": {"kind": "observe"}}}
    point = Plan(name="", directory="", children=(), model=model, digest=digest(document),
                 document=document)
    events = TrackingEvents(tracking_uri=mlflow_server, experiment=experiment_name,
                            out=str(tmp_path))
    events.run_start(document, [point])
    assert events.point_start(point)
    for update, loss in enumerate((2.0, 1.5)):
        events.fit_update(point, "das", update, loss)
    events.fit_epoch(point, "das", 0, 0.75, None)
    events.fit_update(point, "gate", 0, 3.0)
    events.fit_epoch(point, "gate", 0, 1.25, 0.5)
    events.metric(point, "test", "iia", 0.5, 4)
    events.point_end(point, [], None)
    events.run_end([])
    events.wait()
    [run] = _runs(mlflow_server, experiment_name)

    def history(key):
        return [(m.step, m.value)
                for m in MlflowClient(mlflow_server).get_metric_history(run.info.run_id, key)]

    assert sorted(history("das/train/loss")) == [(0, 2.0), (1, 1.5)]
    assert history("das/eval/iia") == [(0, 0.75)]
    assert history("gate/train/loss") == [(0, 3.0)]
    assert history("gate/eval/logit_diff") == [(0, 1.25)]
    assert history("gate/eval/kept") == [(0, 0.5)]
    assert not history("das/eval/kept") and not history("train/loss")
    assert run.data.metrics["iia/test"] == 0.5 and run.info.status == "FINISHED"


def test_a_listener_has_stored_its_runs_when_run_end_returns_and_keeps_no_thread(
        mlflow_server, experiment_name, tmp_path):
    # A notebook or an in-process multirun tracks run after run: a thread kept per listener
    # would pile up for the life of the process, and a run read back right after its end
    # must find every point FINISHED.
    def ours():
        return [t for t in threading.enumerate() if t.name.startswith("causalab")]

    before = len(ours())
    for index in range(3):
        events = TrackingEvents(tracking_uri=mlflow_server, experiment=experiment_name,
                                out=str(tmp_path))
        first, second = _plan(f"n={index}a", "a"), _plan(f"n={index}b", "b")
        events.run_start({"n": {"sweep": ["a", "b"]}}, [first, second])
        for point in (first, second):
            assert events.point_start(point)
            events.point_end(point, [], None)
        events.run_end([])
        ended = [MlflowClient(mlflow_server).get_run(run_id).info.status
                 for run_id in [*events.point_runs.values(), events.sweep_run_id]]
        assert ended == ["FINISHED"] * 3
        events.wait()
        assert len(ours()) == before
    runs = _runs(mlflow_server, experiment_name)
    assert len(runs) == 9 and {r.info.status for r in runs} == {"FINISHED"}


@pytest.fixture(scope="module")
def das_run(mlflow_server, tmp_path_factory):
    experiment = f"das-{tmp_path_factory.getbasetemp().name}"
    out = tmp_path_factory.mktemp("das")
    events = _track(_corpus("das"), mlflow_server, experiment, out)
    (run_id,) = events.point_runs.values()
    return {"events": events, "run_id": run_id, "out": out,
            "run": MlflowClient(mlflow_server).get_run(run_id)}


def test_a_fit_logs_its_loss_per_update_and_its_eval_metric_per_epoch(das_run, mlflow_server):
    client = MlflowClient(mlflow_server)
    losses = client.get_metric_history(das_run["run_id"], "train/loss")
    evals = client.get_metric_history(das_run["run_id"], "eval/logit_diff")
    assert [m.step for m in sorted(losses, key=lambda m: m.step)] == list(range(len(losses)))
    assert [m.step for m in sorted(evals, key=lambda m: m.step)] == list(range(len(evals)))
    assert 1 <= len(evals) <= 10 and len(losses) >= len(evals)
    names = {a.path for a in client.list_artifacts(das_run["run_id"])}
    assert {"rot.safetensors", "heldout_logit_diff.json", "run.json", "document.json"} <= names
    assert "plots/fit_loss.png" in {a.path for a in client.list_artifacts(das_run["run_id"],
                                                                          "plots")}


def test_fetch_brings_back_the_rotation_a_das_run_saved(das_run, mlflow_server, tmp_path,
                                                         monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setenv("CAUSALAB_HOME", str(tmp_path / "home"))
    uri = f"runs:/{das_run['run_id']}/rot.safetensors"
    fetched = fetch(uri, str(tmp_path / "rot.safetensors"), tracking_uri=mlflow_server)
    resolved = resolve_artifact(uri, tracking_uri=mlflow_server)
    local = load_file(str(das_run["out"] / "rot.safetensors"))["weight"]
    assert load_file(fetched)["weight"].equal(local)
    assert load_file(resolved)["weight"].equal(local)
    assert Path(resolved).is_relative_to(tmp_path / "home")


def test_the_tracking_uri_comes_from_the_environment_then_the_config_then_the_cwd(
        monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert store.resolve_uri(None, cwd=str(tmp_path)) == f"sqlite:///{tmp_path}/mlflow.db"
    assert store.resolve_uri("http://h:1") == "http://h:1"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:2")
    assert store.resolve_uri("http://h:1") == "http://env:2"
    assert store.artifact_location(f"sqlite:///{tmp_path}/mlflow.db") == (
        (tmp_path / "mlartifacts").as_uri())
    assert store.artifact_location("http://env:2") is None
    # The command is this interpreter's own causalab (a bare `mlflow` or `causalab` may not be
    # on PATH), and it names the store and the sweep whose addresses it prints.
    command = ui_command(f"sqlite:///{tmp_path}/m.db", run_id="abc")
    assert command.endswith(f" ui --store sqlite:///{tmp_path}/m.db --run abc")
    assert Path(command.split(" ")[0]).resolve() == Path(sys.executable).with_name("causalab").resolve()
    assert ui_command("http://h:1", "7") == "open http://h:1/#/experiments/7/runs?workflowType=machine_learning"


def test_params_and_tags_are_cut_to_mlflow_limits_named_before_mlflow_is_imported():
    from mlflow.utils import validation

    assert store.MAX_PARAM_VAL_LENGTH == validation.MAX_PARAM_VAL_LENGTH
    assert store.MAX_TAG_VAL_LENGTH == validation.MAX_TAG_VAL_LENGTH
    cut = store._cut({"a/b": "x" * 7000, "d": None}, store.MAX_PARAM_VAL_LENGTH)
    assert cut == {"a/b": "x" * 6000}


def test_a_das_rotation_applied_from_its_runs_uri_gives_the_score_the_fit_run_gave(
        das_run, mlflow_server, experiment_name, tmp_path, monkeypatch):
    monkeypatch.setenv("CAUSALAB_HOME", str(tmp_path / "home"))
    apply = _corpus("das_apply")
    apply["featurizers"]["rot"]["file_path"] = f"runs:/{das_run['run_id']}/rot.safetensors"
    apply["steps"]["apply"]["rows"] = _corpus("das")["steps"]["score"]["rows"]
    _track(apply, mlflow_server, experiment_name, tmp_path / "out")
    applied = json.loads((tmp_path / "out" / "logit_diff.json").read_text())
    scored = json.loads((das_run["out"] / "train_logit_diff.json").read_text())
    assert [r["example_id"] for r in applied] == [r["example_id"] for r in scored]
    assert [r["value"] for r in applied] == pytest.approx([r["value"] for r in scored], abs=1e-6)


def _swept(labels: list[dict]) -> list[Plan]:
    plans = []
    for coordinates in labels:
        label = ",".join(f"{k}={v[0] if isinstance(v, list) else v}" for k, v in coordinates.items())
        plan = _plan(label, label)
        plans.append(Plan(name=label, directory=label, children=(), model=plan.model,
                          digest=plan.digest, document=plan.document, coordinates=coordinates))
    return plans


@pytest.mark.parametrize("axes,picture", [
    ({"layers": [[0], [1], [2]]}, "plots/layer_curve.png"),
    ({"layers": [[0], [1]], "heads": [[0], [1], [2]]}, "plots/head_heatmap.png"),
    ({"layers": [[0], [1]], "pos": [-1, -2]}, "plots/position_heatmap.png"),
    ({"k": [1, 4, 16]}, "plots/sweep_curve.png"),
], ids=["layer_curve", "head_heatmap", "position_heatmap", "rank_curve"])
def test_a_sweep_parent_gets_the_picture_its_axes_call_for(axes, picture, mlflow_server,
                                                           experiment_name, tmp_path):
    grid = [{}]
    for name, values in axes.items():
        grid = [dict(cell, **{name: value}) for cell in grid for value in values]
    points = _swept(grid)
    events = TrackingEvents(tracking_uri=mlflow_server, experiment=experiment_name,
                            out=str(tmp_path))
    events.run_start({"swept": True}, points)
    for index, point in enumerate(points):
        assert events.point_start(point)
        events.metric(point, "s", "iia", index / len(points), 4)
        events.point_end(point, [], None)
    events.run_end([])
    events.wait()
    client = MlflowClient(mlflow_server)
    pictures = [a.path for a in client.list_artifacts(events.sweep_run_id, "plots")]
    assert pictures == [picture]
    local = client.download_artifacts(events.sweep_run_id, picture)
    assert Path(local).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.get_run(events.sweep_run_id).info.status == "FINISHED"


def test_an_axis_named_outside_mlflows_key_charset_is_logged_sanitised_and_every_run_ends(
        mlflow_server, experiment_name, tmp_path):
    document = _corpus("head_patching")
    document["sites"]["head_out"]["heads"] = {"sweep": [[0], [1]], "as": "layer+x"}
    events = _track(document, mlflow_server, experiment_name, tmp_path,
                    job_params={"site:a=b": "1"})
    runs = _runs(mlflow_server, experiment_name)
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    children = _children(runs, events.sweep_run_id)
    assert sorted(r.data.params["layer_x"] for r in children) == ["0", "1"]
    assert all(r.data.params["site:a_b"] == "1" for r in runs)
    assert not any("+" in key or "=" in key for r in runs for key in r.data.params)
