"""A run's options, validated once, whichever front door took them.

``causalab run``'s flags, a Hydra job's ``run.*`` and ``tracking.*`` keys and the keywords of
:func:`causalab.run` are one :class:`RunOptions`: one place for each option's default and
its rule. Each door spells the options its own way (``--batch-size``, ``run.batch_size``,
``batch_size``), and a refusal names the option as that door's user wrote it, in one line:
``error: run.batch_size: must be 1 or more, not 0``. A value left out (or null) takes the
default. The command line's values are text and are read as numbers here; the other doors
are strict (``tracking.rerun=no`` is refused, not read as true). Imports pydantic only; the
device an option names is checked against the machine by :func:`check_device`.

>>> run_options("python", batch_size=8).device_map
'auto'
"""
from __future__ import annotations

import argparse
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from causalab import flags, memory
from causalab.errors import Path, UsageError
from causalab.files import DEFAULT_DATA_ROOT

Door = Literal["cli", "hydra", "python"]


class RunOptions(BaseModel):
    """How a document runs and where it is tracked; none of it enters the document.

    ``out``: the output folder (none: the door's own, ``out`` for the command line, the job's
    folder for Hydra, a temporary folder for a notebook). ``device_map``: a placement or a
    device; ``auto`` is the accelerator when there is one, else the CPU. ``batch_size``: rows
    per forward window (none: the whole pass). ``resume_mib``: MiB kept for prefix resume
    (none: 256; 0 turns it off). ``memory``: what the whole process may hold, weights
    included: bytes with a unit (``6GiB``) or a share of free memory (``80%``, the default;
    :mod:`causalab.memory`). ``track``: log to MLflow; ``tracking_uri`` (else
    MLFLOW_TRACKING_URI or ./mlflow.db), ``experiment`` (else MLFLOW_EXPERIMENT_NAME, else
    ``causalab``, ``causalab-<user>`` on a server with a login); ``rerun``: run points even
    when a finished run has their digest; ``strict``: refuse when a bundle check cannot run
    (a stamp without a digest).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    out: str | None = None
    device_map: str = "auto"
    batch_size: int | None = Field(default=None, ge=1)
    resume_mib: int | None = Field(default=None, ge=0)
    memory: str | None = None
    data_root: str = DEFAULT_DATA_ROOT
    track: bool = True
    tracking_uri: str | None = None
    experiment: str | None = None
    rerun: bool = False
    strict: bool = False

    @field_validator("device_map")
    @classmethod
    def _placement(cls, value: str) -> str:
        return _flag(flags.device_map, value)

    @field_validator("memory")
    @classmethod
    def _budget(cls, value: str | None) -> str | None:
        if value is not None:
            memory.parse(value)
        return value

    @field_validator("tracking_uri")
    @classmethod
    def _scheme(cls, value: str | None) -> str | None:
        return value if value is None else _flag(flags.tracking_uri, value)

    @field_validator("experiment")
    @classmethod
    def _named(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must name an experiment, not be empty")
        return value


def _flag(check: Callable[[str], str], value: str) -> str:
    """A ``causalab.flags`` check (the command line's own) as a pydantic rule."""
    try:
        return check(value)
    except argparse.ArgumentTypeError as error:
        raise ValueError(str(error)) from None


# How each door spells each option: what a refusal names.
SPELLINGS: dict[str, dict[str, Path]] = {
    "cli": {"out": ("--out",), "device_map": ("--device-map",),
            "batch_size": ("--batch-size",), "resume_mib": ("--resume-mib",),
            "memory": ("--memory",),
            "data_root": ("--data-root",), "track": ("--no-track",),
            "tracking_uri": ("--tracking-uri",), "experiment": ("MLFLOW_EXPERIMENT_NAME",),
            "rerun": ("--rerun",), "strict": ("--strict",)},
    "hydra": {"out": ("run", "out"), "device_map": ("run", "device_map"),
              "batch_size": ("run", "batch_size"), "resume_mib": ("run", "resume_mib"),
              "memory": ("run", "memory"),
              "data_root": ("run", "data_root"), "track": ("tracking", "enabled"),
              "tracking_uri": ("tracking", "uri"), "experiment": ("tracking", "experiment"),
              "rerun": ("tracking", "rerun"), "strict": ("run", "strict")},
    "python": {name: (name,) for name in RunOptions.model_fields},
}

# pydantic's error kinds, said as a rule about the value.
_RULES = {
    "bool_type": "must be true or false", "int_type": "must be an integer",
    "int_parsing": "must be an integer", "string_type": "must be text",
    "extra_forbidden": "is not a run option",
}


def spelled(door: Door, option: str) -> Path:
    """The option as ``door``'s user writes it: ``("run", "batch_size")`` for Hydra."""
    return SPELLINGS[door].get(option, (option,))


def run_options(door: Door, **given: Any) -> RunOptions:
    """The options a door was given, validated once; a refusal names the first bad one as
    that door spells it. ``None`` means the option's default."""
    values = {name: value for name, value in given.items() if value is not None}
    try:
        return RunOptions.model_validate(values, strict=door != "cli")
    except ValidationError as error:
        problem = error.errors()[0]
        name = str(problem["loc"][0]) if problem["loc"] else ""
        raise UsageError(spelled(door, name), _rule(problem, door)) from None


def _rule(problem: dict, door: Door) -> str:
    """The broken rule and the value given (as typed, on the command line)."""
    context = problem.get("ctx") or {}
    kind = problem["type"]
    if kind == "value_error":
        return str(context.get("error", problem["msg"]))
    if kind == "extra_forbidden":
        return _RULES[kind]
    if kind == "greater_than_equal":
        rule = f"must be {context['ge']} or more"
    else:
        rule = _RULES.get(kind, problem["msg"][:1].lower() + problem["msg"][1:])
    given = problem["input"]
    return f"{rule}, not {given if door == 'cli' and isinstance(given, str) else repr(given)}"


def check_device(options: RunOptions, door: Door) -> None:
    """Refuse a device this machine lacks, before any weight is read (imports torch)."""
    flags.check_device(options.device_map, spelled(door, "device_map"))
