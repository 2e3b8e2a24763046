"""The engine's one entry for a run: checks, the model loaded once, the receipt, every point walked.

``run_document`` is what the pipeline calls; ``walk_points`` is the walk over a document's
points (fused groups first, then each point's own walk) that a run and ``explain --traces``
share, each through its runner (``causalab.engine.runner``). It never compiles, never parses
flags and never tracks: the pipeline hands it a compiled plan, an ``Events`` listener and the
claim that holds ``--out``.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from causalab.compile.plan import Plan
from causalab.document.vocab import DTYPES
from typing import TYPE_CHECKING

from causalab.engine import record
from causalab.engine.events import Events
from causalab.files import DOCUMENT

if TYPE_CHECKING:  # annotations only: a rerun of done points imports no torch
    from causalab.engine.cache import DocumentCache
    from causalab.engine.runner import Runner

ENGINE = "StandardizedTransformer"  # what the engine loads a checkpoint as (run.json's engine)
# The fidelity receipt's pass, as explain --traces names it (its trace's rows are the
# receipt's own, numbered from 0: the label names the input's rows they are).
RECEIPT = "fidelity receipt (no write, {rows} of '{role}', against a plain transformers forward)"


def points_of(plan: Plan) -> list[Plan]:
    """The point plans of a compiled document: its children when swept, else the root."""
    if plan.document is None and plan.children and all(isinstance(c, Plan) for c in plan.children):
        return list(plan.children)
    return [plan]


def run_document(plan: Plan, raw: dict, *, out: str,
                 hold: Callable[[str], contextlib.AbstractContextManager],
                 batch_size: int | None = None, device_map: str = "cpu",
                 events: Events | None = None, resume_mib: int | None = None,
                 memory: str | None = None) -> list[str]:
    """Run a compiled ``plan`` (of the document ``raw``) into ``out`` and return the written
    paths in order: ``document.json``, ``run.json``, then every save. Its writes and
    bundles are checked before ``hold(out)`` (the pipeline's claim) is taken; a run whose
    every point was done before loads no model."""
    from causalab.engine.bundle_files import check_plan_bundles
    from causalab.engine.containment import check_plan

    events = events or Events()
    points = points_of(plan)
    check_plan(plan, out)
    check_plan_bundles(plan, resolver=events.resolve)
    with hold(out):
        events.run_start(raw, points)
        verdicts = _leading_verdicts(events, points)
        ref = plan.model or points[0].model
        runner, cache = None, None
        if any(verdicts.values()):  # else every point was done before: no model, no torch
            runner, cache, held = _loaded(ref, device_map, memory, resume_mib, events)
            events.receipt(receipt(runner, points[0], ref.dtype, points=points, cache=cache,
                                   batch_size=batch_size))
        written = [record.write_json(Path(out) / DOCUMENT, raw, root=out)]
        engine, dtype = ENGINE, DTYPES[ref.dtype]
        if runner is not None:
            engine, dtype = type(runner.model).__name__, _served(runner)
        # Before the points: each point's run uploads it with its own files.
        written.append(record.write_run_record(out, engine, batch_size, dtype))
        if runner is not None:
            held.check("the model's load and the fidelity receipt")
            written += walk_points(runner, points, out=out, batch_size=batch_size,
                                   events=events, cache=cache, verdicts=verdicts, watch=held)
        events.run_end(written)
        return written


def _loaded(ref, device_map: str, memory: str | None, resume_mib: int | None,
            events: Events) -> tuple[Runner, DocumentCache, BudgetWatch]:
    """The model loaded within the memory budget (refused before any weight when the
    process's floor and the weights exceed it), its runner, the document cache sized to the
    budget, and the watch that says if the measured peak passes it (from before the load)."""
    from causalab.engine.cache import DocumentCache
    from causalab.engine.runner import TraceRunner
    from causalab.engine.weights import budget_of, load_model, measure_budget

    from causalab import memory as machine

    measured = measure_budget(ref, memory, device_map)
    start = machine.peak_bytes(measured.device)
    model = load_model(ref, device_map=device_map)
    budget = budget_of(measured, model)
    cache = DocumentCache(None if resume_mib is None else resume_mib * 2 ** 20, memory=budget)
    return TraceRunner(model), cache, BudgetWatch(budget, events, start)


def _served(runner: Runner) -> str:
    from causalab.engine.weights import served_dtype

    return served_dtype(runner.model)


def receipt(runner: Runner, point: Plan, dtype: str, *, points: list[Plan] = (),
            cache: DocumentCache | None = None, batch_size: int | None = None) -> dict | None:
    """The fidelity receipt (``causalab.engine.fidelity``) of the run whose first point is
    ``point``, checked by ``runner``; None without an observed metric. In fp32 it rides the
    un-intervened fill of the run's first fused ``points`` where it can (``walk.riding``):
    that fill's values then wait in ``cache``; else its pass runs alone on a state of its own."""
    from causalab.engine import fidelity, walk
    from causalab.engine.planner import alike_later, groups
    from causalab.engine.trace_jobs import span

    found = fidelity.receipt_pass(point, runner.config)
    if found is None:
        return None
    label, result = RECEIPT.format(rows=span(found.rows), role=found.role), None
    try:  # as ``walk.prefetch``: a point meets its own error on its own walk, at its own path
        if points and cache is not None and dtype == "fp32":
            runs = groups(list(points), batch_size, cache)
            rides = walk.riding(runner, found.every, runs[0], alike_later(runs)[0],
                                cache=cache, batch_size=batch_size)
            if rides is not None:
                with runner.at(f"{label}, riding the fill of {len(rides.units)} fused points"):
                    result = walk.ride(runner, rides)
    except Exception:
        result = None
    if result is None:
        with runner.at(label):
            result = walk.pass_on(runner, found.pass_, None)
    return runner.receipt(found, result, dtype)


class BudgetWatch:
    """Whether the memory budget held, measured (``memory.peak_bytes``), not estimated: the
    first time the process's peak passes the budget by more than ``memory.PEAK_SLACK`` it
    says so in one note naming where (docs/format.md §12). A peak reached before this run
    (an earlier run of the process) is not this run's."""

    def __init__(self, budget, events: Events, start: int | None = None) -> None:
        from causalab import memory

        self.budget, self.events = budget, events
        self.start = start if start is not None or budget is None else \
            memory.peak_bytes(budget.device)
        self.said = budget is None

    def check(self, where: str) -> None:
        from causalab import memory

        if self.said:
            return
        peak = memory.peak_bytes(self.budget.device)
        if peak > self.start and self.budget.over(peak, memory.PEAK_SLACK):
            self.said = True
            self.events.note(f"memory: the budget of {memory.gib(self.budget.total)} was not "
                             f"held: the process peaked at {memory.gib(peak)} by the end of "
                             f"{where}, whose smallest traces need more than the budget leaves "
                             f"after the weights and the runtime ({memory.gib(self.budget.held)})")


def walk_points(runner: Runner, points: list[Plan], *, out: str, batch_size: int | None,
                events: Events, cache: DocumentCache,
                verdicts: dict[int, bool] | None = None,
                watch: BudgetWatch | None = None) -> list[str]:
    """Every fused group of ``points`` walked through ``runner``: their saves; the first
    error is raised once every point has run.

    Points whose intervened forwards fuse (``causalab.engine.planner``) are started together,
    computed together, then written and ended one by one; each point still sees
    ``point_start``, its metrics and ``point_end`` in that order. A point that raises is
    reported to ``point_end`` with its error and the other points still run. An interrupt
    stops at once, ending every started point.
    """
    from causalab.engine.planner import alike_later, groups

    saves: list[str] = []
    failed: Exception | None = None
    runs = groups(points, batch_size, cache)
    for group, ahead in zip(runs, alike_later(runs)):
        done, error = _run_group(group, runner, out=out, batch_size=batch_size,
                                 events=events, cache=cache, ahead=ahead,
                                 verdicts=verdicts or {})
        saves += done
        failed = failed or error
        if watch is not None:
            watch.check(f"point {group[0].name or '<root>'}" if len(group) == 1 else
                        f"points {group[0].name} to {group[-1].name}")
    if failed is not None:
        raise failed
    return saves


def _leading_verdicts(events: Events, points: list[Plan]) -> dict[int, bool]:
    """``point_start`` of each point in order, up to the first that runs: a rerun whose
    points are all done ends with these; otherwise the groups take the verdicts given."""
    verdicts: dict[int, bool] = {}
    for point in points:
        verdicts[id(point)] = events.point_start(point) is not False
        if verdicts[id(point)]:
            break
    return verdicts


def _run_group(group: list[Plan], runner: Runner, *, out: str, batch_size: int | None,
               events: Events, cache: DocumentCache, ahead: list[Plan],
               verdicts: dict[int, bool]) -> tuple[list[str], Exception | None]:
    """Start, compute and end one fused group of points: ``(their saves, first error)``.
    ``ahead``: later points of the group's kind, whose shared values it computes too;
    ``verdicts``: the points already asked whether they run (``point_start``)."""
    from causalab.engine.walk import discard_prefetched, prefetch, walk_plan

    started = [point for point in group
               if (verdicts[id(point)] if id(point) in verdicts
                   else events.point_start(point) is not False)]
    try:
        prefetch(started, runner, batch_size=batch_size, cache=cache, ahead=ahead)
    except BaseException as error:
        _abandon(events, started, error)
        raise
    saves: list[str] = []
    failed: Exception | None = None
    for index, point in enumerate(started):
        try:
            done = walk_plan(point, runner, out=out, batch_size=batch_size, events=events,
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


def _release(node: Plan) -> None:
    """Drop an ended point's results (reads, tables, fitted weights): its files hold them
    now, and a 270-point head sweep would otherwise keep every point's logits (24 MB each
    on SmolLM2) to the end of the run."""
    results = getattr(node, "results", None)
    if results is not None:
        results.clear()
    for child in getattr(node, "children", ()):
        _release(child)


def _abandon(events: Events, points: list[Plan], error: BaseException) -> None:
    """An interrupt: every started point that has not ended ends with it."""
    for point in points:
        events.point_end(point, [], error)

