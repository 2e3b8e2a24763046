"""Hydra callbacks: one parent MLflow run per multirun, opened in the launching process.

``MultirunParent`` is registered in ``conf/config.yaml`` under ``hydra.callbacks``. At
``on_multirun_start`` it creates the experiment and the parent run once (parallel SQLite
writers lock, so the jobs must not race to do it) and writes the parent's id to a file in
the sweep directory, and hands it to the jobs inside their config (``causalab.hydra.jobs``),
which reaches them on any host whichever launcher ran them. At ``on_multirun_end`` runs left
RUNNING by a job that died are ended KILLED; the parent ends FINISHED when every child did,
FAILED otherwise, and is deleted if no job ran anything (a repeated sweep whose points were
all done). If the sweep raises before its end (a job failed, which Hydra raises once every
job of the batch has run), an exit handler does the same, plots included, and ends the parent
FAILED with the failed jobs in its error tag (an interrupt: KILLED at once, through
:func:`end_open_parents`), or deletes it when no job got as far as a run (a mistyped
override). The parent carries its launching process as owner
(``causalab.tracking.owners``): if that process is killed, the next multirun in the
experiment ends the old parent KILLED, with the runs below it whose owner died too.
"""
from __future__ import annotations

import atexit
import json
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from causalab.hydra import jobs
from causalab.tracking import landing, owners, pictures
from causalab.tracking import runs as store

PARENT_FILE = ".mlflow_parent.json"
_OPEN: list["MultirunParent"] = []  # parents opened in this process and not yet ended


def end_open_parents(status: str, reason: str) -> None:
    """End every parent this process opened and has not ended: an interrupted process leaves
    with ``os._exit`` (``causalab.interrupts.leave``), which runs no exit handler."""
    for parent in list(_OPEN):
        for attempt in range(3):  # a SQLite store may still be locked by the job's own ends
            try:
                parent._abandon(status, reason)
                break
            except Exception as error:  # the process is leaving: one line, never a traceback
                if attempt == 2:
                    print(f"warning: the multirun's parent run was not ended {status} "
                          f"({type(error).__name__}); the next multirun in its experiment "
                          f"ends it", file=sys.stderr)
                time.sleep(0.5)


def multirun_parent(sweep_dir: str) -> dict | None:
    """The parent run a multirun's launcher opened (``run_id``, ``experiment``,
    ``tracking_uri``), or None when tracking was off."""
    path = Path(sweep_dir) / PARENT_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def overrides_of(task_overrides: list[str]) -> dict[str, str]:
    """``["model=gpt2", "site.layer=1"]`` -> ``{"model": "gpt2", "site.layer": "1"}``."""
    pairs = {}
    for override in task_overrides:
        key, sep, value = override.partition("=")
        if sep:
            pairs[key.lstrip("+~")] = value
    return pairs


class MultirunParent(Callback):
    """Open the multirun's parent run before any job, and end it after the last one."""

    def __init__(self) -> None:
        self._parent: dict | None = None
        self._title = "multirun"
        self._failed: list[str] = []  # jobs that failed, where they ran in this process

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        tracking = config.get("tracking") or {}
        if tracking.get("enabled", True) is not True:  # false, or a value each job refuses
            return
        uri = store.resolve_uri(tracking.get("uri"))
        name = tracking.get("experiment") or store.default_experiment(uri)
        mlflow = store.client(uri)
        experiment = store.experiment_id(mlflow, name, uri)
        sweep = _naming(config)
        self._title = " ".join(sweep) or "multirun"
        overrides = json.dumps(overrides_of(sweep), sort_keys=True)
        # What a killed launch left RUNNING in the experiment ends KILLED first.
        owners.reap_multiruns(mlflow, experiment)
        tags = {store.KIND: "multirun", store.VERSION: store.code_version(),
                store.OVERRIDES: overrides, **owners.owner_tags()}
        run_id = store.create_run(mlflow, experiment, " ".join(sweep) or "multirun", tags)
        self._parent = {"run_id": run_id, "experiment": name, "experiment_id": experiment,
                        "tracking_uri": uri, "folder": str(config.hydra.sweep.dir),
                        "varied": swept_keys(config)}
        # Registered before anything else is sent, so a failure from here on still ends it.
        atexit.register(self._abandon)
        _OPEN.append(self)
        store.log_batch(mlflow, run_id, params=overrides_of(sweep))
        folder = Path(str(config.hydra.sweep.dir))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / PARENT_FILE).write_text(json.dumps(self._parent))
        jobs.hand_to_jobs(config, self._parent)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        """Note a failed job, for the parent's error tag: here only when the job ran in this
        process (the basic launcher); a pool or a cluster runs it on a copy of this callback."""
        from hydra.core.utils import JobStatus

        if self._parent is not None and job_return.status == JobStatus.FAILED:
            job = config.hydra.job
            self._failed.append(f"job {job.num} ({job.override_dirname or 'no overrides'})")

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        self._end(None)

    def _end(self, reason: str | None, status: str = "FAILED") -> None:
        """Reap what died, draw the children's plots, end the parent: FINISHED when every
        child did and nothing went wrong (``reason``), else ``status`` with ``reason`` as its
        error tag; deleted if no job ran anything. An interrupt (KILLED) draws nothing: the
        process is leaving."""
        if self._parent is None:
            return
        parent = self._parent  # still open: an interrupt from here on ends it KILLED
        mlflow = store.client(parent["tracking_uri"])
        jobs.reap(parent)
        children = store.children(mlflow, parent["experiment_id"], parent["run_id"])
        if not children:
            self._close()
            store.withdraw(mlflow, parent["run_id"])  # ended, then deleted: none RUNNING
            return
        if status != "KILLED":
            landed = landing.land(mlflow, parent["run_id"], title=self._title,
                                  folder=parent.get("folder"))
            _say_where(parent, landed)
            pictures.log_comparison(mlflow, parent["run_id"], parent["experiment_id"],
                                    title=self._title)
        good = reason is None and all(run.info.status == "FINISHED" for run in children)
        if reason is not None:
            store.log_batch(mlflow, parent["run_id"], tags={store.ERROR: reason})
        store.terminate(mlflow, parent["run_id"], "FINISHED" if good else status)
        self._close()  # only once ended: a failed end is tried again (end_open_parents)

    def _close(self) -> None:
        """This parent is being ended: no exit handler or interrupt ends it again."""
        self._parent = None
        _OPEN.remove(self)
        atexit.unregister(self._abandon)

    def _abandon(self, status: str = "FAILED", reason: str | None = None) -> None:
        """At exit: a parent still open means the sweep raised before its end (a job failed:
        Hydra raises its error once every job of the batch has run), or, from
        :func:`end_open_parents`, was interrupted."""
        if reason is None:
            reason = (f"failed: {', '.join(self._failed)}" if self._failed else
                      "a job failed or the multirun stopped before its end")
        self._end(reason, status)


def swept_keys(config: Any) -> list[str]:
    """The keys a multirun sweeps, each taking more than one value across its jobs
    (``model=llama,gpt2``, ``site.layer=range(0,4)``; given on the command line or as
    ``hydra.sweeper.params``), as their jobs' params name them (``+`` and ``~`` dropped)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = list(config.hydra.overrides.task)
    params = (config.hydra.get("sweeper") or {}).get("params") or {}
    given += [f"{key}={value}" for key, value in params.items()]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except Exception:  # Hydra refuses the sweep itself, in its own words
        return []
    found = [override.key_or_group for override in parsed if override.is_sweep_override()]
    return list(dict.fromkeys(found))


def _naming(config: Any) -> list[str]:
    """The sweep's overrides that name it: those the jobs' names keep too."""
    naming = config.hydra.job.config.override_dirname
    excluded = set(naming.get("exclude_keys") or ())
    return [o for o in config.hydra.overrides.task
            if o.partition("=")[0].lstrip("+~") not in excluded]


def _say_where(parent: dict, landed: dict) -> None:
    """The addresses that open the multirun's points in MLflow's UI, on stdout."""
    if landed.get("view") is None:
        return
    first = f"; {landed['first']}" if landed.get("first") else ""
    print(f"multirun: {landed['points']} point(s) under run {parent['run_id']}{first}")
    uri = parent["tracking_uri"]
    if not uri.startswith(("http://", "https://")):
        print(f"see the sweep: {store.ui_command(uri, run_id=landed['view'])}")
        return
    for line in landing.where(uri, parent["experiment_id"], landed["view"],
                                landed.get("runs", [])):
        print(line)
