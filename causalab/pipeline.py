"""The run pipeline: compile the whole document, load the model once, walk every point, write.

Every refusal that compile can raise fires before any weight is loaded. Progress goes to an
``Events`` listener (tracking, a progress bar); this module prints nothing. Paths come back
in the order they were written: ``document.json``, ``run.json``, then every save.
"""
from __future__ import annotations

from pathlib import Path

from causalab.tracking.claims import claim
from causalab.document.vocab import DTYPES
from causalab.files import DEFAULT_DATA_ROOT, DEFAULT_OUT, DOCUMENT


def compile_only(raw: dict, data_root: str = DEFAULT_DATA_ROOT, resolver=None):
    """The plan tree of ``raw`` with no weights loaded (what ``explain`` prints); ``resolver``
    fetches ``runs:/`` bundles so their stamps are checked here too."""
    import causalab.compile

    return causalab.compile.compile_document(raw, data_root=data_root, resolver=resolver)


def points_of(plan) -> list:
    """The point plans of a compiled document: its children when swept, else the root."""
    from causalab.compile.plan import Plan

    if plan.document is None and plan.children and all(isinstance(c, Plan) for c in plan.children):
        return list(plan.children)
    return [plan]


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
    from causalab.engine.bundle_files import check_plan_bundles
    from causalab.engine.containment import check_plan
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
    points = points_of(plan)
    check_plan(plan, out)
    check_plan_bundles(plan, resolver=events.resolve)
    with claim(out):
        return _run_claimed(raw, plan, points, out=out, batch_size=batch_size,
                            device_map=device_map, events=events, resume_mib=resume_mib,
                            memory=memory)


def _check_memory(memory: str | None) -> None:
    from causalab import memory as budgets
    from causalab.errors import UsageError

    try:
        budgets.parse(memory or budgets.DEFAULT)
    except ValueError as error:
        raise UsageError(("--memory",), str(error)) from None


def _run_claimed(raw: dict, plan, points: list, *, out: str, batch_size: int | None,
                 device_map: str, events, resume_mib: int | None,
                 memory: str | None = None) -> list[str]:
    """Run every point into ``out``, which this run holds; a run whose every point was done
    before loads no model."""
    from causalab.engine import record

    events.run_start(raw, points)
    verdicts = _leading_verdicts(events, points)
    model, budget = None, None
    if any(verdicts.values()):  # else every point was done before: no model, no torch
        from causalab.engine.weights import budget_of, load_model, measure_budget

        from causalab.engine.fidelity import receipt

        ref = plan.model or points[0].model
        measured = measure_budget(ref, memory, device_map)  # refused here, before any weight
        model = load_model(ref, device_map=device_map)
        budget = budget_of(measured, model)
        events.receipt(receipt(model, points[0], ref.dtype))
    written = [record.write_json(Path(out) / DOCUMENT, raw, root=out)]
    saves, engine, dtype = [], ENGINE, DTYPES[(plan.model or points[0].model).dtype]
    if model is not None:
        saves, engine, dtype = _run_points(model, points, verdicts, out=out, events=events,
                                           batch_size=batch_size, resume_mib=resume_mib,
                                           budget=budget)
    written.append(record.write_run_record(out, engine, batch_size, dtype))
    written += saves
    events.run_end(written)
    return written


ENGINE = "StandardizedTransformer"  # what the engine loads a checkpoint as (run.json's engine)


def _leading_verdicts(events, points: list) -> dict[int, bool]:
    """``point_start`` of each point in order, up to the first that runs: a rerun whose
    points are all done ends with these; otherwise the groups take the verdicts given."""
    verdicts: dict[int, bool] = {}
    for point in points:
        verdicts[id(point)] = events.point_start(point) is not False
        if verdicts[id(point)]:
            break
    return verdicts


def _run_points(model, points: list, verdicts: dict[int, bool], *, out: str, events,
                batch_size: int | None, resume_mib: int | None, budget=None):
    """Run every fused group on ``model``: ``(saves, engine name, served dtype)``; the first
    error is raised once every point has run. ``budget``: the memory budget
    (``engine.budget.Budget``) the planner sizes windows to."""
    from causalab.engine.cache import DocumentCache
    from causalab.engine.weights import served_dtype
    from causalab.engine.planner import alike_later, groups

    saves: list[str] = []
    cache = DocumentCache(None if resume_mib is None else resume_mib * 2 ** 20, memory=budget)
    failed: Exception | None = None
    runs = groups(points, batch_size, cache)
    for group, ahead in zip(runs, alike_later(runs)):
        done, error = _run_group(group, model, out=out, batch_size=batch_size, events=events,
                                 cache=cache, ahead=ahead, verdicts=verdicts)
        saves += done
        failed = failed or error
    if failed is not None:
        raise failed
    return saves, type(model).__name__, served_dtype(model)


def _unchecked(plan, events, strict: bool) -> None:
    import causalab.compile
    from causalab.errors import CompileError, format_path

    for path, why in causalab.compile.unchecked(plan):
        if strict:
            raise CompileError(path, why)
        events.note(f"{format_path(path)}: {why}")


def _run_group(group: list, model, *, out: str, batch_size: int | None, events, cache,
               ahead: list = (), verdicts: dict[int, bool] | None = None
               ) -> tuple[list[str], Exception | None]:
    """Start, compute and end one fused group of points: ``(their saves, first error)``.
    ``ahead``: later points of the group's kind, whose shared values it computes too;
    ``verdicts``: the points already asked whether they run (``point_start``)."""
    from causalab.engine.walk import discard_prefetched, prefetch, run_plan

    asked = verdicts or {}
    started = [point for point in group
               if (asked[id(point)] if id(point) in asked
                   else events.point_start(point) is not False)]
    try:
        prefetch(started, model, batch_size=batch_size, cache=cache, ahead=ahead)
    except BaseException as error:
        _abandon(events, started, error)
        raise
    saves: list[str] = []
    failed: Exception | None = None
    for index, point in enumerate(started):
        try:
            done = run_plan(point, model, out=out, batch_size=batch_size, events=events,
                            cache=cache)
        except Exception as error:
            events.point_end(point, [], error)
            _release(point)
            failed = failed or error
            continue
        except BaseException as error:
            _abandon(events, started[index:], error)
            raise
        finally:
            discard_prefetched(point, cache)
        events.point_end(point, [str(Path(p).relative_to(out)) for p in done], None)
        _release(point)
        saves += done
    return saves, failed


def _release(node) -> None:
    """Drop an ended point's results (reads, tables, fitted weights): its files hold them
    now, and a 270-point head sweep would otherwise keep every point's logits (24 MB each
    on SmolLM2) to the end of the run."""
    results = getattr(node, "results", None)
    if results is not None:
        results.clear()
    for child in getattr(node, "children", ()):
        _release(child)


def _abandon(events, points: list, error: BaseException) -> None:
    """An interrupt: every started point that has not ended ends with it."""
    for point in points:
        events.point_end(point, [], error)
