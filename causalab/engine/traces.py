"""``explain --traces``: the traces a run of a document opens, planned without its weights.

It walks a compiled plan in the order ``pipeline.run_document`` and the walk run it (fused
groups of sweep points first, then each point's steps, a fit's updates and evals, an
attribute step's windows) and asks the planner for each pass's stages, over a document
cache that keeps ``PLANNED`` where a run keeps tensors: the jobs are the ones a run hands ``walk.run_trace``. It cannot know two
things a run learns: a fit that stops early runs fewer updates (counted here to its last
epoch), and a model whose KV cache keeps no keys for some layer runs its last-column
forwards whole. It reads the model's config and tokenizer, never its weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, NamedTuple

from causalab import memory
from causalab.compile.plan import Attribute, Fit, Observe, Pass, Plan
from causalab.engine import fidelity, planner
from causalab.engine import assembly as passes
from causalab.engine.attribution import verify
from causalab.engine.budget import RESUME_SHARE, Budget, trace_bytes
from causalab.engine.cache import RESUME_BUDGET, DocumentCache
from causalab.engine.trace_jobs import Stage, TraceJob, describe
from causalab.engine.state import ModelFacts, PassContext, WalkState, new_state

RECEIPT = "fidelity receipt (no write, against a plain transformers forward)"


# What a run's process holds before its first trace beyond the weights (python, torch,
# transformers, nnsight; measured at ~420 MiB on CPU), rounded up.
RUNTIME = 640 * 2 ** 20
# The words a schedule uses, said once under its first line.
LEGEND = ("  terms: 'whole' = a read of every position of its site; 'resumes at block L' = "
          "starts there from kept un-intervened values (the resume budget caps them)",
          "  'unembed' = the final norm and lm_head, run over every position, the last, or "
          "unread; '<root>' = the document itself, when it sweeps nothing")


class Planned(NamedTuple):
    """One trace of the schedule: where it runs (a point, a step, an update) and its job;
    ``call`` counts the passes run, so a pass's traces stay together."""

    where: str
    call: int
    job: TraceJob


@dataclasses.dataclass
class _Dry:
    """What a planned walk carries: the model's facts and tokenizer, the traces so far and
    how many passes have run."""

    facts: ModelFacts
    tokenizer: Any
    found: list
    calls: int = 0


def schedule(plan: Plan, config: Any, tokenizer: Any, *, batch_size: int | None = None,
             resume_mib: int | None = None, budget: Budget | None = None) -> list[Planned]:
    """Every trace a run of ``plan`` opens, in order (its windows sized to ``budget``)."""
    dry = _Dry(ModelFacts.of(config), tokenizer, [])
    cache = DocumentCache(None if resume_mib is None else resume_mib * 2 ** 20, memory=budget)
    points = _points(plan)
    _receipt(dry, points[0], config)
    runs = planner.groups(points, batch_size, cache)
    for group, ahead in zip(runs, planner.alike_later(runs)):
        fused = _prefetch(dry, group, ahead, cache, batch_size)
        for point in group:
            state = WalkState(cache=cache, model_ref=point.model, point=point,
                              batch_size=batch_size)
            _walk(dry, point, state, fused, point.name)
    return dry.found


def _receipt(dry: _Dry, point: Plan, config: Any) -> None:
    """The fidelity receipt's no-op pass, which a run opens before its points, on a state
    of its own (``walk.run_pass`` with none)."""
    found = fidelity.receipt_pass(point, config)
    if found is not None:
        _pass(dry, found.pass_, new_state(), RECEIPT, rows=found.rows)


def _points(plan: Plan) -> list:
    """The point plans of a compiled document: its children when swept, else the root."""
    if plan.document is None and plan.children and all(isinstance(c, Plan) for c in plan.children):
        return list(plan.children)
    return [plan]


def _prefetch(dry: _Dry, points: list, ahead: list, cache: DocumentCache,
              batch_size: int | None) -> set:
    """``walk.prefetch`` planned: the ids of the passes it computes."""
    if len(points) < 2:
        return set()
    states = [[WalkState(cache=cache, point=point, batch_size=batch_size) for point in group]
              for group in (points, ahead)]
    fused = set()
    names = [point.name for point in points]
    where = f"fused {len(names)} points ({names[0]} … {names[-1]})"
    for index in range(len(points[0].children)):
        units = [_open(dry, point.children[index].pass_, state)
                 for point, state in zip(points, states[0])]
        later = [_open(dry, point.children[index].pass_, state)
                 for point, state in zip(ahead, states[1])]
        label = f"{where} / {points[0].children[index].name}"
        dry.calls += 1
        for step in range(len(units[0].pass_.forwards)):
            _dry(dry, planner.fused_stages(units, later, step), units + later, label)
        fused.update(id(ctx.pass_) for ctx in units)
    return fused


def _walk(dry: _Dry, plan: Plan, state: WalkState, fused: set, where: str) -> None:
    for node in plan.children:
        label = f"{where}/{node.name}" if where else node.name
        if isinstance(node, Plan):
            _walk(dry, node, dataclasses.replace(state, windows={}), fused, label)
        elif isinstance(node, Observe) and id(node.pass_) not in fused:
            _pass(dry, node.pass_, state, label)
        elif isinstance(node, Attribute) and node.circuit_k is None:  # edges: no nnsight trace
            ctx = _open(dry, node.passes[0], state)
            dry.calls += 1
            _dry(dry, planner.attribute_stages(ctx, node), [ctx], label)
            if node.verify:
                _verify(dry, node, state, label)
        elif isinstance(node, Fit):
            fit = dataclasses.replace(state, fill_prefixes=True)
            for epoch in range(node.epochs):
                for rows in node.batches[epoch]:
                    _pass(dry, node.train, fit, f"{label} update", rows=rows, grad=True)
                _pass(dry, node.eval, fit, f"{label} eval")


def _verify(dry: _Dry, node: Attribute, state: WalkState, where: str) -> None:
    """``verify``'s fused exact patches, planned on stand-ins: which units run is known only
    once the estimates are, but not how many (``2 N``, fewer when the units are fewer)."""
    count = min(2 * node.verify, len(node.units) * len(node.labels))
    stand_ins = [verify.unit_pass(node.passes[u // len(node.units)], node.write, node.operand,
                                  node.units[u % len(node.units)]) for u in range(count)]
    size = max(1, planner.capacity(stand_ins[:1], state.batch_size, state.cache))
    for start in range(0, count, size):
        units = [_open(dry, pass_, state) for pass_ in stand_ins[start:start + size]]
        dry.calls += 1
        for step in range(len(units[0].pass_.forwards)):
            _dry(dry, planner.fused_stages(units, [], step), units,
                 f"{where} verify ({count} units chosen at run time)")


def _open(dry: _Dry, pass_: Pass, state: WalkState, rows=None, grad: bool = False) -> PassContext:
    return passes.open_pass(None, pass_, state, rows, grad=grad, tokenizer=dry.tokenizer,
                            facts=dry.facts)


def _pass(dry: _Dry, pass_: Pass, state: WalkState, where: str, *, rows=None,
          grad: bool = False) -> None:
    ctx = _open(dry, pass_, state, rows, grad)
    dry.calls += 1
    for forward in pass_.forwards:
        _dry(dry, planner.forward_stages(ctx, forward), [ctx], where)


def _dry(dry: _Dry, stages: Iterable[Stage], units: list[PassContext], where: str) -> None:
    """Each stage's jobs listed, then its keys kept as ``PLANNED``, before the next is planned."""
    for stage in stages:
        dry.found.extend(Planned(where, dry.calls, job) for job in stage.jobs)
        passes.finish(stage, None, units)


def text(found: list[Planned], batch_size: int | None = None,
         resume_mib: int | None = None, memory: Memory | None = None, *,
         fitted: bool = False) -> str:
    """The schedule as ``explain --traces`` prints it: per pass its traces, numbered in run
    order; passes repeating the ones before them (a fit's updates and evals) are counted,
    not listed again; ``fitted``: the plan fits, whose updates are counted to its last epoch.
    With ``memory``, the budget and what each trace adds to the process."""
    budget = RESUME_BUDGET // 2 ** 20 if resume_mib is None else resume_mib
    if memory is not None and resume_mib is None:
        budget = min(RESUME_BUDGET, memory.budget.share(RESUME_SHARE)) // 2 ** 20
    lines = [f"{len(found)} traces (rows per trace: {batch_size or 'all'}; resume budget "
             f"{budget} MiB{'; a fit counted to its last epoch' if fitted else ''})"]
    lines += [*LEGEND, memory.line] if memory is not None else LEGEND
    blocks: list[tuple[str, list]] = []
    calls: list[int] = []
    for planned in found:
        if not calls or calls[-1] != planned.call:
            calls.append(planned.call)
            blocks.append((planned.where, []))
        blocks[-1][1].append(planned.job)
    shapes = [(where, [describe(job, rows=False) for job in jobs]) for where, jobs in blocks]
    number, index = 0, 0
    while index < len(blocks):
        period, times = _repeats(shapes, index)
        for where, jobs in blocks[index:index + period]:
            lines.append(where)
            for job in jobs:
                number += 1
                lines.append(f"  {number}. {describe(job)}{memory.adds(job) if memory else ''}")
        if times > 1:
            more = sum(len(jobs) for _, jobs in blocks[index + period:index + period * times])
            number += more
            lines.append(f"  … the {period} pass{'es' if period > 1 else ''} above "
                         f"{times - 1} more time{'s' if times > 2 else ''} ({more} traces)")
        index += period * times
    return "\n".join(lines + _attribute_costs(found))


def _attribute_costs(found: list[Planned]) -> list[str]:
    """Per attribute step its forwards and its backward passes per metric: one per base
    forward, and with GradDrop one more per layer dropped."""
    costs: dict[str, list[int]] = {}
    for planned in found:
        if planned.job.kind != "attribute":
            continue
        cost = costs.setdefault(planned.where, [0, 0, 0])
        cost[0] += 1
        if planned.job.grad:
            drops = sum(tap.kind == "gate" for tap in planned.job.taps) // 2
            cost[1] += 1 + drops
            cost[2] = drops
    checks = {where: sum(p.where.startswith(f"{where} verify") for p in found) for where in costs}
    return [f"{where}: cost {forwards} forwards, {backwards} backwards per metric"
            + (f" (GradDrop: {drops} layers dropped one at a time)" if drops else "")
            + (f"; verify {checks[where]} traces" if checks[where] else "")
            for where, (forwards, backwards, drops) in costs.items()]


def _repeats(shapes: list, index: int) -> tuple[int, int]:
    """The period (1 to 3 passes) and count of the longest run of repeats from ``index``."""
    best = (1, 1)
    for period in (1, 2, 3):
        times = 1
        pattern = shapes[index:index + period]
        while shapes[index + period * times:index + period * (times + 1)] == pattern:
            times += 1
        if times > 1 and period * times > best[0] * best[1]:
            best = (period, times)
    return best


class Memory(NamedTuple):
    """The memory budget a planned schedule is sized to, and how its lines say it."""

    budget: Budget
    spelled: str

    @property
    def line(self) -> str:
        held = self.budget.held
        return (f"memory budget {self.spelled}; held before any trace ~{memory.gib(held)} "
                f"(weights and runtime); each trace: its estimated peak")

    def adds(self, job: TraceJob) -> str:
        peak = self.budget.held + trace_bytes(job, self.budget.facts, self.budget.itemsize)
        return f"; peak ~{memory.gib(peak)}"


def planned_budget(model: Any, config: Any, text: str | None) -> Memory:
    """The budget ``text`` (None: ``memory.DEFAULT``) measured on this machine's CPU, with
    what a run would hold before any trace: the weights in the run's dtype and the runtime."""
    total = memory.budget_bytes(text, "cpu")
    held = memory.weights_bytes(model.path, model.dtype) + RUNTIME
    spelled = text or f"{memory.DEFAULT} of free memory"
    if text is not None:
        spelled = f"{text} ({memory.gib(total)})" if "%" in text else memory.gib(total)
    return Memory(Budget(total, held, memory.ITEMSIZE.get(model.dtype, 4), ModelFacts.of(config)),
                  spelled)


def explain_traces(plan: Plan, memory_text: str | None = None) -> dict:
    """``causalab explain --traces``: the schedule of a compiled document, as text and data,
    sized to the memory budget ``memory_text`` (None: the default) with each trace's peak."""
    from causalab.models import load_config, load_tokenizer

    model = plan.model or _points(plan)[0].model
    config = load_config(model.path)
    sized = planned_budget(model, config, memory_text)
    found = schedule(plan, config, load_tokenizer(model.path), budget=sized.budget)
    return {"text": text(found, memory=sized, fitted=_fits(plan)),
            "budget": sized.budget.total, "held": sized.budget.held,
            "traces": [{"where": p.where, "pass": p.call, "trace": describe(p.job),
                        "peak": sized.budget.held + trace_bytes(p.job, sized.budget.facts,
                                                                sized.budget.itemsize)}
                       for p in found]}


def _fits(plan: Plan) -> bool:
    """Whether any point of ``plan`` has a fit step."""
    return any(isinstance(node, Fit) or (isinstance(node, Plan) and _fits(node))
               for node in plan.children)
