"""The walk: a plan tree run in written order on nnterp, and ``run_trace``, the only place a trace opens.

It turns plan data into tensors. A pass runs forward by forward: the planner
(``causalab.engine.planner``) says which traces each forward takes, as plain ``TraceJob``s in
stages; the walk binds each job to its tensors (``taps.bind``) and runs it through
``run_trace`` (writes through the seam's one ``apply_write``, reads through its one
``gather``); the pass assembly (``causalab.engine.assembly``) keeps each stage's values and
makes the pass's result. An attribute step runs the same way, its traces kept by
``causalab.engine.attribution.patching``. It never reads a document, a data table or a config, and
makes no speed decision of its own. Sweep points the planner finds alike run their passes
side by side first (``prefetch``), each point's result waiting in the document cache for its
walk.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Iterable

import torch

from causalab.compile.plan import Attribute, Featurizers, Fit, Observe, Pass, Plan, Weights
from causalab.engine import containment, planner, record, steps, taps
from causalab.engine.attribution import atp_star, edge_step, patching as attribution, verify
from causalab.engine import assembly as passes
from causalab.engine.cache import DocumentCache
from causalab.engine.events import Events
from causalab.engine.generate import GENERATED
from causalab.engine.trace_jobs import JobTap, Stage, Traced, TraceJob
from causalab.engine.assembly import PassResult
from causalab.engine.resume import PART_MODULES, Resume, map_tensors, need_order, need_place
from causalab.engine.seam import apply_write, check_write, gather
from causalab.engine.sites import Places, project_to_vocabulary
from causalab.engine.state import PassContext, WalkState, new_state
from causalab.engine.step_sources import build_from_step
from causalab.engine.taps import PreparedTap
from causalab.errors import RunError
from causalab.files import DOCUMENT


def run_plan(plan: Plan, model: Any, *, out: str, batch_size: int | None = None,
             events: Events | None = None, state: WalkState | None = None,
             cache: DocumentCache | None = None) -> list[str]:
    """Walk ``plan`` and write its saves under ``out``; returns the written paths in order.

    A nested plan (a sweep point or a list entry) gets its own outputs namespace and
    directory; featurizers built by a plan are shared live by the steps (and list entries)
    beneath it. ``cache`` carries the un-intervened-forward cache across the points of one
    document.
    """
    events = events or Events()
    if state is None:
        state = dataclasses.replace(new_state(cache=cache, model_ref=plan.model,
                                              digest=plan.digest or ""), point=plan)
    else:
        # A list-intervention entry (no digest, no document of its own) names its step's
        # events "<step>/<entry>", so sibling entries' metrics stay apart.
        entry = plan.name if plan.digest is None and plan.document is None else None
        state = dataclasses.replace(state, published=dict(state.published), windows={},
                                    digest=plan.digest or state.digest,
                                    model_ref=plan.model or state.model_ref, entry=entry)
    state = dataclasses.replace(state, events=events, batch_size=batch_size)
    directory = Path(out) / plan.directory
    containment.inside(out, directory)
    written: list[str] = []
    if plan.directory and plan.document is not None:
        written.append(record.write_json(directory / DOCUMENT, plan.document, root=out))
    for node in plan.children:
        written += _run_node(node, model, state, out, directory)
        build_from_step(node, state)
    return written


def _run_node(node: Any, model: Any, state: WalkState, out: str, directory: Path) -> list[str]:
    if isinstance(node, Plan):
        return run_plan(node, model, out=out, batch_size=state.batch_size,
                        events=state.events, state=state)
    if isinstance(node, Featurizers):
        steps.build_featurizers(node, model, state)
        return []
    if isinstance(node, Observe):
        result = state.cache.take_prefetched(node.pass_)
        if result is None:
            result = run_pass(model, node.pass_, state, batch_size=state.batch_size)
        return steps.finish_observe(node, result, state, directory)
    if isinstance(node, Fit):
        # A fit runs its passes again every update: their frozen prefixes are worth keeping.
        runner = functools.partial(run_pass, batch_size=state.batch_size, fill_prefixes=True)
        return steps.run_fit_step(node, model, state, directory, runner)
    if isinstance(node, Weights):
        return steps.run_weights(node, state, directory)
    if isinstance(node, Attribute):
        return _attribute(node, model, state, directory)
    raise RunError((getattr(node, "name", type(node).__name__),), "unknown plan node")


def _attribute(node: Attribute, model: Any, state: WalkState, directory: Path) -> list[str]:
    """An attribute step: the planner's traces, each kept (its gradients taken) by the
    attribution before the next runs, then its tables; ``edges: true`` scores edges instead."""
    if node.circuit_k is not None:
        return edge_step.run(node, model, directory, state.batch_size)
    ctx = attribution.open_step(passes.open_pass(model, node.passes[0], state), node)
    with torch.no_grad():
        _run_stages(model, planner.attribute_stages(ctx, node), [ctx])
    written = attribution.publish(ctx, directory)
    if node.verify:
        written += verify.publish(node, lambda ps: run_fused(model, ps, state), directory)
    return written


def run_fused(model: Any, passes_: list[Pass], state: WalkState) -> list[PassResult]:
    """Passes of one shape run as an exact sweep's fused points are, each forward together."""
    size = max(1, planner.capacity(passes_[:1], state.batch_size, state.cache))
    results = []
    for start in range(0, len(passes_), size):
        units = [passes.open_pass(model, pass_, state) for pass_ in passes_[start:start + size]]
        with torch.no_grad():
            for step in range(len(units[0].pass_.forwards)):
                _run_stages(model, planner.fused_stages(units, [], step), units)
                for ctx in units:
                    passes.take_forward(ctx, ctx.pass_.forwards[step])
        results += [passes.result_of(ctx) for ctx in units]
    return results


def prefetch(points: list, model: Any, *, batch_size: int | None = None,
             cache: DocumentCache, ahead: list = ()) -> None:
    """Run the passes of ``points`` (one ``planner.groups`` run) side by side, forward by
    forward (``planner.fused_stages``); a point's results wait in ``cache`` for its own
    walk, which then runs no forward of its own. The prompt values that the ``ahead``
    points (later runs of this signature) take from the cache are computed in the same
    traces.

    A failure leaves nothing behind: the points then run one at a time, and a point's own
    error is met on its own walk, at its own path, as if fusion had never been tried.
    """
    if len(points) < 2:
        return
    states, later_states = ([WalkState(cache=cache, model_ref=point.model,
                                       digest=point.digest or "", point=point,
                                       batch_size=batch_size) for point in group]
                            for group in (points, ahead))
    kept = []
    try:
        for index in range(len(points[0].children)):
            units = [passes.open_pass(model, point.children[index].pass_, state)
                     for point, state in zip(points, states)]
            later = [passes.open_pass(model, point.children[index].pass_, state)
                     for point, state in zip(ahead, later_states)]
            with torch.no_grad():
                for step in range(len(units[0].pass_.forwards)):
                    _run_stages(model, planner.fused_stages(units, later, step), units + later)
                    for ctx in units:
                        passes.take_forward(ctx, ctx.pass_.forwards[step])
                results = [passes.result_of(ctx) for ctx in units]
            for ctx, result in zip(units, results):
                kept.append(ctx.pass_)
                cache.keep_prefetched(ctx.pass_, result)
    except Exception:
        for pass_ in kept:
            cache.drop_prefetched(pass_)


def discard_prefetched(point: Plan, cache: DocumentCache) -> None:
    """Drop what ``prefetch`` left for ``point`` and its walk did not take (it raised first)."""
    for node in point.children:
        if hasattr(node, "pass_"):
            cache.drop_prefetched(node.pass_)


def run_pass(model: Any, pass_: Pass, state: WalkState | None, *, rows=None,
             batch_size: int | None = None, grad: bool = False,
             fill_prefixes: bool = False) -> PassResult:
    """Every forward of ``pass_`` over ``rows`` (default: all), then its metrics.

    ``batch_size`` (default: the walk state's) cuts ``rows`` into windows, one trace each.
    With ``grad`` the graph through featurizer parameters is kept (a fit's update). With
    ``fill_prefixes`` (a fit) an intervened forward that can resume first keeps its
    un-intervened prefix over every row, so this and later runs skip it, a minibatch taking
    its rows out of it; without, it resumes only from a prefix already kept, over exactly
    the rows it was computed on.
    """
    state = state if state is not None else new_state()
    if batch_size is not None:
        # The argument wins over the walk's own setting; a copy, so the caller's state keeps it.
        state = dataclasses.replace(state, batch_size=batch_size)
    if fill_prefixes:
        state = dataclasses.replace(state, fill_prefixes=True)
    ctx = passes.open_pass(model, pass_, state, rows, grad=grad)
    with torch.set_grad_enabled(grad):
        for forward in pass_.forwards:
            _run_stages(model, planner.forward_stages(ctx, forward), [ctx])
            passes.take_forward(ctx, forward)
        return passes.result_of(ctx)


def _run_stages(model: Any, stages: Iterable[Stage], units: list[PassContext]) -> None:
    """Each stage's jobs bound and traced in order, then its values kept, before the
    planner plans the next stage."""
    for stage in stages:
        traced, carry = [], None
        for job in stage.jobs:
            live = taps.bind(job, units, carry)
            traced.append(run_trace(model, dataclasses.replace(job, live=live)))
            carry = taps.carried(live, traced[-1]) if job.step is not None else None
        passes.finish(stage, traced, units)


def run_trace(model: Any, job: TraceJob) -> Traced:
    """One nnterp trace of a bound ``job``: the blocks before its entry skipped, its taps
    in order, its kept needs taken, a decode step's next token chosen, stopped after its
    last tap when the planner said so."""
    live = job.live
    nested = frozenset(tap.op.address.layer for tap in job.taps if tap.op.address.key_axis)
    # Without a cache of ours the model would build and fill one nobody reads (on SmolLM2
    # the keys and values of a fused trace are ~0.8 GB).
    kwargs = ({"use_cache": False} if live.cache is None
              else {"cache": live.cache, "use_cache": True})
    if job.head != "all":
        kwargs["logits_to_keep"] = 1
    head_rows = live.inputs["input_ids"].shape[0] if job.head == "last" else None
    places = Places(model, nested, head_rows)
    found: dict = {}  # what the body computes comes back through an object made outside it
    with torch.set_grad_enabled(job.grad), model.trace(
            live.inputs, position_ids=live.position_ids, **kwargs) as tracer:
        if job.resume is not None:
            _skip(model, job.resume, live.resume)
        found["taps"] = _issue(places, job)
        if job.step is not None:
            # A write at ``logits`` chooses the next token; the model's own output lacks it.
            logits = places.written_logits
            logits = model.output.logits if logits is None else logits
            found[GENERATED] = logits[:, -1].argmax(-1)
        if job.stop:
            tracer.stop()
    values, kept = found["taps"]
    return Traced(values, kept, found.get(GENERATED), live.cache if job.kind == "keys" else None)


def _skip(model: Any, entry: Resume, values: dict) -> None:
    # Earlier blocks' outputs feed only skipped blocks; any tensor of the shape will do.
    for layer in range(entry.layer):
        model.layers[layer].skip(values[entry.layer - 1])
    for part in entry.parts:
        getattr(model, PART_MODULES[part])[entry.layer].skip(values[(entry.layer, part)])


def _issue(places: Places, job: TraceJob) -> tuple[tuple, dict]:
    """The job's taps in its order, writes at an address before its reads; a kept need is
    taken before the taps at its place or later. Returns per tap its value (a write's
    ``seam.Written``) and per need its value."""
    waiting = sorted(job.keep, key=need_order)
    values, kept = [], {}
    for tap, entry in zip(job.taps, job.live.prepared):
        while waiting and need_place(waiting[0]) <= tuple(tap.op.address.order):
            need = waiting.pop(0)
            kept[need] = _kept_value(places.model, need)
        places.settle(tap.op.address.order)
        values.append(_tap(places, tap, entry))
    for need in waiting:
        kept[need] = _kept_value(places.model, need)
    places.settle()
    return tuple(values), kept


def _tap(places: Places, tap: JobTap, entry: PreparedTap) -> Any:
    """One tap of a kind of ``jobs.TAPS`` at its address; what it gives back (a write: the
    positions it made non-finite, ``seam.Written``)."""
    op, address = tap.op, tap.op.address
    if tap.kind == "replace":
        places.put(address, entry.operand)
        return None
    activation = places.get(address)
    if tap.kind == "write":
        original = places.original[(address.component, address.layer)]
        written = apply_write(activation, op, entry.window, entry.featurizer, entry.operand,
                              original)
        places.put(address, written)
        return check_write(activation, written, address, entry.window)
    if tap.kind == "shift":
        leaf = torch.zeros_like(activation).requires_grad_(True)
        places.put(address, activation + leaf)
        return activation.detach().clone(), leaf
    if tap.kind == "gate":
        places.put(address, atp_star.Gate.apply(activation, entry.operand, address.layer))
        return None
    if tap.whole:
        # Kept past this forward: a copy, safe from any in-place update after the tap.
        return activation.detach().clone()
    value = gather(activation, address, entry.window)
    return project_to_vocabulary(places.model, value) if op.view == "logits" else value


def _kept_value(model: Any, need: Any) -> Any:
    """A copy of the value a prefix need names, inside a running trace: the residual
    leaving block ``need``, or the raw output of a block's part ``(layer, part)``."""
    if isinstance(need, int):
        return model.layers_output[need].detach().clone()
    return map_tensors(getattr(model, PART_MODULES[need[1]])[need[0]].output,
                       lambda tensor: tensor.detach().clone())
