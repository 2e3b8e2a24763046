"""The runner the walk runs through, and ``TraceRunner``, the only place an nnsight trace opens.

The walk (``causalab.engine.walk``) decides the order of passes and steps; the planner decides
each pass's traces. What happens to a stage of ``TraceJob``s and to a step's body is the
runner's: ``TraceRunner`` binds each job to its tensors, runs it in one ``model.trace`` and
keeps its values (``assembly.finish``), then runs the step bodies (``steps``, ``attribution``,
``verify``, ``edge_step``, ``fidelity``). ``causalab.engine.dry_run.DryRunner`` lists the same
jobs on the same walk without weights (``explain --traces``). This module never decides which
trace runs.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from causalab.compile.plan import Attribute, Featurizers, Fit, Forward, Observe, Pass, Plan, Weights
from causalab.engine import fidelity, record, steps, taps
from causalab.engine.attribution import atp_star, edge_step, patching as attribution, verify
from causalab.engine import assembly
from causalab.engine.generate import GENERATED
from causalab.engine.trace_jobs import JobTap, Need, Stage, Traced, TraceJob
from causalab.engine.assembly import PassResult
from causalab.engine.resume import PART_MODULES, Resume, map_tensors, need_order, need_place
from causalab.engine.seam import apply_write, check_write, gather
from causalab.engine.sites import Places, project_to_vocabulary
from causalab.engine.state import ModelFacts, PassContext, WalkState
from causalab.engine.step_sources import build_from_step
from causalab.engine.taps import Live, PreparedTap
from causalab.files import DOCUMENT
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only: nnterp takes ~6 s to import
    from nnterp import StandardizedTransformer
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

# What a fit or verify step hands back to the walk to run its passes.
PassRunner = Callable[..., PassResult]
FusedRunner = Callable[[list[Pass]], list[PassResult]]


class Runner(Protocol):
    """What the walk runs through: the model's facts and tokenizer, each stage of jobs, and
    the body of each step around its passes. ``at`` names the passes run inside it (the
    walk's place: a point, a step, a fit's update)."""

    model: StandardizedTransformer | None
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    facts: ModelFacts

    def at(self, where: str) -> contextlib.AbstractContextManager[None]: ...
    def grad(self, enabled: bool) -> contextlib.AbstractContextManager[None]: ...
    def run(self, stages: Iterable[Stage], units: list[PassContext]) -> None: ...
    def take(self, ctx: PassContext, forward: Forward) -> None: ...
    def result(self, ctx: PassContext) -> PassResult: ...
    def receipt(self, found: fidelity.NoOp, result: PassResult, dtype: str) -> dict | None: ...
    def document(self, plan: Plan, directory: Path, out: str) -> list[str]: ...
    def featurizers(self, node: Featurizers, state: WalkState) -> None: ...
    def built(self, node: object, state: WalkState) -> None: ...
    def observe(self, node: Observe, result: PassResult, state: WalkState,
                directory: Path) -> list[str]: ...
    def fit(self, node: Fit, state: WalkState, directory: Path,
            run_pass: PassRunner) -> list[str]: ...
    def weights(self, node: Weights, state: WalkState, directory: Path) -> list[str]: ...
    def attributed(self, ctx: PassContext, directory: Path) -> list[str]: ...
    def verify(self, node: Attribute, run_fused: FusedRunner, directory: Path) -> list[str]: ...
    def edges(self, node: Attribute, state: WalkState, directory: Path) -> list[str]: ...


class TraceRunner:
    """The run: each job bound and traced on ``model``, its values kept, each step's body
    run and its files written."""

    def __init__(self, model: StandardizedTransformer) -> None:
        self.model = model
        self.config = model._model.config
        self.tokenizer = model.tokenizer
        self.facts = ModelFacts.of(self.config)

    @contextlib.contextmanager
    def at(self, where: str) -> Iterator[None]:
        yield

    def grad(self, enabled: bool) -> contextlib.AbstractContextManager[None]:
        """Autograd on or off for the traces run inside."""
        return torch.set_grad_enabled(enabled)

    def run(self, stages: Iterable[Stage], units: list[PassContext]) -> None:
        """Each stage's jobs bound and traced in order, then its values kept, before the
        planner plans the next stage."""
        for stage in stages:
            traced, carry = [], None
            for job in stage.jobs:
                live = taps.bind(job, units, carry)
                traced.append(run_trace(self.model, job, live))
                carry = taps.carried(live, traced[-1]) if job.step is not None else None
            assembly.finish(stage, traced, units)

    def take(self, ctx: PassContext, forward: Forward) -> None:
        assembly.take_forward(ctx, forward)

    def result(self, ctx: PassContext) -> PassResult:
        return assembly.result_of(ctx)

    def receipt(self, found: fidelity.NoOp, result: PassResult, dtype: str) -> dict | None:
        return fidelity.check(self.model, found, result, dtype)

    def document(self, plan: Plan, directory: Path, out: str) -> list[str]:
        if plan.directory and plan.document is not None:
            return [record.write_json(directory / DOCUMENT, plan.document, root=out)]
        return []

    def featurizers(self, node: Featurizers, state: WalkState) -> None:
        steps.build_featurizers(node, self.model, state)

    def built(self, node: object, state: WalkState) -> None:
        build_from_step(node, state)

    def observe(self, node: Observe, result: PassResult, state: WalkState,
                directory: Path) -> list[str]:
        return steps.finish_observe(node, result, state, directory)

    def fit(self, node: Fit, state: WalkState, directory: Path,
            run_pass: PassRunner) -> list[str]:
        return steps.run_fit_step(node, self, state, directory, run_pass)

    def weights(self, node: Weights, state: WalkState, directory: Path) -> list[str]:
        return steps.run_weights(node, state, directory)

    def attributed(self, ctx: PassContext, directory: Path) -> list[str]:
        return attribution.publish(ctx, directory)

    def verify(self, node: Attribute, run_fused: FusedRunner, directory: Path) -> list[str]:
        return verify.publish(node, run_fused, directory)

    def edges(self, node: Attribute, state: WalkState, directory: Path) -> list[str]:
        return edge_step.run(node, self.model, directory, state.batch_size)


def run_trace(model: StandardizedTransformer, job: TraceJob, live: Live) -> Traced:
    """One nnterp trace of ``job`` bound to ``live``: the blocks before its entry skipped,
    its taps in order, its kept needs taken, a decode step's next token chosen, stopped
    after its last tap when the planner said so."""
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
        found["taps"] = _issue(places, job, live.prepared)
        if job.step is not None:
            # A write at ``logits`` chooses the next token; the model's own output lacks it.
            logits = places.written_logits
            logits = model.output.logits if logits is None else logits
            found[GENERATED] = logits[:, -1].argmax(-1)
        if job.stop:
            tracer.stop()
    values, kept = found["taps"]
    return Traced(values, kept, found.get(GENERATED), live.cache if job.kind == "keys" else None)


def _skip(model: StandardizedTransformer, entry: Resume, values: dict) -> None:
    # Earlier blocks' outputs feed only skipped blocks; any tensor of the shape will do.
    for layer in range(entry.layer):
        model.layers[layer].skip(values[entry.layer - 1])
    for part in entry.parts:
        getattr(model, PART_MODULES[part])[entry.layer].skip(values[(entry.layer, part)])


def _issue(places: Places, job: TraceJob,
           prepared: tuple[PreparedTap, ...]) -> tuple[tuple, dict]:
    """The job's taps in its order, writes at an address before its reads; a kept need is
    taken before the taps at its place or later. Returns per tap its value (a write's
    ``seam.Written``) and per need its value."""
    waiting = sorted(job.keep, key=need_order)
    values, kept = [], {}
    for tap, entry in zip(job.taps, prepared):
        while waiting and need_place(waiting[0]) <= tuple(tap.op.address.order):
            need = waiting.pop(0)
            kept[need] = _kept_value(places.model, need)
        places.settle(tap.op.address.order)
        values.append(_tap(places, tap, entry))
    for need in waiting:
        kept[need] = _kept_value(places.model, need)
    places.settle()
    return tuple(values), kept


def _tap(places: Places, tap: JobTap, entry: PreparedTap) -> object:
    """One tap of a kind of ``trace_jobs.TAPS`` at its address; what it gives back (a write: the
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
        return check_write(activation, written, address, entry.window, original)
    if tap.kind == "shift":
        leaf = torch.zeros_like(activation).requires_grad_(True)
        places.put(address, activation + leaf)
        return activation.detach().clone(), leaf
    if tap.kind == "gate":
        places.put(address, atp_star.gate(activation, entry.operand, address.layer))
        return None
    if tap.whole:
        # Kept past this forward: a copy, safe from any in-place update after the tap.
        return activation.detach().clone()
    value = gather(activation, address, entry.window)
    return project_to_vocabulary(places.model, value) if op.view == "logits" else value


def _kept_value(model: StandardizedTransformer, need: Need) -> object:
    """A copy of the value a prefix need names, inside a running trace: the residual
    leaving block ``need``, or the raw output of a block's part ``(layer, part)``."""
    if isinstance(need, int):
        return model.layers_output[need].detach().clone()
    return map_tensors(getattr(model, PART_MODULES[need[1]])[need[0]].output,
                       lambda tensor: tensor.detach().clone())
