"""The planner: every speed decision of a run, made on plan data and the document cache's index.

Which traces run, over which rows, entering where (prefix resume, docs/platform.md §7), over
kept keys at the last column alone (a fit), with the head over which columns, stopping
where, keeping what, on which batch an un-intervened forward runs, which sweep points share
one trace (fusion: alike jobs merged, rows stacked), and an attribute step's traces. It
yields ``TraceJob``s in ``Stage``s, reading the cache's keys and budgets (never its tensors),
the pass's windows and the model's facts; it never opens a trace. A stage generator resumes
once the walk has kept what it yielded; ``explain --traces`` runs the same walk and
generators over a cache the dry runner fills with placeholders. Fused points run the same prompt rows, one copy per point (left
padding, the mask and position ids keep rows independent), only where that is plainly so
(``signature``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from causalab.compile.plan import Attribute, Forward, Observe, Plan, PromptBatch
from causalab.document import vocab
from causalab.engine import forwards, generate, tail
from causalab.engine.attribution import atp_star
from causalab.engine.cache import DocumentCache, Prefix
from causalab.engine.forwards import batch_key, read_key, tap_ops
from causalab.engine.trace_jobs import JobKind, JobTap, NextPrefix, SiteOp, Stage, TraceJob, Wanted
from causalab.engine.resume import (Resume, ahead_of, by_entry, deepest, entries_of, need_order,
                                    needs_of, resume_point)
from causalab.engine.sites import HEAD_ROWS
from causalab.engine.state import ModelFacts, PassContext

# Tokens one fused trace may hold when no batch size bounds it (rows × padded width).
_FUSED_TOKENS = 16384
_OPERANDS = ("literal", "read", "none")


def signature(point: Plan | object) -> tuple | None:
    """What a point's passes must share with another's to be fused, or None: a step other
    than ``Observe``, a decode, an operand from outside the pass (a literal, a read or none
    only), or no intervened forward (un-intervened ones are shared per document anyway)."""
    if not isinstance(point, Plan) or not point.children:
        return None
    shape, written = [], False
    for node in point.children:
        if not isinstance(node, Observe):
            return None
        pass_ = node.pass_
        own = []
        for forward in pass_.forwards:
            if forward.decode or any(w.operand.kind not in _OPERANDS for w in forward.writes):
                return None
            written = written or bool(forward.writes)
            own.append((forward.input, bool(forward.writes)))
        inputs = tuple(sorted((role, batch_key(batch)) for role, batch in pass_.inputs.items()))
        shape.append((pass_.rows, inputs, tuple(own)))
    return tuple(shape) if written else None


def _capacity(point: Plan, batch_size: int | None, cache: DocumentCache | None) -> int:
    return capacity([node.pass_ for node in point.children], batch_size, cache)


def capacity(passes: list, batch_size: int | None, cache: DocumentCache | None = None) -> int:
    """Copies of one point's rows (``passes``) one fused trace may hold, within the budget."""
    rows = max(pass_.rows for pass_ in passes)
    widest = max(batch.tokens for pass_ in passes for batch in pass_.inputs.values())
    tokens = max(pass_.rows * batch.tokens for pass_ in passes for batch in pass_.inputs.values())
    capacity = batch_size // max(rows, 1) if batch_size else _FUSED_TOKENS // max(tokens, 1)
    if cache is not None and cache.memory is not None:
        capacity = min(capacity, cache.memory.rows(widest) // max(rows, 1))
    return capacity


def groups(points: list, batch_size: int | None = None,
           cache: DocumentCache | None = None) -> list[list]:
    """``points`` in order, cut into runs of one signature that share traces (one alone)."""
    runs: list[tuple[tuple | None, list]] = []
    for point in points:
        key = signature(point)
        if (key is not None and runs and runs[-1][0] == key
                and len(runs[-1][1]) < _capacity(point, batch_size, cache)):
            runs[-1][1].append(point)
        else:
            runs.append((key, [point]))
    return [members for _, members in runs]


def alike_later(runs: list) -> list[list]:
    """Per run of ``groups``, the points of the later runs with its signature when it is the
    first run of that signature (else none): the prompt values they will ask of the document
    cache (un-intervened reads, kept prefixes) are computed in the first run's traces."""
    keys = [signature(run[0]) for run in runs]
    first = {key: index for index, key in reversed(list(enumerate(keys))) if key is not None}
    return [[point for later, other in zip(runs[index + 1:], keys[index + 1:]) if other == key
             for point in later] if first.get(key) == index else []
            for index, key in enumerate(keys)]


def forward_stages(ctx: PassContext, forward: Forward) -> Iterator[Stage]:
    """The stages of one forward of a pass over its run rows, in the order they run."""
    if forward.decode:
        yield from _decode_stages(ctx, forward)
    elif forward.writes:
        yield from _intervened(ctx, forward)
    else:
        stage = reads_stage([ctx], [forward])
        if stage is not None:
            yield stage
        yield Stage("serve", forwards=(forward,))


def fused_stages(units: list[PassContext], later: list[PassContext], index: int, *,
                 last_column: bool = False) -> Iterator[Stage]:
    """Forward ``index`` of several points' passes of one signature, every row, no grad:
    an un-intervened one filled for all (and the ``later`` points) in one trace per window,
    an intervened one as one trace per entry point, its points stacked (``fuse``).

    With ``last_column`` (``verify``'s exact patches, which tolerate float rounding) an
    intervened forward tapping only the prompt's last column (``tail.at_last_column``) keeps
    the batch's keys and values once, and runs as one trace of that column alone over them,
    every point stacked (``_last_columns``); without keys kept (a model whose cache keeps
    none for some layer) it runs as an exact sweep's points do."""
    each = tuple(ctx.pass_.forwards[index] for ctx in units)
    ahead = tuple(ctx.pass_.forwards[index] for ctx in later)
    if not each[0].writes:
        stage = reads_stage(list(units) + list(later), list(each + ahead),
                            keep=_next_prefix(units, later, index))
        if stage is not None:
            yield stage
        yield Stage("serve", forwards=each)
        return
    first = units[0]
    batch = first.pass_.inputs[each[0].input]
    if last_column and all(tail.at_last_column(forward) for forward in each):
        stage = _keys_stage(first, batch)
        if stage is not None:
            yield stage
        if first.state.cache.keys.get(batch_key(batch)) is not None and all(tail.all_last(
                (p for tap in _taps(forward, unit)
                 for p in units[unit].windows.positions(tap, batch.role, first.rows)),
                batch.tokens) for unit, forward in enumerate(each)):
            yield Stage("forward", (_last_columns(units, each, batch),), each)
            return
    entries = entries_of(each)
    needs = needs_of(entries)
    stage = _prefix_stage(first, batch, needs, ahead=ahead_of(ahead))
    if stage is not None:
        yield stage
    covered = {need for need, prefix in kept_prefixes(first.state.cache, batch, needs).items()
               if prefix.covers(first.rows)}
    jobs = []
    for entry, members in by_entry(entries, covered).items():
        jobs.append(fuse([_job("forward", batch, first.rows, _taps(each[unit], unit), units,
                               resume=entry) for unit in members], units))
    yield Stage("forward", tuple(jobs), each)


def _last_columns(units: list[PassContext], each: tuple[Forward, ...],
                  batch: PromptBatch) -> TraceJob:
    """Every unit's forward stacked in one trace of the last column over the batch's kept
    keys, from the embeddings whatever its layer: a column costs a unit's rows one token per
    block, so one trace for all beats a trace per entry, and no prefix need be kept. Blocks
    before a unit's tap compute the un-intervened last column up to float rounding."""
    return fuse([_job("forward", batch, units[0].rows, _taps(forward, unit), units, tail=True)
                 for unit, forward in enumerate(each)], units)


def fuse(jobs: list[TraceJob], units: list[PassContext]) -> TraceJob:
    """Alike jobs (one batch, the same rows, one entry) merged into one trace over their
    rows stacked, job ``i``'s taps acting on copy ``i`` only: address order first, then
    writes before reads at one order, then the copy, then each job's own order."""
    keyed = [((tuple(tap.op.address.order), tap.kind != "write", slot, index),
              dataclasses.replace(tap, slot=slot))
             for slot, job in enumerate(jobs) for index, tap in enumerate(job.taps)]
    taps = tuple(tap for _, tap in sorted(keyed, key=lambda item: item[0]))
    first = jobs[0]
    return _job(first.kind, first.batch, first.rows, taps, units, copies=len(jobs),
                resume=first.resume, tail=first.tail, grad=first.grad)


def _intervened(ctx: PassContext, forward: Forward) -> Iterator[Stage]:
    """An intervened prompt forward, one trace per window of rows resumed from the kept
    prefix covering it; a fit (``fill_prefixes``) keeps the prefix first over every row, and
    runs a forward tapping the last column alone there over kept keys."""
    cache, batch = ctx.state.cache, ctx.pass_.inputs[forward.input]
    entry = resume_point(forward)
    needs = set(entry.needs()) if entry else set()
    fill = ctx.state.fill_prefixes
    if fill:
        stage = _prefix_stage(ctx, batch, needs)
        if stage is not None:
            yield stage
    kept = kept_prefixes(cache, batch, needs)
    keys = None
    if fill and entry is not None and tail.at_last_column(forward):
        stage = _keys_stage(ctx, batch)
        if stage is not None:
            yield stage
        keys = cache.keys.get(batch_key(batch))
    taps = _taps(forward)
    # Last-column traces are windowed as one-token rows (what they cost, trace_bytes): a fit's
    # minibatch then stays one trace under a tight budget, as without one. Any window that
    # cannot run as a last column sizes them all as whole rows again.
    jobs = _forward_jobs(ctx, batch, taps, entry, needs, kept, keys, 1) if keys is not None \
        else []
    if not jobs or not all(job.tail for job in jobs):
        jobs = _forward_jobs(ctx, batch, taps, entry, needs, kept, keys, batch.tokens)
    yield Stage("forward", tuple(jobs), (forward,))


def _forward_jobs(ctx: PassContext, batch: PromptBatch, taps: tuple, entry, needs: set,
                  kept: dict, keys, tokens: int) -> list[TraceJob]:
    """An intervened forward's jobs over windows sized for rows of ``tokens`` tokens, each
    resumed from the kept prefix covering it and a last column where it can be."""
    fill, jobs = ctx.state.fill_prefixes, []
    window = ctx.state.cache.window(ctx.state.batch_size, tokens, ctx.grad)
    for chunk in forwards.chunks(ctx.rows, window):
        resume = entry if entry is not None and all(
            need in kept and kept[need].covers(chunk, any_rows=fill) for need in needs) else None
        last = keys is not None and resume is not None and tail.all_last(
            (p for tap in taps for p in ctx.windows.positions(tap, batch.role, chunk)),
            batch.tokens)
        jobs.append(_job("forward", batch, chunk, taps, [ctx], resume=resume, tail=last,
                         grad=ctx.grad))
    return jobs


def attribute_stages(ctx: PassContext, node: Attribute) -> Iterator[Stage]:
    """An attribute step per window of rows: the counterfactual with its sites kept whole,
    then ``steps`` gradient-taking forwards of the base, each site shifted by a zero leaf and
    the metric's read kept; the ``k``-th puts the embeddings ``k/steps`` of the way to the
    counterfactual's (integrated gradients). A stage a trace: its gradients come first."""
    metric = next(m for m in ctx.pass_.metrics if m.name in node.metrics)
    head = JobTap("read", next(r for f in ctx.pass_.forwards for r in f.reads
                               if r.name == metric.of))
    sites = tuple(SiteOp(node.name, a, i) for i, a in enumerate(node.addresses))
    start = () if node.embeddings is None else (SiteOp(node.name, node.embeddings),)
    base, other = (ctx.pass_.inputs[role] for role in (node.base, node.counterfactual))
    for chunk in forwards.chunks(ctx.rows, ctx.window(base, True)):
        kept = tuple(JobTap("read", op, whole=True) for op in start + sites)
        yield Stage("attribute", (_job("attribute", other, chunk, kept, [ctx]),))
        for k in range(node.steps):
            taps = [JobTap("replace" if k else "read", dataclasses.replace(op, step=k),
                           whole=True) for op in start]
            taps += [JobTap("shift", op, whole=True) for op in sites] + [head]
            taps += atp_star.taps(node)
            taps.sort(key=lambda tap: tuple(tap.op.address.order))
            yield Stage("attribute", (_job("attribute", base, chunk, tuple(taps), [ctx],
                                           grad=True),))


def _decode_stages(ctx: PassContext, forward: Forward) -> Iterator[Stage]:
    """A decoding forward: per window of rows its steps, in order. An un-intervened one is
    decoded once over every row of its input and kept in the document cache."""
    if forward.writes:
        yield Stage("decode", _decode_jobs(ctx, forward, ctx.rows), (forward,))
        return
    cache, batch = ctx.state.cache, ctx.pass_.inputs[forward.input]
    if ((batch_key(batch), forward.decode) not in cache.generated
            or any(read_key(batch, read, forward.decode) not in cache.reads
                   for read in forward.reads)):
        yield Stage("decode", _decode_jobs(ctx, forward, tuple(range(ctx.pass_.rows))),
                    (forward,), kept=True)
    yield Stage("serve", forwards=(forward,))


def _decode_jobs(ctx: PassContext, forward: Forward, rows: tuple) -> tuple[TraceJob, ...]:
    batch = ctx.pass_.inputs[forward.input]
    return tuple(_job("decode", batch, chunk, tuple(JobTap(kind, op) for kind, op
                                                    in generate.step_taps(forward, step)),
                      [ctx], step=step, grad=ctx.grad)
                 for chunk in forwards.chunks(rows, ctx.window(batch, ctx.grad, forward.decode))
                 for step in range(forward.decode))


def reads_stage(units: list[PassContext], own: list[Forward],
                keep: NextPrefix | None = None) -> Stage | None:
    """The un-intervened prompt forwards of ``units`` (over the same rows) as one trace per
    window of rows, for every read the document cache still lacks: each small address is
    tapped whole once and serves every position read there, now and for any later point;
    others are gathered in the trace. Forwards whose rows another input holds
    (``forwards.host_of``) run on that batch, every read kept whole there. ``keep`` (what
    a later intervened forward enters with) asks the same trace to keep its prefix too."""
    cache = units[0].state.cache
    batch, host = _fill_batch(units, own)
    wanted, taps, pending, seen = [], [], set(), set()
    for unit, (ctx, forward) in enumerate(zip(units, own)):
        for index, read in enumerate(forward.reads):
            key = read_key(ctx.pass_.inputs[forward.input], read)
            if key in cache.reads or key in seen:
                continue
            whole = cache.whole_key(ctx.pass_, forward, read, pending, batch)
            seen.add(key)
            wanted.append(Wanted(key, unit, read, whole))
            if whole is not None and (whole in cache.wholes or whole in pending):
                continue
            pending.update(() if whole is None else (whole,))
            taps.append(((tuple(read.address.order), unit, index),
                         JobTap("read", read, unit, whole=whole is not None)))
    if not wanted:
        return None
    needs = _kept_alongside(cache, units[0].facts, keep, batch) if taps else []
    ordered = tuple(tap for _, tap in sorted(taps, key=lambda item: item[0]))
    jobs = _reads_jobs(units, batch, ordered, tuple(needs)) if ordered else ()
    return Stage("reads", jobs, tuple(own), tuple(wanted), host)


def _reads_jobs(units: list[PassContext], batch: PromptBatch, taps: tuple,
                needs: tuple) -> tuple[TraceJob, ...]:
    """One fill trace per window of every row of ``batch``."""
    every = tuple(range(len(batch.input_ids)))
    return tuple(_job("reads", batch, chunk, taps, units, keep=needs, grad=units[0].grad)
                 for chunk in forwards.chunks(every, units[0].window(batch, units[0].grad)))


def _fill_batch(units: list[PassContext], own: list[Forward]) -> tuple[PromptBatch, Any]:
    """The batch a fill runs on, and per row of the forwards' own batch its row there (None
    when it is their own): the host batch when every read still lacking fits whole there.
    A unit whose own batch is the host (the fidelity receipt riding the fill) gathers its
    reads in the trace, on its own rows."""
    first, cache = units[0], units[0].state.cache
    host = forwards.host_of(first.pass_, own[0])
    if host is None:
        return first.pass_.inputs[own[0].input], None
    fresh = [read for ctx, forward in zip(units, own)
             if batch_key(ctx.pass_.inputs[forward.input]) != batch_key(host[0])
             for read in forward.reads
             if read_key(ctx.pass_.inputs[forward.input], read) not in cache.reads]
    return host if cache.wholes_fit(host[0], fresh) else (first.pass_.inputs[own[0].input], None)


def receipt_rides(receipt: PassContext, units: list[PassContext],
                  later: list[PassContext]) -> bool:
    """Whether the fidelity receipt's no-op forward (``receipt``, over every row of its
    batch) rides the un-intervened fill ``fused_stages`` runs first for ``units`` (the run's
    first fused points, with ``later``): that fill must run on the receipt's own batch and
    through the last block anyway, so the receipt adds the head over the last column to
    one trace instead of opening its own."""
    if not units or any(ctx.pass_.forwards[0].writes or ctx.pass_.forwards[0].decode
                        for ctx in units):
        return False
    riders = [*units, *later, receipt]
    batch, _ = _fill_batch(riders, [ctx.pass_.forwards[0] for ctx in riders])
    own = receipt.pass_.inputs[receipt.pass_.forwards[0].input]
    layers = [read.address.layer for ctx in units for read in ctx.pass_.forwards[0].reads
              if read.address.layer is not None]
    deepest = max(layers, default=-1)
    return batch_key(batch) == batch_key(own) and deepest >= receipt.facts.layers - 1


def receipt_stages(receipt: PassContext, units: list[PassContext],
                   later: list[PassContext]) -> Iterator[Stage]:
    """The fill ``fused_stages`` runs first for ``units`` and ``later``, the receipt's read
    taken in its trace (``receipt_rides``): run with the units ``[*units, *later, receipt]``."""
    riders = [*units, *later, receipt]
    stage = reads_stage(riders, [ctx.pass_.forwards[0] for ctx in riders],
                        keep=_next_prefix(units, later, 0))
    if stage is not None:
        yield stage


def _next_prefix(units: list[PassContext], later: list[PassContext],
                 index: int) -> NextPrefix | None:
    """What the next intervened forward after forward ``index`` will enter with: the fill
    before it keeps that too, one forward instead of two."""
    passes = [ctx.pass_ for ctx in units]
    for step in range(index + 1, len(passes[0].forwards)):
        forward = passes[0].forwards[step]
        if forward.writes:
            return NextPrefix(passes[0].inputs[forward.input],
                              needs_of(entries_of([p.forwards[step] for p in passes])),
                              ahead_of([ctx.pass_.forwards[step] for ctx in later]))
    return None


def _kept_alongside(cache: DocumentCache, facts: ModelFacts, keep: NextPrefix | None,
                    batch: PromptBatch) -> list:
    """The prefix needs of ``keep`` a fill over ``batch`` keeps too, when the forward that
    enters with them runs on the same rows."""
    if keep is None or batch_key(keep.batch) != batch_key(batch):
        return []
    return _missing_prefixes(cache, facts, batch, keep.needs, ahead=keep.ahead)


def _taps(forward: Forward, unit: int = 0) -> tuple[JobTap, ...]:
    return tuple(JobTap(kind, op, unit) for kind, op in tap_ops(forward))


def kept_prefixes(cache: DocumentCache, batch: PromptBatch, needs: set) -> dict[Any, Prefix]:
    """``{need: Prefix}`` of ``needs`` kept over ``batch`` (``resume.Resume.needs``)."""
    key = batch_key(batch)
    return {need: cache.prefixes[(key, need)] for need in needs if (key, need) in cache.prefixes}


def _prefix_stage(ctx: PassContext, batch: PromptBatch, needs: set, *,
                  ahead: set = frozenset()) -> Stage | None:
    """The prefixes of ``needs`` (and ``ahead``) not kept yet, one trace per window of every
    row, as ``_missing_prefixes`` takes them."""
    missing = _missing_prefixes(ctx.state.cache, ctx.facts, batch, needs, ahead=ahead)
    if not missing:
        return None
    every = tuple(range(ctx.pass_.rows))
    return Stage("prefix", tuple(_job("prefix", batch, chunk, (), [ctx], keep=tuple(missing))
                                 for chunk in forwards.chunks(every, ctx.window(batch))))


def _keys_stage(ctx: PassContext, batch: PromptBatch) -> Stage | None:
    """The keys and values of every row's columns but the last, once per prompt batch while
    the resume budget allows; none for a one-column prompt."""
    cache, facts = ctx.state.cache, ctx.facts
    if batch_key(batch) in cache.keys:
        return None
    if batch.tokens < 2 or not cache.prefix_room(batch, 2 * facts.layers, facts.kv):
        return None
    every = tuple(range(ctx.pass_.rows))
    return Stage("keys", tuple(TraceJob("keys", batch, chunk, head="none")
                               for chunk in forwards.chunks(every, ctx.window(batch))))


def _missing_prefixes(cache: DocumentCache, facts: ModelFacts, batch: PromptBatch,
                      needs: set, *, ahead: set = frozenset()) -> list:
    """Of ``needs`` (and ``ahead``, when all fit too), the values of ``batch`` not kept yet
    that the resume budget takes, charged to it, in forward order (past it, the deepest)."""
    key = batch_key(batch)
    missing = [need for need in needs if (key, need) not in cache.prefixes]
    extra = [need for need in ahead if need not in needs and (key, need) not in cache.prefixes]
    if not missing:
        return []
    if extra and cache.prefix_room(batch, len(missing) + len(extra), facts.hidden):
        missing += extra
    elif not cache.prefix_room(batch, len(missing), facts.hidden):
        # Over the budget: the deepest that fit, whose entries skip the most blocks.
        present = {need for (batch_key_, need) in cache.prefixes if batch_key_ == key}
        missing = deepest(missing, cache.prefixes_left(batch, facts.hidden), present)
        missing = missing if missing and cache.prefix_room(batch, len(missing),
                                                           facts.hidden) else []
    return sorted(missing, key=need_order)


def _job(kind: JobKind, batch: PromptBatch, rows: tuple, taps: tuple, units: list, *,
         copies: int = 1, resume: Resume | None = None, tail: bool = False, keep: tuple = (),
         step: int | None = None, grad: bool = False) -> TraceJob:
    """A job with its head and stop decided: with no tap from the head and no cache or next
    token wanted, the blocks above the last tap are not run (a sweep at layer 3 of 30 runs
    4) and the logits are the last position's alone (a 49,152-word head over every position
    is a fifth of a small model's forward)."""
    decoding = tail or step is not None
    no_logits = _no_logits(taps)
    head = "none" if no_logits else "all"
    if not decoding:
        heads = [(tap, units[tap.unit].windows.positions(tap, batch.role, rows))
                 for tap in taps if _from_head(tap)]
        if _last_column_head(heads, (copies * len(rows), batch.tokens)) is not None:
            head = "last"
    return TraceJob(kind, batch, rows, taps, copies, resume, tail, head,
                    not decoding and no_logits, keep, step, grad)


def _no_logits(taps: tuple) -> bool:
    return not any(_from_head(tap) for tap in taps)


def _from_head(tap: JobTap) -> bool:
    return tap.op.address.component in vocab.FROM_LOGITS


def _last_column_head(heads: list, shape: tuple[int, int]) -> list | None:
    """The taps computed from the head (with their positions) when the head may run over
    the last column alone: all read it, and the rows, padded to ``HEAD_ROWS``, are fewer
    than the trace's tokens. From ``HEAD_ROWS`` rows on each row's logits are the all-column
    head's, bit for bit; on fewer its matmul sums in another order (2.7e-5 on SmolLM2)."""
    rows, width = shape
    if not heads or rows * width <= max(rows, HEAD_ROWS):
        return None
    if any(tap.kind != "read" or tap.whole for tap, _ in heads):
        return None
    return heads if all(tail.all_last(positions, width) for _, positions in heads) else None
