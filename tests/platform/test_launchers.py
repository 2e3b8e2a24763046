"""Cluster launcher configs compose, and what a launcher ships to a node runs there.

submitit pickles its launcher object (the job's config, Hydra's context and the task function)
and SLURM unpickles it on a node; no SLURM is here, so the test does what the node does: it
unpickles the composed launcher in a fresh interpreter with another working directory and no
sweep directory, and composes a job's config there.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.core.singleton import Singleton
from hydra.core.utils import setup_globals
from hydra._internal.callbacks import Callbacks
from hydra.types import HydraContext

from causalab.hydra.rendering import CONF
from causalab.run import job
from causalab.hydra import jobs

REPO = Path(__file__).resolve().parents[2]
PARENT = {"run_id": "0123456789abcdef0123456789abcdef", "experiment": "team's runs, v2",
          "experiment_id": "7", "tracking_uri": "http://mlflow-host:5000"}

_NODE = """
import pickle, sys
from hydra.core.singleton import Singleton
import causalab.run
from causalab.hydra.jobs import parent_of_job
with open(sys.argv[1], "rb") as handle:
    launcher, state = pickle.load(handle)
Singleton.set_state(state)
assert launcher.task_function is causalab.run.job, launcher.task_function
job = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, ["model=gpt2"])
print(type(launcher).__name__, job.model.key, parent_of_job(job.hydra)["run_id"],
      parent_of_job(job.hydra)["experiment"])
"""


@pytest.fixture
def slurm_launcher():
    """The submitit_slurm launcher as Hydra builds it for a multirun, parent handed over."""
    setup_globals()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="run"):
        config = compose("config", return_hydra_config=True, overrides=[
            "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=2", "hydra.sweep.dir=/shared/sweep",
            "experiment=layer_sweep"])
        jobs.hand_to_jobs(config, PARENT)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                               callbacks=Callbacks(config))
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=job, config=config)
        yield launcher
    GlobalHydra.instance().clear()


def test_the_slurm_launcher_config_composes_with_partition_and_gpus_per_job(slurm_launcher):
    assert type(slurm_launcher).__name__ == "SlurmLauncher"
    assert slurm_launcher.params["partition"] == "gpu"
    assert slurm_launcher.params["gpus_per_node"] == 2
    assert slurm_launcher.params["submitit_folder"] == "/shared/sweep/.submitit/%j"


def test_the_job_a_slurm_launcher_submits_unpickles_on_a_fresh_node_with_its_parent(
        slurm_launcher, tmp_path):
    shipped = tmp_path / "submitted.pkl"
    shipped.write_bytes(cloudpickle.dumps((slurm_launcher, Singleton.get_state())))
    node = tmp_path / "node"
    node.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _NODE, str(shipped)], cwd=node, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == (f"SlurmLauncher causalab:weekday-gpt2 "
                                           f"{PARENT['run_id']} team's runs, v2")


def test_the_task_function_pickles_by_reference_not_by_value():
    # By value it would carry its code and globals; by reference it is a module and a name.
    shipped = cloudpickle.dumps(job)
    assert len(shipped) < 100 and b"causalab.run" in shipped and b"co_code" not in shipped


def test_a_handed_parent_survives_any_experiment_name_and_uri():
    parent = dict(PARENT, experiment="a b,c='d\"}\\", tracking_uri="postgresql://u:p@h/db?x=1")
    assert jobs.decode(jobs.encode(parent)) == parent
    assert set(jobs.encode(parent)) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                           "0123456789-_")
