"""Binding a trace job to its tensors: input ids, each tap's window, featurizer and operand,
the kept prefix it resumes from and the KV cache it runs over.

Lookups only, made just before the walk runs the job: every decision was the planner's
(``causalab.engine.planner``), and this module never opens a trace. A tap's window is the
pass's resolved window over the job's rows, moved to its stacked copy, to column 0 of a
last-column trace, or to the step's last index in a decode.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from causalab.compile.plan import PromptBatch, WriteOp
from causalab.document import vocab
from causalab.engine import tail
from causalab.engine.attribution import patching as attribution
from causalab.engine import windows as window_rules
from causalab.engine.forwards import batch_key
from causalab.engine.trace_jobs import JobTap, Traced, TraceJob
from causalab.engine.resume import map_tensors
from causalab.engine.mechanisms import Operand
from causalab.engine.seam import Featurizer, Window
from causalab.engine.state import PassContext
from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from nnterp import StandardizedTransformer
    from transformers import Cache


class PreparedTap(NamedTuple):
    """A tap's live half: its window over the trace's batch rows (None for a whole tensor)
    and, for a write, its featurizer (None: identity) and operand."""

    window: Window | None
    featurizer: Featurizer | None = None
    operand: Operand = None


class Live(NamedTuple):
    """What a bound job runs with: the model inputs, per tap a ``PreparedTap``, per need of
    its entry the kept value, and the KV cache it runs over (None: it keeps none)."""

    inputs: dict
    position_ids: torch.Tensor
    prepared: tuple[PreparedTap, ...]
    resume: dict | None
    cache: Cache | None


def bind(job: TraceJob, units: list[PassContext], carry: Live | None = None) -> Live:
    """``job``'s tensors; a decode step after the first continues from ``carry`` (the step
    before it, its next token appended)."""
    first = units[0]
    if job.step:
        inputs, position_ids, cache = carry.inputs, carry.position_ids, carry.cache
    else:
        inputs, position_ids = _inputs(first, job)
        cache = _cache(first, job)
    width = inputs["input_ids"].shape[1]
    prepared = tuple(_prepared(job, tap, units, width) for tap in job.taps)
    return Live(inputs, position_ids, prepared, _resume(first, job), cache)


def carried(live: Live, traced: Traced) -> Live:
    """The next decode step's inputs: the token this one chose, fed over its cache."""
    mask = live.inputs["attention_mask"]
    inputs = {"input_ids": traced.token[:, None],
              "attention_mask": torch.cat([mask, torch.ones_like(mask[:, :1])], 1)}
    return Live(inputs, live.position_ids[:, -1:] + 1, (), None, live.cache)


def _inputs(ctx: PassContext, job: TraceJob) -> tuple[dict, torch.Tensor]:
    inputs, position_ids = prompt_inputs(ctx.model, job.batch, job.rows, ctx.state.cache.inputs)
    if job.copies > 1:
        inputs = {key: tensor.repeat(job.copies, 1) for key, tensor in inputs.items()}
        position_ids = position_ids.repeat(job.copies, 1)
    if job.kind == "keys":
        return {name: tensor[:, :-1] for name, tensor in inputs.items()}, position_ids[:, :-1]
    if job.tail:
        return ({"input_ids": inputs["input_ids"][:, -1:],
                 "attention_mask": inputs["attention_mask"]}, position_ids[:, -1:])
    return inputs, position_ids


def _cache(ctx: PassContext, job: TraceJob) -> Cache | None:
    if job.tail:
        return ctx.state.cache.keys[batch_key(job.batch)].cache(job.rows, ctx.model,
                                                                 job.copies)
    if job.kind in ("keys", "decode"):
        return tail.kv_cache(ctx.model)
    return None


def _resume(ctx: PassContext, job: TraceJob) -> dict | None:
    """The kept values ``job``'s entry takes over its rows: stacked for its copies, cut to
    the last column for a last-column trace."""
    if job.resume is None:
        return None
    key, values = batch_key(job.batch), {}
    for need in job.resume.needs():
        value = ctx.state.cache.prefixes[(key, need)].rows(
            job.rows, any_rows=ctx.state.fill_prefixes)
        if job.copies > 1:
            value = map_tensors(value, _stacked(job.copies))
        values[need] = tail.last_of(value) if job.tail else value
    return values


def _stacked(copies: int):
    """Repeat a kept tensor for ``copies`` stacked points (rows first)."""
    return lambda tensor: tensor.repeat(copies, *([1] * (tensor.dim() - 1)))


def _prepared(job: TraceJob, tap: JobTap, units: list[PassContext], width: int) -> PreparedTap:
    ctx, op = units[tap.unit], tap.op
    if tap.kind == "replace":
        return PreparedTap(None, operand=attribution.interpolated(ctx, op.step))
    if tap.kind == "gate":
        return PreparedTap(None, operand=ctx.attributed.dropped)
    if tap.whole:
        return PreparedTap(None)
    if op.pos.frame == "generated":
        # The step's last index: the position whose logits choose its token.
        window = Window.from_windows([(width - 1,)] * len(job.rows))
    else:
        windows = ctx.windows.of(tap.kind, op.name, job.batch.role).windows
        window = window_rules.layout(windows, job.rows, op.pos.ragged)
    placed = window
    if tap.slot:
        placed = Window(window.batch_rows + tap.slot * len(job.rows), window.positions,
                        window.width, window.counts)
    if job.tail or (job.head == "last" and op.address.component in vocab.FROM_LOGITS):
        placed = tail.moved(placed)
    if tap.kind != "write":
        return PreparedTap(placed)
    featurizer = ctx.state.featurizers.get(op.featurizer) if op.featurizer != "identity" else None
    return PreparedTap(placed, featurizer, _operand(op, ctx, job.rows, window))


def _operand(write: WriteOp, ctx: PassContext, chunk: tuple, window: Window) -> Operand:
    operand = write.operand
    if operand.kind == "literal":
        return operand.value
    if operand.kind == "none":
        return None
    if operand.kind == "read":
        local = {row: i for i, row in enumerate(ctx.rows)}
        return ctx.produced.values[operand.name].slice_rows([local[r] for r in chunk]).value
    published = ctx.state.published.get(operand.name)
    where = ("interventions", ctx.pass_.intervention, "writes", write.name, "operand")
    if published is None:
        raise RunError(where, f"no published output {operand.name!r}")
    if published.reduce != "none":
        return published.value
    sliced = published.slice_rows(chunk)
    if sliced.counts is not None and tuple(sliced.counts) != tuple(window.counts):
        bad = [row for row, a, b in zip(chunk, sliced.counts, window.counts) if a != b]
        raise RunError(where, f"operand {operand.name!r} was read over a different number of "
                       f"positions on rows {bad}")
    return sliced.value


def prompt_inputs(model: StandardizedTransformer, batch: PromptBatch, chunk: tuple,
                  kept: dict) -> tuple[dict, torch.Tensor]:
    """The rows ``chunk`` as model inputs, position ids taken from the mask (docs/format.md §18).

    The whole batch is made into tensors once per document (a sweep point's batch is a
    new object holding equal rows, hence the value key) and kept in ``kept`` (the document
    cache's ``inputs``); a chunk is a row selection.
    """
    device = model._model.get_input_embeddings().weight.device
    key = (batch_key(batch), str(device))
    whole = kept.get(key)
    if whole is None:
        ids = torch.tensor(batch.input_ids, dtype=torch.long, device=device)
        mask = torch.tensor(batch.attention_mask, dtype=torch.long, device=device)
        whole = kept[key] = (ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    if chunk == tuple(range(len(batch.input_ids))):
        ids, mask, position_ids = whole
    else:
        index = torch.tensor(chunk, dtype=torch.long, device=device)
        ids, mask, position_ids = (t.index_select(0, index) for t in whole)
    return {"input_ids": ids, "attention_mask": mask}, position_ids
