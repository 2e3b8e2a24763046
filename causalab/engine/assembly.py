"""The pass assembly: what a stage's traces produced, kept; a pass's result; its metric table.

Made from the values the walk's traces returned and the pass's windows; it never opens a
trace and decides nothing about which ones run. A stage's values go where the planner's
stage says: un-intervened reads, whole tensors, prefixes and keys into the document cache,
an intervened forward's reads to its pass (``explain --traces`` keeps none: its runner,
``dry_run.DryRunner``, marks the cache's keys itself). Steps publish and save from a
``PassResult``, fits score it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from causalab.compile.plan import Forward, Pass, ReadOp
from causalab.engine import generate, overflow, tail
from causalab.engine.attribution import patching as attribution
from causalab.engine import windows as window_rules
from causalab.engine.cache import Prefix, whole_id
from causalab.engine.forwards import batch_key, read_key
from causalab.engine.trace_jobs import Stage, Traced, TraceJob
from causalab.engine.metrics import metric_table, score
from causalab.engine.outputs import Published
from causalab.engine.seam import Window, express, gather
from causalab.engine.state import ModelFacts, PassContext, WalkState, Windows
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only: nnterp takes ~6 s to import
    from nnterp import StandardizedTransformer
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class PassResult(Mapping):
    """What one pass produced over its run rows.

    ``reads``: name -> value in its featurizer's space, ``(rows, w, width)`` or flat
    ``(total, width)``; ``layouts``: name -> :class:`Window`; ``metrics``: name -> (values,
    eligible pass-row indices); ``positions``: read name -> provenance; ``rows``: the run
    rows; ``resolved``: the pass's ``Windows`` over all its rows; ``generated``:
    ``"<model>[.<input>].generated"`` -> int64 ``(rows, decode)``. The engine reads its
    attributes; the plan's ``results`` is filled from its mapping view.
    """

    reads: dict
    layouts: dict
    metrics: dict
    positions: dict
    rows: tuple
    resolved: Windows
    generated: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> object:
        if name not in _FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)


_FIELDS = tuple(f.name for f in fields(PassResult))


def open_pass(model: StandardizedTransformer | None, pass_: Pass, state: WalkState, rows=None,
              *, grad: bool = False, tokenizer: PreTrainedTokenizerBase,
              facts: ModelFacts) -> PassContext:
    """A pass over ``rows`` (default: all), its windows resolved with ``tokenizer``; the
    model is absent (None) when nothing runs (``explain --traces``)."""
    run_rows = tuple(range(pass_.rows)) if rows is None else tuple(int(r) for r in rows)
    windows = window_rules.resolve_pass(pass_, tokenizer, state)
    return PassContext(model, pass_, state, run_rows, windows, facts, grad)


def finish(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    """Keep what ``stage``'s traces gave (``traced``, one per job)."""
    _FINISH[stage.kind](stage, traced, units)


def _cat(pieces: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(pieces, 0) if len(pieces) > 1 else pieces[0]


def _prefixes(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    """Each kept need of the stage's jobs, a ``Prefix`` over the windows they ran on."""
    jobs = stage.jobs
    if not jobs:
        return
    windows = tuple(job.rows for job in jobs)
    key = batch_key(jobs[0].batch)
    for need in jobs[0].keep:
        pieces = [done.kept[need] for done in traced]
        units[0].state.cache.prefixes[(key, need)] = Prefix(pieces, windows)


def _keys(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    joined = tail.Keys.joined([done.cache for done in traced])
    units[0].state.cache.keys[batch_key(stage.jobs[0].batch)] = joined


def _reads(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    """Un-intervened reads into the document cache: whole tensors as tapped, gathered reads
    over every row of the fill's batch, and the reads served from a whole tensor."""
    cache = units[0].state.cache
    found = {}
    if stage.jobs:
        batch, every = stage.jobs[0].batch, tuple(range(len(stage.jobs[0].batch.input_ids)))
        for index, tap in enumerate(stage.jobs[0].taps):
            value = _cat([done.values[index] for done in traced])
            if tap.whole:
                cache.wholes[whole_id(batch, tap.op)] = value.detach()
                continue
            windows = units[tap.unit].windows.read(tap.op.name).windows
            counts = window_rules.layout(windows, every, tap.op.pos.ragged).flat_counts
            found[(tap.unit, tap.op.name)] = Published(value, counts, len(every), "none")
        _prefixes(stage, traced, units)
    order = None if stage.host is None else torch.tensor(stage.host, dtype=torch.long)
    for want in stage.wanted:
        if want.whole is not None:
            tensor = cache.wholes[want.whole]
            tensor = tensor if order is None else tensor.index_select(0, order.to(tensor.device))
            got = _from_whole(tensor, units[want.unit], want.read)
        else:
            got = found[(want.unit, want.read.name)]
        cache.reads[want.key] = Published(got.value.detach(), got.counts,
                                          units[0].pass_.rows, "none")


def _from_whole(tensor: torch.Tensor, ctx: PassContext, read: ReadOp) -> Published:
    """``read`` over every row of the pass, gathered from its address's kept whole tensor."""
    windows = ctx.windows.read(read.name).windows
    window = window_rules.layout(windows, range(len(windows)), read.pos.ragged)
    return Published(gather(tensor, read.address, window), window.flat_counts, ctx.pass_.rows,
                     "none")


def _forward(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    """An intervened forward's raw reads, per unit concatenated in its run rows' order."""
    pieces: dict = {}
    for job, done in zip(stage.jobs, traced):
        _keep_written(job, done, units)
        for tap, value in zip(job.taps, done.values):
            if tap.kind == "read":
                pieces.setdefault(tap.unit, {}).setdefault(tap.op.name, []).append(value)
    for unit, own in pieces.items():
        ctx = units[unit]
        ctx.produced.raw.update(_gathered(ctx, stage.forwards[unit], ctx.rows, own))


def _keep_written(job: TraceJob, done: Traced, units: list[PassContext]) -> None:
    """Each write tap's ``seam.Written`` to its pass, with the rows it acted on."""
    for tap, value in zip(job.taps, done.values):
        if tap.kind == "write":
            units[tap.unit].produced.written.setdefault(tap.op.name, []).append((job.rows, value))


def _gathered(ctx: PassContext, forward: Forward, rows: tuple, pieces: dict) -> dict:
    """Per-window raw reads concatenated in ``rows`` order, with their prompt layouts."""
    out = {}
    for read in forward.reads:
        counts = None
        if read.pos.frame != "generated":
            windows = ctx.windows.read(read.name).windows
            counts = window_rules.layout(windows, rows, read.pos.ragged).flat_counts
        out[read.name] = Published(_cat(pieces[read.name]), counts, len(rows), "none")
    return out


def _decode(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    """A greedy decode's raw reads (generated-frame ones stacked per step, still uncut) and
    its ids under ``GENERATED``: to its pass, or into the document cache (``kept``)."""
    ctx, forward = units[0], stage.forwards[0]
    batch = ctx.pass_.inputs[forward.input]
    cache = ctx.state.cache
    rows, pieces, tokens = (), {read.name: [] for read in forward.reads}, []
    for job, done in zip(stage.jobs, traced):
        _keep_written(job, done, units)
    for start in range(0, len(stage.jobs), forward.decode):
        chunk = stage.jobs[start:start + forward.decode]
        per_step = [{tap.op.name: value for tap, value in zip(job.taps, done.values)
                     if tap.kind == "read"} for job, done in zip(chunk, traced[start:])]
        rows += chunk[0].rows
        tokens.append(torch.stack([done.token for done in traced[start:start + len(chunk)]],
                                  1).to(torch.int64))
        for read in forward.reads:
            pieces[read.name].append(_step_value(ctx.pass_, read, per_step, forward.decode))
    out = _gathered(ctx, forward, rows, pieces)
    out[generate.GENERATED] = Published(torch.cat(tokens, 0), None, len(rows), "none")
    if not stage.kept:
        ctx.produced.raw.update(out)
        return
    for read in forward.reads:
        fresh = out[read.name]
        cache.reads[read_key(batch, read, forward.decode)] = Published(
            fresh.value.detach(), fresh.counts, ctx.pass_.rows, "none")
    ids = out[generate.GENERATED]
    cache.generated[(batch_key(batch), forward.decode)] = Published(
        ids.value.detach(), None, ctx.pass_.rows, "none")


def _step_value(pass_: Pass, read: ReadOp, per_step: list, decode: int) -> torch.Tensor:
    """A read's value over a window: its one step, or every step stacked for a later cut."""
    if read.pos.frame != "generated":
        return per_step[0][read.name]
    k = generate.fixed_step(read.pos)
    if k is not None:
        return per_step[k][read.name]
    where = ("interventions", pass_.intervention, "reads", read.name, "pos")
    return generate.stack([per_step[s][read.name] for s in range(decode)], where)


def _serve(stage: Stage, traced: list[Traced], units: list[PassContext]) -> None:
    """Un-intervened forwards' reads taken from the document cache over their run rows."""
    for ctx, forward in zip(units, stage.forwards):
        batch, cache = ctx.pass_.inputs[forward.input], ctx.state.cache
        found = {read.name: cache.reads[read_key(batch, read, forward.decode)]
                 for read in forward.reads}
        if forward.decode:
            found[generate.GENERATED] = cache.generated[(batch_key(batch), forward.decode)]
        every = ctx.rows == tuple(range(ctx.pass_.rows))
        ctx.produced.raw.update({name: value if every else value.slice_rows(ctx.rows)
                        for name, value in found.items()})


_FINISH = {"reads": _reads, "prefix": _prefixes, "keys": _keys, "forward": _forward,
           "decode": _decode, "serve": _serve, "attribute": attribution.keep}


def take_forward(ctx: PassContext, forward: Forward) -> None:
    """The forward's raw reads, a decode's generated frame cut, in their featurizers' spaces."""
    raw = dict(ctx.produced.raw)
    ctx.produced.raw.clear()
    if forward.decode:
        ids = raw.pop(generate.GENERATED).value
        ctx.produced.generated.update({name: ids for name in generate.names(ctx.pass_, forward)})
        raw = _cut_generated(ctx, forward, raw, ids)
    for read in forward.reads:
        ctx.produced.values[read.name] = featurized(raw[read.name], read, ctx.state)


def _cut_generated(ctx: PassContext, forward: Forward, raw: dict, ids: torch.Tensor) -> dict:
    """Resolve each generated-frame read on the continuation and cut its stacked steps."""
    stops = generate.eos_ids(ctx.model)
    cut = dict(raw)
    for read in forward.reads:
        if read.pos.frame != "generated":
            continue
        found = window_rules.resolve_generated(ctx.windows, ctx.pass_, read, ctx.rows,
                                               ids.tolist(), ctx.model.tokenizer, stops)
        if generate.fixed_step(read.pos) is None:
            kept = [window for window, _ in found]
            value = generate.cut(raw[read.name].value, kept, read.pos.ragged)
            counts = Window.from_windows(kept, ragged=read.pos.ragged).flat_counts
            cut[read.name] = Published(value, counts, len(ctx.rows), "none")
    return cut


def featurized(raw: Published, read: ReadOp, state: WalkState) -> Published:
    """A read's raw gathered value expressed in its featurizer's space (float32)."""
    if read.address.component == "input_ids" or read.view == "logits":
        return raw
    featurizer = state.featurizers.get(read.featurizer) if read.featurizer != "identity" else None
    return Published(express(featurizer, raw.value), raw.counts, raw.rows, "none")


def result_of(ctx: PassContext) -> PassResult:
    """The pass's result from its featurized reads; a write that overflowed is refused first."""
    overflow.refuse_overflowed(ctx.pass_, ctx.produced.written)
    rows, windows = ctx.rows, ctx.windows
    reads = {name: published.value for name, published in ctx.produced.values.items()}
    layouts = {}
    for forward in ctx.pass_.forwards:
        for read in forward.reads:
            found = windows.read(read.name).windows
            if read.pos.frame == "generated":
                layouts[read.name] = Window.from_windows([found[r] for r in rows],
                                                         ragged=read.pos.ragged)
            else:
                layouts[read.name] = window_rules.layout(found, rows, read.pos.ragged)
    metrics = {}
    for metric in ctx.pass_.metrics:
        found = windows.read(metric.of).windows
        further = []
        for name in metric.reads:  # each with the rows its own windows placed
            placed = windows.read(name).windows
            further.append((reads[name], [r for r in rows if placed[r]]))
        metrics[metric.name] = score(metric, reads[metric.of], [r for r in rows if found[r]],
                                     further)
    return PassResult(reads, layouts, metrics, dict(windows.provenance), rows, windows,
                      dict(ctx.produced.generated))


def metric_rows(pass_: Pass, result: PassResult, name: str, digest: str,
                saved_as: str) -> list[dict]:
    """The on-disk table of metric ``name`` of a pass result, one object per pass row."""
    metric = next(m for m in pass_.metrics if m.name == name)
    values, eligible = result.metrics[name]
    windows, reasons = result.resolved.read(metric.of)
    positions = windows if pass_.dynamic else None
    return metric_table(metric, values, eligible, positions, reasons, pass_.example_ids,
                        digest, name=saved_as)
