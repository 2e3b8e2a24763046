"""A multirun's jobs, wherever a launcher runs them: how they find their parent run, and what
the launching process does about jobs that died.

The parent run is opened once, in the launching process. Its identity travels inside the
jobs' own config: an override ``hydra.job.env_set.CAUSALAB_MULTIRUN_PARENT=<encoded>`` is
appended to the multirun's Hydra overrides, which every launcher (basic, joblib, submitit,
Ray) re-applies when it composes a job's config, on whichever host the job runs. Hydra then
sets it in the job's environment too. No shared filesystem is needed for it.

A job killed by a signal (SIGKILL, the OOM killer, a lost node) cannot end its own runs. When
the launcher has returned or raised, the launching process ends every run of the multirun
still RUNNING as KILLED (:func:`reap`). This module never starts or signals processes.
"""
from __future__ import annotations

import base64
import json
import os
from typing import Any

from causalab.tracking import runs as store

ENV = "CAUSALAB_MULTIRUN_PARENT"
LOST = "the job's process ended before its runs did (killed, or its node lost)"
_KEYS = ("run_id", "experiment", "experiment_id", "tracking_uri", "varied")


def encode(parent: dict) -> str:
    """The parent as one override-safe word: URL-safe base64 of its JSON, unpadded.

    >>> decode(encode({"run_id": "ab", "tracking_uri": "http://h:5000"}))["tracking_uri"]
    'http://h:5000'
    """
    text = json.dumps({k: parent[k] for k in _KEYS if k in parent}, sort_keys=True)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(word: str) -> dict:
    padded = word + "=" * (-len(word) % 4)
    return json.loads(base64.urlsafe_b64decode(padded.encode()).decode())


def hand_to_jobs(config: Any, parent: dict) -> None:
    """Append the override that gives every job of this multirun the parent's identity.

    ``config`` is the multirun's config as the callback's ``on_multirun_start`` receives it:
    the same object the launcher composes each job's config from.
    """
    from omegaconf import open_dict, read_write

    override = f"++hydra.job.env_set.{ENV}='{encode(parent)}'"
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.overrides.hydra.append(override)


def parent_of_job(hydra_config: Any) -> dict | None:
    """The parent a job was handed (its config's ``env_set``, else its environment), or None."""
    env_set = hydra_config.job.get("env_set") or {}
    word = env_set.get(ENV) or os.environ.get(ENV)
    return decode(str(word)) if word else None


def reap(parent: dict, reason: str = LOST) -> list[str]:
    """End as KILLED every run under ``parent`` (at any depth) that is still RUNNING.

    Called by the launching process once no job of this multirun can still write, so a
    RUNNING run there belongs to a job that is gone. Returns the ids it ended.
    """
    mlflow = store.client(parent["tracking_uri"])
    ended = []
    for run in store.descendants(mlflow, parent["experiment_id"], parent["run_id"]):
        if run.info.status == "RUNNING" and run.data.tags.get(store.CLAIM) == "waiting":
            store.withdraw(mlflow, run.info.run_id)  # a point the job never started
            ended.append(run.info.run_id)
        elif run.info.status == "RUNNING":
            store.kill(mlflow, run.info.run_id, reason)
            ended.append(run.info.run_id)
    return ended
