"""``python -m causalab.run``: compose with Hydra, render the document, run it, track it.

    python -m causalab.run experiment=das model=llama
    python -m causalab.run -m experiment=layer_sweep model=llama,gpt2
    python -m causalab.run -m hydra/launcher=joblib experiment=patching site.layer=0,1

The document is what ``causalab.hydra.rendering.render`` makes of the composed config; ``run`` and
``tracking`` are the run's options (:mod:`causalab.options`, validated once, a null taking the
option's default) and never enter it. Files go to ``run.out`` or, when that is null, to the
job's Hydra output directory. In a multirun, the jobs' runs nest under the
parent run that ``causalab.hydra.callbacks.MultirunParent`` opened in the launching process.
This module holds no experiment logic: the pipeline runs, tracking logs.
"""
from __future__ import annotations

import io
import os
import signal
import sys
import types
import warnings
from contextlib import nullcontext, redirect_stdout
from pathlib import Path
from typing import Any, NoReturn

try:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import CompactHydraException
    from hydra.types import RunMode

    from causalab.cli.main import process_settings
    from causalab.errors import CausalabError, fault_line
    from causalab.interrupts import INTERRUPTED, exit_status, interrupts, leave, one_line
    from causalab.options import RunOptions, check_device, run_options
    from causalab.hydra.rendering import CONF, document_of, unknown_choice
except ModuleNotFoundError as _missing:  # run by a Python without the set-up: one line
    from causalab.errors import not_set_up

    _line = not_set_up(_missing, "causalab.run") if __name__ == "__main__" else None
    if _line is None:
        raise
    raise SystemExit(_line) from None

_GROUPS = ("experiment", "model", "site", "data")


def _job() -> tuple[str | None, dict[str, str], dict | None]:
    """(run name, params, multirun parent) of the current Hydra job."""
    from causalab.hydra.callbacks import multirun_parent, overrides_of
    from causalab.hydra.jobs import parent_of_job

    hydra_config = HydraConfig.get()
    choices = {g: str(hydra_config.runtime.choices[g]) for g in _GROUPS
               if hydra_config.runtime.choices.get(g) is not None}
    # What names the job names its params too: not where or how it runs (run.data_root, …).
    excluded = set(hydra_config.job.config.override_dirname.get("exclude_keys") or ())
    overrides = {key: value for key, value in overrides_of(list(hydra_config.overrides.task)).items()
                 if key not in excluded}
    name = hydra_config.job.override_dirname or " ".join(f"{k}={v}" for k, v in choices.items())
    parent = None
    if hydra_config.mode == RunMode.MULTIRUN:
        parent = parent_of_job(hydra_config) or multirun_parent(str(hydra_config.sweep.dir))
    return name, {**choices, **overrides}, parent


def run_options_of(config: Any) -> RunOptions:
    """The job's ``run`` and ``tracking`` keys as the run's options (:mod:`causalab.options`),
    validated once; a refusal names the key (``tracking.rerun``, ``run.batch_size``)."""
    run = dict(config.get("run") or {})
    tracking = dict(config.get("tracking") or {})
    named = {"enabled": "track", "uri": "tracking_uri"}
    return run_options("hydra", **run, **{named.get(k, k): v for k, v in tracking.items()})


def tracking_events(config: Any, out: str, options: RunOptions | None = None):
    """The job's MLflow listener, or None when ``tracking.enabled`` is false."""
    options = options or run_options_of(config)
    if not options.track:
        return None
    from causalab.tracking import TrackingEvents

    from causalab.scores.naming import run_label

    name, params, parent = _job()
    parent = parent or {}
    # What tells this job from the multirun's others, before each of its points' names.
    label = run_label({key: params[key] for key in parent.get("varied") or () if key in params})
    return TrackingEvents(
        tracking_uri=parent.get("tracking_uri") or options.tracking_uri,
        experiment=parent.get("experiment") or options.experiment,
        rerun=options.rerun, hydra_config=config, out=out,
        parent_run_id=parent.get("run_id"), run_name=name, job_params=params, job_label=label)


def _job_line(document: dict) -> str:
    """``job 2: experiment=das model=gpt2 · causalab:weekday-gpt2``: which job this block is."""
    hydra_config = HydraConfig.get()
    number = hydra_config.job.get("num")
    name = hydra_config.job.override_dirname or "(no overrides)"
    model = (document.get("model") or {}).get("key") or "?"
    return f"job {number if number is not None else 0}: {name} · {model}"


def _report(out: str, written: list[str], summary, job: str) -> None:
    print(job)
    if summary.lines:
        print(summary.render())
    print(f"causalab: {len(written)} files in {Path(out).resolve()}")


def _report_tracking(events) -> None:
    """What was logged where, once it is stored."""
    if events is None:
        return
    from causalab.scores import naming, summary
    from causalab.tracking import landing, ui_command
    from causalab.tracking import runs as store

    for label, run_id in events.skipped.items():
        metrics = events.call(store.metrics_of, run_id)
        shown = " ".join(f"{k}={summary.shown_score(metrics, k)}" for k in sorted(metrics)
                         if naming.is_score(k))
        link = events.linked.get(label)
        linked = f", linked here as run {link}" if link else ""
        print(f"skipped {label or '<root>'}: done in run {run_id}{linked}: {shown}")
    runs = len(events.point_runs)
    skipped = f", {len(events.skipped)} reused as done" if events.skipped else ""
    print(f"mlflow: {runs} run(s){skipped} in experiment {events.experiment!r} at {events.uri}")
    found = events.sweep_run_id and events.call(landing.landed, events.experiment_id,
                                                events.sweep_run_id)
    if not found:
        print(f"see them: {ui_command(events.uri, events.experiment_id)}")
    elif events.uri.startswith(("http://", "https://")):
        for line in landing.where(events.uri, events.experiment_id, found["view"],
                                    found["runs"]):
            print(line)
    else:  # the UI's port is the one `causalab ui` finds free, so it prints the addresses
        print(f"see the sweep: {ui_command(events.uri, run_id=found['view'])}")


def _run(config) -> None:
    from causalab.engine.events import Chain
    from causalab.pipeline import run_document
    from causalab.progress import PointProgress, Summary
    from causalab.plots.sweep_files import FitPictures, SweepPictures

    document = document_of(config)
    options = run_options_of(config)
    check_device(options, "hydra")
    out = options.out or HydraConfig.get().runtime.output_dir
    events = tracking_events(config, out, options)
    summary = Summary()
    # A multirun job says everything in one write at its end: jobs a parallel launcher runs
    # side by side never interleave their lines.
    block = io.StringIO() if _multirun() else None
    with events if events is not None else nullcontext():
        written = run_document(document, out=out, batch_size=options.batch_size,
                               device_map=options.device_map, data_root=options.data_root,
                               events=Chain(FitPictures(out), events, PointProgress(),
                                            summary, SweepPictures(out)),
                               resume_mib=options.resume_mib, memory=options.memory)
        # The numbers are shown now; leaving the block waits for MLflow to store them.
        with redirect_stdout(block) if block is not None else nullcontext():
            _report(out, written, summary, _job_line(document))
    with redirect_stdout(block) if block is not None else nullcontext():
        _report_tracking(events)
    if block is not None:
        sys.stdout.write(block.getvalue())
        sys.stdout.flush()


class JobFailed(CompactHydraException):
    """A multirun job that was refused or failed, its one line already printed: raised (not
    ``SystemExit``) so Hydra marks the job FAILED and runs the next one; once the batch has
    run, Hydra raises the first such job's and the multirun exits 1 with this one line."""


def job(config) -> None:
    """One job: a refused document is one line on stderr and exit status 1, no traceback (a
    fault is one line too; ``HYDRA_FULL_ERROR=1`` shows its traceback); SIGINT or SIGTERM
    ends the open runs KILLED and is one line and exit status 130 or 143. In a multirun a
    refused or failed job ends only itself: the other jobs still run.

    A module-level function of an importable module: cluster launchers pickle it by reference
    and import it again on the node.
    """
    try:
        with interrupts():
            _run(config)
    except CausalabError as error:
        print(f"error: {_which_job()}{error}", file=sys.stderr)
        _fail()
    except KeyboardInterrupt as stop:
        print(one_line(stop), file=sys.stderr)
        raise SystemExit(exit_status(stop)) from None
    except Exception as error:  # a fault, not a refusal: one line too, unless asked for more
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(fault_line(error, "set HYDRA_FULL_ERROR=1 for the traceback"), file=sys.stderr)
        _fail()


def _fail() -> NoReturn:
    if _multirun():
        raise JobFailed(f"error: {_which_job().rstrip(': ')} failed, as its line above says; "
                        f"the multirun ran its other jobs") from None
    raise SystemExit(1) from None


def _multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _which_job() -> str:
    """``job 1 (site.layer=99): ``: in a multirun, the job a refusal is about; else nothing."""
    if not _multirun():
        return ""
    job = HydraConfig.get().job
    return f"job {job.get('num')} ({job.override_dirname or 'no overrides'}): "


main = hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")(job)


class _CallableModule(types.ModuleType):
    """Importing this module binds ``causalab.run`` to it; calling it stays the notebook API
    (:func:`causalab.results.run`), so ``causalab.run(document)`` works either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from causalab.results import run

        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


# Hydra's flags that take configs from another folder or file.
_ELSEWHERE = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name")


def _leave_interrupted(status: int) -> None:
    """End a multirun parent this process opened KILLED, then leave at once (``leave``)."""
    opened = sys.modules.get("causalab.hydra.callbacks")
    if opened is not None:
        opened.end_open_parents("KILLED", f"interrupted ({signal.Signals(status - 128).name})")
    leave(status)


if __name__ == "__main__":
    process_settings()
    # conf/hydra/launcher/ray.yaml and submitit_slurm.yaml share their names with the plugins'
    # schemas, which Hydra 1.3 still validates them against while warning about it each time.
    warnings.filterwarnings("ignore", message="(?s).*validated against ConfigStore schema")
    # ``python -m causalab.run`` runs this file as ``__main__``; the job must come from the
    # importable module instead, or a launcher would pickle ``__main__``'s code by value.
    from causalab.run import main as entry

    # An option a config group does not have (experiment=dass) is one line with the nearest
    # names, not Hydra's list of every option. Configs from elsewhere (a --config-dir, a
    # hydra.searchpath) may add options: those are Hydra's to judge.
    arguments = sys.argv[1:]
    elsewhere = any(a.split("=")[0] in _ELSEWHERE or "hydra.searchpath" in a for a in arguments)
    unknown = None if elsewhere else unknown_choice([a for a in arguments if not a.startswith("-")])
    if unknown is not None:
        print(f"error: {unknown}", file=sys.stderr)
        raise SystemExit(1)

    # Interrupts count from the start: one that lands while Hydra starts, or in a launcher
    # waiting on its workers (joblib), is one line and ends what this process opened, as
    # one inside a job is.
    try:
        with interrupts():
            entry()
    except KeyboardInterrupt as stop:
        print(one_line(stop), file=sys.stderr)
        _leave_interrupted(exit_status(stop))
    except SystemExit as stop:
        if stop.code in INTERRUPTED:
            _leave_interrupted(stop.code)
        raise
