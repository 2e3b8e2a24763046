"""``explain --traces``: the run's own walk through ``DryRunner``, listing the traces it would open.

``DryRunner`` takes the place of ``runner.TraceRunner`` on the same walk (``entry.walk_points``,
``walk``): it records each ``TraceJob`` the planner hands it, where the walk is and which pass
it belongs to, and keeps ``PLANNED`` in the document cache where a run keeps tensors, so the
planner plans the next stage as it would in a run. It reads the model's config and tokenizer,
never its weights, and runs no step body: nothing is published, fitted or written.

Where a run decides from numbers it does not have, it decides so:

* a fit never stops early (``fit.loop`` asked to go on): its updates and evals are listed to
  its last epoch; a run that stops early opens a prefix of them;
* ``verify`` patches its first ``2 N`` units (a run patches the ``N`` largest estimates and
  ``N`` drawn): the same count and shapes, the units' addresses chosen at run time; with a
  ``bound`` that is the first round's, and the rounds after it, which the bound decides, are
  not listed (the step's label says at most how many units they reach);
* a model whose KV cache keeps no keys for some layer runs its last-column forwards (a fit's,
  ``verify``'s) whole in a run, as listed here only when the cache keeps keys for every layer.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from causalab import memory
from causalab.compile.plan import (Attribute, Featurizers, Fit, Forward, ModelRef, Observe, Plan,
                                   Weights)
from causalab.engine import fidelity
from causalab.engine.attribution import edge_step, verify
from causalab.engine import fit as fit_loop
from causalab.engine.budget import RESUME_SHARE, Budget, trace_bytes
from causalab.engine.cache import RESUME_BUDGET, DocumentCache, Prefix, whole_id
from causalab.engine.entry import points_of, receipt, walk_points
from causalab.engine.events import Events
from causalab.engine.forwards import batch_key, read_key
from causalab.engine.trace_jobs import Stage, TraceJob, describe
from causalab.engine.assembly import PassResult
from causalab.engine.runner import FusedRunner, PassRunner
from causalab.engine.state import ModelFacts, PassContext, WalkState

if TYPE_CHECKING:  # annotations only
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

# What the dry runner keeps where a run keeps a tensor: the key is what the planner reads.
PLANNED = "planned"
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


class DryRunner:
    """The walk's runner when nothing runs: each stage's jobs recorded in ``found``, its
    keys kept as ``PLANNED`` before the planner plans the next stage."""

    model = None

    def __init__(self, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.facts = ModelFacts.of(config)
        self.found: list[Planned] = []
        self.where = ""
        self.calls = 0

    def grad(self, enabled: bool) -> contextlib.AbstractContextManager[None]:
        """No trace runs, so no gradient: nothing to switch."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def at(self, where: str) -> Iterator[None]:
        """Passes run inside are listed under ``where``, each one a call of its own."""
        outer, self.where = self.where, where
        self.calls += 1
        try:
            yield
        finally:
            self.where = outer
            self.calls += 1

    def run(self, stages: Iterable[Stage], units: list[PassContext]) -> None:
        for stage in stages:
            self.found.extend(Planned(self.where, self.calls, job) for job in stage.jobs)
            _KEEP[stage.kind](stage, units)

    def take(self, ctx: PassContext, forward: Forward) -> None:
        ctx.produced.raw.clear()

    def result(self, ctx: PassContext) -> PassResult:
        """A result with no value: the step bodies that would read it do not run."""
        return PassResult({}, {}, {}, {}, ctx.rows, ctx.windows)

    def receipt(self, found: fidelity.NoOp, result: PassResult, dtype: str) -> None:
        return None

    def document(self, plan: Plan, directory: Path, out: str) -> list[str]:
        return []

    def featurizers(self, node: Featurizers, state: WalkState) -> None:
        return None

    def built(self, node: object, state: WalkState) -> None:
        return None

    def observe(self, node: Observe, result: PassResult, state: WalkState,
                directory: Path) -> list[str]:
        return []

    def fit(self, node: Fit, state: WalkState, directory: Path,
            run_pass: PassRunner) -> list[str]:
        """The fit's passes in ``fit.loop``'s order, to its last epoch."""
        def update(rows: tuple) -> None:
            with self.at(f"{state.where} update"):
                run_pass(self, node.train, state, rows=rows, grad=True)

        def evaluate(epoch: int) -> bool:
            with self.at(f"{state.where} eval"):
                run_pass(self, node.eval, state)
            return False
        fit_loop.loop(node, update, evaluate)
        return []

    def weights(self, node: Weights, state: WalkState, directory: Path) -> list[str]:
        return []

    def attributed(self, ctx: PassContext, directory: Path) -> list[str]:
        return []

    def verify(self, node: Attribute, run_fused: FusedRunner, directory: Path) -> list[str]:
        """``verify``'s fused exact patches on its first round's units (module docstring)."""
        count = node.verify_round
        run_fused([verify.unit_pass(node.passes[u // len(node.units)], node.write,
                                    node.operand, node.units[u % len(node.units)])
                   for u in range(count)])
        return []

    def edges(self, node: Attribute, state: WalkState, directory: Path) -> list[str]:
        """An edges step's hooked torch forwards (``edge_step.forwards``): no trace, listed."""
        jobs = edge_step.forwards(node, state.batch_size, self.facts)
        self.found.extend(Planned(self.where, self.calls, job) for job in jobs)
        return []


def _keep_reads(stage: Stage, units: list[PassContext]) -> None:
    """A ``reads`` stage's whole tensors, prefixes and wanted reads, kept ``PLANNED``."""
    cache = units[0].state.cache
    if stage.jobs:
        batch = stage.jobs[0].batch
        for tap in stage.jobs[0].taps:
            if tap.whole:
                cache.wholes[whole_id(batch, tap.op)] = PLANNED
        _keep_prefixes(stage, units)
    for want in stage.wanted:
        cache.reads[want.key] = PLANNED


def _keep_prefixes(stage: Stage, units: list[PassContext]) -> None:
    if not stage.jobs:
        return
    windows = tuple(job.rows for job in stage.jobs)
    key = batch_key(stage.jobs[0].batch)
    for need in stage.jobs[0].keep:
        units[0].state.cache.prefixes[(key, need)] = Prefix([None] * len(stage.jobs), windows)


def _keep_keys(stage: Stage, units: list[PassContext]) -> None:
    units[0].state.cache.keys[batch_key(stage.jobs[0].batch)] = PLANNED


def _keep_decoded(stage: Stage, units: list[PassContext]) -> None:
    """An un-intervened decode's ids and reads, kept ``PLANNED`` in the document cache."""
    if not stage.kept:
        return
    ctx, forward = units[0], stage.forwards[0]
    batch, cache = ctx.pass_.inputs[forward.input], ctx.state.cache
    cache.generated[(batch_key(batch), forward.decode)] = PLANNED
    cache.reads.update({read_key(batch, read, forward.decode): PLANNED
                        for read in forward.reads})


def _nothing(stage: Stage, units: list[PassContext]) -> None:
    return None


# stage kind -> what it keeps for later stages (``assembly.finish`` keeps tensors there).
_KEEP = {"reads": _keep_reads, "prefix": _keep_prefixes, "keys": _keep_keys,
         "decode": _keep_decoded, "forward": _nothing, "serve": _nothing,
         "attribute": _nothing}


def schedule(plan: Plan, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase, *,
             batch_size: int | None = None, resume_mib: int | None = None,
             budget: Budget | None = None) -> list[Planned]:
    """Every trace a run of ``plan`` opens, in order (its windows sized to ``budget``): the
    run's walk (``entry.walk_points``) through a ``DryRunner``."""
    runner = DryRunner(config, tokenizer)
    cache = DocumentCache(None if resume_mib is None else resume_mib * 2 ** 20, memory=budget)
    points = points_of(plan)
    ref = plan.model or points[0].model
    receipt(runner, points[0], ref.dtype, points=points, cache=cache, batch_size=batch_size)
    walk_points(runner, points, out=".", batch_size=batch_size, events=Events(), cache=cache)
    return runner.found


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


def planned_budget(model: ModelRef, config: PretrainedConfig, text: str | None) -> Memory:
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
    sized to the memory budget ``memory_text`` (None: the default) with each trace's peak;
    ``jobs`` holds every job's fields (``job_fields``)."""
    from causalab.models.readers import read_config, read_tokenizer

    model = plan.model or points_of(plan)[0].model
    config = read_config(model.path)  # from its files, as compile reads it: no transformers
    sized = planned_budget(model, config, memory_text)
    found = schedule(plan, config, read_tokenizer(model.path), budget=sized.budget)
    return {"text": text(found, memory=sized, fitted=_fits(plan)),
            "budget": sized.budget.total, "held": sized.budget.held,
            "traces": [{"where": p.where, "pass": p.call, "trace": describe(p.job),
                        "peak": sized.budget.held + trace_bytes(p.job, sized.budget.facts,
                                                                sized.budget.itemsize),
                        "job": job_fields(p.job)}
                       for p in found]}


def job_fields(job: TraceJob) -> dict:
    """Every field of ``job`` as JSON data: its batch by role and shape, its ops by name
    and address (the plan's own JSON form)."""
    import dataclasses

    from causalab.compile.plan import plan_to_json

    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name != "batch"}
    batch = job.batch
    return {"batch": {"role": batch.role, "rows": len(batch.input_ids), "tokens": batch.tokens},
            **plan_to_json(fields)}


def _fits(plan: Plan) -> bool:
    """Whether any point of ``plan`` has a fit step."""
    return any(isinstance(node, Fit) or (isinstance(node, Plan) and _fits(node))
               for node in plan.children)
