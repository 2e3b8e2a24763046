"""A real Hydra multirun (``python -m causalab.run -m ...``) lands in MLflow as one parent run
with one child per job, whichever launcher ran the jobs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from causalab.tracking import runs as store

REPO = Path(__file__).resolve().parents[2]


def _multirun(arguments: list[str], cwd: Path, server: str, timeout: int = 600):
    env = dict(os.environ, MLFLOW_TRACKING_URI=server, HF_HUB_OFFLINE="1",
               MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_DISABLE_PROGRESS_BARS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "causalab.run", "-m", *arguments,
               f"run.data_root={REPO / 'documents' / 'data'}", f"hydra.sweep.dir={cwd / 'multirun'}"]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _experiment_runs(server: str, experiment: str) -> list:
    client = MlflowClient(server)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id], max_results=1000)


def test_a_joblib_multirun_of_three_jobs_is_one_parent_with_three_finished_children(
        mlflow_server, experiment_name, tmp_path):
    done = _multirun(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "experiment=patching",
                      "model=tiny_llama", "site=resid,attn_out,mlp_out",
                      f"tracking.experiment={experiment_name}"], tmp_path, mlflow_server)
    runs = _experiment_runs(mlflow_server, experiment_name)
    (parent,) = [r for r in runs if store.PARENT not in r.data.tags]
    children = [r for r in runs if r.data.tags.get(store.PARENT) == parent.info.run_id]
    assert len(runs) == 4 and len(children) == 3
    assert parent.data.tags[store.KIND] == "multirun" and parent.info.status == "FINISHED"
    assert {r.info.status for r in children} == {"FINISHED"}
    assert sorted(r.data.params["site"] for r in children) == ["attn_out", "mlp_out", "resid"]
    # Where the job runs from is no param to compare: the job name leaves it out too.
    assert not {"run.data_root", "tracking.experiment"} & {p for r in children for p in r.data.params}
    client = MlflowClient(mlflow_server)
    for child in children:
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"document.json", "run.json", "hydra_config.yaml", "iia.json"} <= names
        assert "logit_diff/patch" in child.data.metrics
    assert "mlflow ui" not in done.stdout and "see them" in done.stdout
    # Two jobs ran side by side; each says its block in one piece: the job line, its table,
    # its files, its store, in that order, never cut by the other job's lines.
    blocks = re.split(r"^(?=job \d+: )", done.stdout, flags=re.M)[1:]
    assert len(blocks) == 3
    for block in blocks:
        lines = block.splitlines()
        files = [i for i, line in enumerate(lines) if re.match(r"causalab: \d+ files in ", line)]
        stored = [i for i, line in enumerate(lines) if line.startswith("mlflow: ")]
        assert len(files) == 1 and len(stored) == 1 and files[0] < stored[0], block


@pytest.mark.slow
def test_a_multirun_of_swept_documents_nests_each_job_s_points_under_its_own_run(
        mlflow_server, experiment_name, tmp_path):
    _multirun(["experiment=layer_sweep", "model=tiny_llama,tiny_gpt2",
               f"tracking.experiment={experiment_name}"], tmp_path, mlflow_server)
    runs = {r.info.run_id: r for r in _experiment_runs(mlflow_server, experiment_name)}
    (parent,) = [r for r in runs.values() if store.PARENT not in r.data.tags]
    jobs = [r for r in runs.values() if r.data.tags.get(store.PARENT) == parent.info.run_id]
    assert sorted(r.data.params["model"] for r in jobs) == ["tiny_gpt2", "tiny_llama"]
    for job in jobs:
        points = [r for r in runs.values() if r.data.tags.get(store.PARENT) == job.info.run_id]
        assert sorted(r.info.run_name for r in points) == [
            "layers=0,pos=-1", "layers=0,pos=-4", "layers=1,pos=-1", "layers=1,pos=-4"]
        assert {r.info.status for r in points} == {"FINISHED"}
        plots = MlflowClient(mlflow_server).list_artifacts(job.info.run_id, "plots")
        assert [a.path for a in plots] == ["plots/position_heatmap.png"]
    assert len(runs) == 1 + 2 + 8


def test_a_single_hydra_run_tracks_to_a_sqlite_database_in_the_working_directory(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        [sys.executable, "-m", "causalab.run", "experiment=zero_ablation", "model=tiny_llama",
         f"run.data_root={REPO / 'documents' / 'data'}", f"hydra.run.dir={tmp_path / 'job'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # the command that shows them, as pasted where the run was started: causalab ui on the store
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("see them: ")]
    command = line[len("see them: "):].split(" ")
    assert command[1:] == ["ui", "--store", uri] and os.access(command[0], os.X_OK)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("causalab").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
    assert run.data.params["model"] == "tiny_llama"
    assert {"zeroed.json", "clean.json", "p_answer.json", "document.json"} <= set(
        os.listdir(tmp_path / "mlartifacts" / run.info.run_id / "artifacts"))
    assert {"clean.json", "zeroed.json", "document.json", "run.json"} <= set(
        os.listdir(tmp_path / "job"))


@pytest.mark.slow
def test_a_multirun_repeated_links_every_done_job_into_its_new_parent_and_says_so(
        mlflow_server, experiment_name, tmp_path):
    arguments = ["experiment=patching", "model=tiny_llama,tiny_gpt2",
                 f"tracking.experiment={experiment_name}"]
    for name in ("first", "again"):
        (tmp_path / name).mkdir()
    _multirun(arguments, tmp_path / "first", mlflow_server)
    again = _multirun(arguments, tmp_path / "again", mlflow_server)
    runs = _experiment_runs(mlflow_server, experiment_name)
    parents = [r for r in runs if store.PARENT not in r.data.tags]
    newest = max(parents, key=lambda r: r.info.start_time)
    linked = [r for r in runs if r.data.tags.get(store.PARENT) == newest.info.run_id]
    assert sorted(r.data.params["model"] for r in linked) == ["tiny_gpt2", "tiny_llama"]
    assert all(r.data.tags.get(store.REUSED_FROM) for r in linked)
    assert all("iia/patch" in r.data.metrics for r in linked)
    assert again.stdout.count("linked here as run") == 2
    assert "job 0: " in again.stdout and "job 1: " in again.stdout


def _dead_pid() -> int:
    """The pid of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_multirun_ends_killed_what_a_killed_launch_left_running(experiment_name, tmp_path):
    """A launcher killed with SIGKILL leaves its parent RUNNING: the next multirun in the
    experiment, of the same overrides or others, ends it KILLED, with the run below it whose
    owner died, and leaves a run owned on another host (a job that may still run there) and a
    parent whose launcher lives; its own parent names its owner."""
    import json
    import socket

    from causalab.tracking import owners

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = store.experiment_id(client, experiment_name, uri)
    here = json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "start": None})
    elsewhere = json.dumps({"host": "another-host", "pid": 1, "start": None})
    overrides = json.dumps({"experiment": "patching", "model": "tiny_llama"}, sort_keys=True)
    stale = store.create_run(client, experiment, "killed launch", {
        store.KIND: "multirun", store.OVERRIDES: overrides, owners.OWNER: here})
    other = store.create_run(client, experiment, "other overrides", {
        store.KIND: "multirun", store.OVERRIDES: "{}", owners.OWNER: here})
    live = store.create_run(client, experiment, "a launch still running", {
        store.KIND: "multirun", store.OVERRIDES: "{}", **owners.owner_tags()})
    dead_job = store.create_run(client, experiment, "job", {owners.OWNER: here}, stale)
    remote_job = store.create_run(client, experiment, "job", {owners.OWNER: elsewhere}, stale)
    _multirun(["experiment=patching", "model=tiny_llama", f"tracking.experiment={experiment_name}"],
              tmp_path, uri)
    status = {run_id: client.get_run(run_id).info.status
              for run_id in (stale, other, live, dead_job, remote_job)}
    assert status == {stale: "KILLED", other: "KILLED", live: "RUNNING", dead_job: "KILLED",
                      remote_job: "RUNNING"}
    assert "KilledOwner" in client.get_run(stale).data.tags[store.ERROR]
    runs = _experiment_runs(uri, experiment_name)
    (new,) = [r for r in runs if r.info.run_id not in status and store.PARENT not in r.data.tags]
    assert new.info.status == "FINISHED"
    owner = json.loads(new.data.tags[owners.OWNER])
    assert owner["host"] == socket.gethostname() and isinstance(owner["pid"], int)


def test_a_refused_job_of_a_multirun_is_named_and_the_other_jobs_still_run(tmp_path):
    # A multirun's refusal used to be the bare JSON path: which of the swept values was it?
    # And its SystemExit ended the multirun: the jobs after a refused one never ran.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", CAUSALAB_QUIET="1", MLFLOW_TRACKING_URI=uri,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "causalab.run", "-m", "experiment=patching",
               "model=tiny_llama", "site.layer=99,0",
               f"run.data_root={REPO / 'documents' / 'data'}", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1
    # The refusal, then Hydra's line for the failed job, both spelled as every refusal is.
    assert errors == ["error: job 0 (experiment=patching,model=tiny_llama,site.layer=99): "
                      "sites.target.layers: layer 99 is out of range: the model has 2 layers",
                      "error: job 0 (experiment=patching,model=tiny_llama,site.layer=99) failed, "
                      "as its line above says; the multirun ran its other jobs"]
    assert "Traceback" not in done.stderr
    assert (tmp_path / "multirun" / "1" / "iia.json").is_file()  # job 1 ran after the refusal
    runs = _experiment_runs(uri, store.DEFAULT_EXPERIMENT)
    (parent,) = [r for r in runs if store.PARENT not in r.data.tags]
    (child,) = [r for r in runs if r.data.tags.get(store.PARENT) == parent.info.run_id]
    assert child.info.status == "FINISHED" and child.data.params["site.layer"] == "0"
    assert parent.info.status == "FAILED"
    assert parent.data.tags[store.ERROR] == ("failed: job 0 "
                                             "(experiment=patching,model=tiny_llama,site.layer=99)")


def test_a_multirun_with_a_job_that_does_not_compose_leaves_no_parent_run(tmp_path):
    # `model=nope` is no option of conf/model/: refused in one line naming the nearest ones,
    # and no run is left behind (an empty FAILED parent would say nothing).
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", CAUSALAB_QUIET="1", MLFLOW_TRACKING_URI=uri,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "causalab.run", "-m", "experiment=patching",
               "model=tiny_llama,nope",
               f"run.data_root={REPO / 'documents' / 'data'}", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "conf/model/ has no option 'nope'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, the nearest names
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(store.DEFAULT_EXPERIMENT)
    # the unknown option is refused before any parent is opened (or the parent opened is deleted)
    assert experiment is None or client.search_runs([experiment.experiment_id]) == []
