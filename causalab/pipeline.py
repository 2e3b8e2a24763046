"""The run pipeline: compile the whole document, load the model once, walk every point, write.

Every refusal that compile can raise fires before any weight is loaded. Progress goes to an
``Events`` listener (tracking, a progress bar); this module prints nothing. Paths come back
in the order they were written: ``document.json``, ``run.json``, then every save.
"""
from __future__ import annotations

from causalab.tracking.claims import claim
from causalab.files import DEFAULT_DATA_ROOT, DEFAULT_OUT


def compile_only(raw: dict, data_root: str = DEFAULT_DATA_ROOT, resolver=None):
    """The plan tree of ``raw`` with no weights loaded (what ``explain`` prints); ``resolver``
    fetches ``runs:/`` bundles so their stamps are checked here too."""
    import causalab.compile

    return causalab.compile.compile_document(raw, data_root=data_root, resolver=resolver)


def points_of(plan) -> list:
    """The point plans of a compiled document: its children when swept, else the root."""
    from causalab.engine.entry import points_of as engine_points

    return engine_points(plan)


def run_document(raw: dict, *, out: str = DEFAULT_OUT, batch_size: int | None = None,
                 device_map: str = "cpu", data_root: str = DEFAULT_DATA_ROOT,
                 events=None, resume_mib: int | None = None, strict: bool = False,
                 memory: str | None = None) -> list[str]:
    """Run a raw document end to end and return the written paths, in order.

    A bundle check compile could not make (a stamp without a digest) goes to ``events.note``
    as one line, or with ``strict`` is refused.

    ``resume_mib``: MiB of un-intervened values kept for prefix resume (docs/platform.md §7;
    default ``RESUME_BUDGET``, 0 turns resume off). ``memory``: what the whole process may
    hold (``causalab.memory``; default 80% of free memory): a model whose weights alone exceed
    it is refused before it loads, and the planner sizes every trace's window to it.

    ``events`` (a ``causalab.engine.events.Events``) may veto a point from ``point_start``.
    Points whose intervened forwards fuse (``causalab.engine.planner``) are started together,
    computed together, then written and ended one by one; each point still sees
    ``point_start``, its metrics and ``point_end`` in that order. A point that raises is
    reported to ``point_end`` with its error and the other points still run; the first error
    is raised once they have. An interrupt stops at once, ending every started point. The run
    holds ``out`` from before the model loads to its end (``causalab.tracking.claims``): a second run
    into the same folder meanwhile is refused.
    """
    from causalab.engine.entry import run_document as run_plan
    from causalab.engine.events import Events
    from causalab.errors import UsageError

    for flag, value, low in (("--batch-size", batch_size, 1), ("--resume-mib", resume_mib, 0)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < low):
            raise UsageError((flag,), f"must be an integer, {low} or more, not {value!r}")
    _check_memory(memory)
    events = events or Events()
    plan = compile_only(raw, data_root, resolver=events.resolve)
    _unchecked(plan, events, strict)
    return run_plan(plan, raw, out=out, hold=claim, batch_size=batch_size,
                    device_map=device_map, events=events, resume_mib=resume_mib, memory=memory)


def _check_memory(memory: str | None) -> None:
    from causalab import memory as budgets
    from causalab.errors import UsageError

    try:
        budgets.parse(memory or budgets.DEFAULT)
    except ValueError as error:
        raise UsageError(("--memory",), str(error)) from None


def _unchecked(plan, events, strict: bool) -> None:
    import causalab.compile
    from causalab.errors import CompileError, format_path

    for path, why in causalab.compile.unchecked(plan):
        if strict:
            raise CompileError(path, why)
        events.note(f"{format_path(path)}: {why}")
