"""The walk: a plan tree run in written order through a runner, pass by pass, forward by forward.

It turns plan data into the order things happen in. A pass runs forward by forward: the
planner (``causalab.engine.planner``) says which traces each forward takes, as plain
``TraceJob``s in stages; the runner (``causalab.engine.runner``) runs them and keeps their
values, and runs each step's body. The same walk runs a document (``TraceRunner``, on nnterp)
and lists its traces without weights (``dry_run.DryRunner``, ``explain --traces``), so the
two cannot differ. It never reads a document, a data table or a config, opens no trace and
makes no speed decision of its own. Sweep points the planner finds alike run their passes
side by side first (``prefetch``), each point's result waiting in the document cache for its
walk.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from causalab.compile.plan import Attribute, Featurizers, Fit, Observe, Pass, Plan, Weights
from causalab.engine import containment, planner
from causalab.engine.attribution import patching as attribution, verify
from causalab.engine.cache import DocumentCache
from causalab.engine.events import Events
from causalab.engine.assembly import PassResult, open_pass
from causalab.engine.runner import Runner, TraceRunner
from causalab.engine.state import PassContext, WalkState, new_state
from causalab.errors import RunError

if TYPE_CHECKING:  # annotations only: nnterp takes ~6 s to import
    from nnterp import StandardizedTransformer

PlanNode = Plan | Featurizers | Observe | Fit | Weights | Attribute


def run_plan(plan: Plan, model: StandardizedTransformer, *, out: str,
             batch_size: int | None = None, events: Events | None = None,
             cache: DocumentCache | None = None) -> list[str]:
    """Walk ``plan`` on ``model`` and write its saves under ``out``; the written paths in
    order. ``cache`` carries the un-intervened-forward cache across a document's points."""
    return walk_plan(plan, TraceRunner(model), out=out, batch_size=batch_size, events=events,
                     cache=cache)


def walk_plan(plan: Plan, runner: Runner, *, out: str, batch_size: int | None = None,
              events: Events | None = None, state: WalkState | None = None,
              cache: DocumentCache | None = None) -> list[str]:
    """Walk ``plan`` through ``runner``; returns the written paths in order.

    A nested plan (a sweep point or a list entry) gets its own outputs namespace and
    directory; featurizers built by a plan are shared live by the steps (and list entries)
    beneath it.
    """
    events = events or Events()
    if state is None:
        state = dataclasses.replace(new_state(cache=cache, model_ref=plan.model,
                                              digest=plan.digest or ""), point=plan,
                                    where=plan.name)
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
    written = runner.document(plan, directory, out)
    for node in plan.children:
        place = f"{state.where}/{node.name}" if state.where else node.name
        with runner.at(place):
            written += _run_node(node, runner, dataclasses.replace(state, where=place), out,
                                 directory)
        runner.built(node, state)
    return written


def _run_node(node: PlanNode, runner: Runner, state: WalkState, out: str,
              directory: Path) -> list[str]:
    if isinstance(node, Plan):
        return walk_plan(node, runner, out=out, batch_size=state.batch_size,
                         events=state.events, state=state)
    if isinstance(node, Featurizers):
        runner.featurizers(node, state)
        return []
    if isinstance(node, Observe):
        result = state.cache.take_prefetched(node.pass_)
        if result is None:
            result = pass_on(runner, node.pass_, state, batch_size=state.batch_size)
        return runner.observe(node, result, state, directory)
    if isinstance(node, Fit):
        # A fit runs its passes again every update: their frozen prefixes are worth keeping.
        each = functools.partial(pass_on, batch_size=state.batch_size, fill_prefixes=True)
        return runner.fit(node, state, directory, each)
    if isinstance(node, Weights):
        return runner.weights(node, state, directory)
    if isinstance(node, Attribute):
        return _attribute(node, runner, state, directory)
    raise RunError((getattr(node, "name", type(node).__name__),), "unknown plan node")


def _attribute(node: Attribute, runner: Runner, state: WalkState,
               directory: Path) -> list[str]:
    """An attribute step: the planner's traces, each kept (its gradients taken) by the
    attribution before the next runs, then its tables; ``edges: true`` scores edges instead."""
    if node.circuit_k is not None:
        return runner.edges(node, state, directory)
    ctx = attribution.open_step(_open(runner, node.passes[0], state), node, runner.tokenizer)
    with runner.grad(False):
        runner.run(planner.attribute_stages(ctx, node), [ctx])
    written = runner.attributed(ctx, directory)
    if node.verify:
        where = f"{state.where} verify ({verify.planned(node)} chosen at run time)"
        written += runner.verify(
            node, lambda ps: run_fused(runner, ps, state, where, last_column=True), directory)
    return written


def _open(runner: Runner, pass_: Pass, state: WalkState, rows=None,
          grad: bool = False) -> PassContext:
    return open_pass(runner.model, pass_, state, rows, grad=grad, tokenizer=runner.tokenizer,
                     facts=runner.facts)


def run_fused(runner: Runner, passes_: list[Pass], state: WalkState, where: str = "", *,
              last_column: bool = False) -> list[PassResult]:
    """Passes of one shape run as an exact sweep's fused points are, each forward together;
    with ``last_column`` (``verify``) a forward tapping the last column alone runs that
    column alone over kept keys (``planner.fused_stages``). The first run of passes fills
    the un-intervened values the later runs take too (as ``prefetch``'s ``ahead``)."""
    size = max(1, planner.capacity(passes_[:1], state.batch_size, state.cache))
    results = []
    for start in range(0, len(passes_), size):
        with runner.at(where):
            units = [_open(runner, pass_, state) for pass_ in passes_[start:start + size]]
            later = [_open(runner, pass_, state) for pass_ in passes_[size:]] if not start else []
            with runner.grad(False):
                for step in range(len(units[0].pass_.forwards)):
                    runner.run(planner.fused_stages(units, later, step,
                                                    last_column=last_column), units + later)
                    for ctx in units:
                        runner.take(ctx, ctx.pass_.forwards[step])
            results += [runner.result(ctx) for ctx in units]
    return results


def prefetch(points: list[Plan], runner: Runner, *, batch_size: int | None = None,
             cache: DocumentCache, ahead: list[Plan] = ()) -> None:
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
    states, later_states = (_states(group, cache, batch_size) for group in (points, ahead))
    where = f"fused {len(points)} points ({points[0].name} … {points[-1].name})"
    kept = []
    try:
        for index in range(len(points[0].children)):
            with runner.at(f"{where} / {points[0].children[index].name}"):
                units = [_open(runner, point.children[index].pass_, state)
                         for point, state in zip(points, states)]
                later = [_open(runner, point.children[index].pass_, state)
                         for point, state in zip(ahead, later_states)]
                with runner.grad(False):
                    for step in range(len(units[0].pass_.forwards)):
                        runner.run(planner.fused_stages(units, later, step), units + later)
                        for ctx in units:
                            runner.take(ctx, ctx.pass_.forwards[step])
                    results = [runner.result(ctx) for ctx in units]
            for ctx, result in zip(units, results):
                kept.append(ctx.pass_)
                cache.keep_prefetched(ctx.pass_, result)
    except Exception:
        for pass_ in kept:
            cache.drop_prefetched(pass_)


def _states(points: list[Plan], cache: DocumentCache, batch_size: int | None) -> list[WalkState]:
    return [WalkState(cache=cache, model_ref=point.model, digest=point.digest or "",
                      point=point, batch_size=batch_size) for point in points]


class Riding(NamedTuple):
    """The fidelity receipt's pass over every row, and the first fused points' (``units``)
    and their later alike points' (``later``) first passes, whose fill it rides."""

    receipt: PassContext
    units: list[PassContext]
    later: list[PassContext]


def riding(runner: Runner, every: Pass, points: list[Plan], ahead: list[Plan], *,
           cache: DocumentCache, batch_size: int | None) -> Riding | None:
    """The receipt's pass ``every`` opened beside the first passes of ``points`` (the run's
    first fused group) and ``ahead``, when it rides their fill (``planner.receipt_rides``)."""
    if len(points) < 2:
        return None
    units, later = ([_open(runner, point.children[0].pass_, state)
                     for point, state in zip(group, _states(group, cache, batch_size))]
                    for group in (points, ahead))
    receipt = _open(runner, every, new_state(cache=cache))
    return Riding(receipt, units, later) if planner.receipt_rides(receipt, units, later) else None


def ride(runner: Runner, found: Riding) -> PassResult:
    """The fill with the receipt's read in its trace, then the receipt's pass served from
    the document cache: the points' prefetch finds their un-intervened values kept."""
    with runner.grad(False):
        runner.run(planner.receipt_stages(*found), [*found.units, *found.later, found.receipt])
    return pass_on(runner, found.receipt.pass_, found.receipt.state)


def discard_prefetched(point: Plan, cache: DocumentCache) -> None:
    """Drop what ``prefetch`` left for ``point`` and its walk did not take (it raised first)."""
    for node in point.children:
        if hasattr(node, "pass_"):
            cache.drop_prefetched(node.pass_)


def run_pass(model: StandardizedTransformer, pass_: Pass, state: WalkState | None, *,
             rows=None, batch_size: int | None = None, grad: bool = False,
             fill_prefixes: bool = False) -> PassResult:
    """``pass_on`` with the run's own runner on ``model``."""
    return pass_on(TraceRunner(model), pass_, state, rows=rows, batch_size=batch_size,
                   grad=grad, fill_prefixes=fill_prefixes)


def pass_on(runner: Runner, pass_: Pass, state: WalkState | None, *, rows=None,
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
    ctx = _open(runner, pass_, state, rows, grad)
    with runner.grad(grad):
        for forward in pass_.forwards:
            runner.run(planner.forward_stages(ctx, forward), [ctx])
            runner.take(ctx, forward)
        return runner.result(ctx)
