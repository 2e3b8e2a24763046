"""The walk: a plan tree run in written order on nnterp, the only place a trace is opened.

It turns plan data into tensors: each forward of a pass is one nnterp trace per window of
rows, taps issued in the plan's order, writes through the seam's one ``apply_write``, reads
through its one ``gather``. It never reads a document, a data table or a config: what it
needs was compiled into the plan, except positions, which it resolves per row against the
ids the model runs on (docs/format.md §6). Un-intervened forwards are shared: their reads are kept
in the document cache (``causalab.engine.cache``), keyed by the exact ids, so the points of
a sweep compute them once; the intervened forwards of sweep points that
``causalab.engine.fusion`` finds alike run as one trace over their rows stacked
(``prefetch``), each point's taps on its own rows. A decoding forward (``decode > 0``,
docs/format.md §11) runs through ``causalab.engine.decoding``, one trace per decode step.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from causalab.compile.plan import Attribute, Featurizers, Fit, Forward, Observe, Pass, Plan, Weights
from causalab.document import vocab
from causalab.engine import (attribution, containment, decoding, forwards, fusion, generate, record,
                             steps, tail)
from causalab.engine.resume import (PART_MODULES, Resume, deepest, hidden_width, kv_width,
                                    map_tensors, need_order, need_place, resume_point)
from causalab.engine import outputs as output_rules
from causalab.engine import windows as window_rules
from causalab.engine.cache import DocumentCache, Prefix
from causalab.engine.events import Events
from causalab.engine.passes import PassResult, featurized, result_of
from causalab.engine.seam import apply_write, gather
from causalab.engine.sites import HEAD_ROWS, Places, project_to_vocabulary
from causalab.engine.taps import PreparedTap, prepare
from causalab.engine.step_sources import build_from_step
from causalab.errors import RunError
from causalab.files import DOCUMENT


@dataclass(frozen=True)
class WalkState:
    """What a plan's walk carries: live featurizers and their specs, the outputs published
    so far, resolved windows per pass, the document cache, and where the walk is.

    A nested plan walks with a copy (``dataclasses.replace``) holding its own outputs
    namespace and windows; featurizers, specs and the cache are the same objects.
    """

    cache: DocumentCache = field(default_factory=DocumentCache)
    featurizers: dict = field(default_factory=dict)
    specs: dict = field(default_factory=dict)
    published: dict = field(default_factory=dict)
    windows: dict = field(default_factory=dict)
    model_ref: Any = None
    digest: str = ""
    events: Events = field(default_factory=Events)
    point: Any = None
    batch_size: int | None = None
    entry: str | None = None
    fill_prefixes: bool = False


def new_state(*, cache: DocumentCache | None = None, model_ref: Any = None,
              digest: str = "") -> WalkState:
    """A plan's walk state, sharing ``cache`` (a fresh one when None)."""
    return WalkState(cache=DocumentCache() if cache is None else cache, model_ref=model_ref,
                     digest=digest or "")


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
        return attribution.run_attribution(node, model, state, directory, run_gradient_trace)
    raise RunError((getattr(node, "name", type(node).__name__),), "unknown plan node")


def prefetch(points: list, model: Any, *, batch_size: int | None = None,
             cache: DocumentCache, ahead: list = ()) -> None:
    """Run the passes of ``points`` (one ``fusion.groups`` run) side by side, each
    intervened forward one trace over every point's rows; a point's results wait in
    ``cache`` for its own walk, which then runs no forward of its own. The prompt values
    that the ``ahead`` points (later runs of this signature) take from the cache are
    computed in the same traces.

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
            passes = [point.children[index].pass_ for point in points]
            later = [point.children[index].pass_ for point in ahead]
            results = fusion.lockstep(model, passes, states, trace=_trace,
                                      fill=_fill_unintervened, reads=_forward_reads,
                                      prefixes=prefixes, ahead=(later, later_states))
            for pass_, result in zip(passes, results):
                kept.append(pass_)
                cache.keep_prefetched(pass_, result)
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
    ``fill_prefixes`` (a fit) an intervened forward that can resume (``causalab.engine.resume``)
    first keeps its un-intervened prefix over every row, so this and later runs skip it, a
    minibatch taking its rows out of it; without, it resumes only from a prefix already kept,
    over exactly the rows it was computed on.
    """
    state = state if state is not None else new_state()
    if batch_size is not None:
        # The argument wins over the walk's own setting; a copy, so the caller's state keeps it.
        state = dataclasses.replace(state, batch_size=batch_size)
    if fill_prefixes:
        state = dataclasses.replace(state, fill_prefixes=True)
    run_rows = tuple(range(pass_.rows)) if rows is None else tuple(int(r) for r in rows)
    resolved = window_rules.resolve_pass(model, pass_, state)
    values: dict[str, output_rules.Published] = {}
    generated: dict[str, torch.Tensor] = {}
    with torch.set_grad_enabled(grad):
        for forward in pass_.forwards:
            raw = _forward_reads(model, pass_, forward, state, run_rows, resolved, values)
            if forward.decode:
                ids = raw.pop(generate.GENERATED).value
                generated.update({name: ids for name in generate.names(pass_, forward)})
                raw = decoding.cut_generated(model, pass_, forward, raw, ids, run_rows, resolved)
            for read in forward.reads:
                values[read.name] = featurized(raw[read.name], read, state)
        return result_of(pass_, run_rows, resolved, values, generated)


def _forward_reads(model: Any, pass_: Pass, forward: Forward, state: WalkState,
                   run_rows: tuple, resolved: dict, values: dict) -> dict:
    """Raw gathered reads of one forward over ``run_rows`` (pre-featurizer).

    A forward with no writes is computed once over all rows of its input and kept in the
    document cache, so sweep points and fit updates that ask again are served from it.
    A decoding forward also yields its generated ids (under ``generate.GENERATED``) and
    its generated-frame reads stacked per step, ``(rows, decode, width)``, still uncut.
    """
    if forward.writes:
        if forward.decode:
            return decoding.run_decode(model, pass_, forward, state, run_rows, resolved,
                                       values, _trace)
        return _run_forward(model, pass_, forward, state, run_rows, resolved, values)
    batch, cache = pass_.inputs[forward.input], state.cache
    keys = {read.name: forwards.read_key(batch, read, forward.decode) for read in forward.reads}
    if forward.decode:
        keys[generate.GENERATED] = (forwards.batch_key(batch), generate.GENERATED, forward.decode)
        if any(key not in cache.reads for key in keys.values()):
            fresh = decoding.run_decode(model, pass_, forward, state, tuple(range(pass_.rows)),
                                        resolved, values, _trace)
            for name, key in keys.items():
                cache.reads[key] = output_rules.Published(
                    fresh[name].value.detach(), fresh[name].counts, pass_.rows, "none")
    else:
        _fill_unintervened(model, [(pass_, forward, state, resolved)])
    if run_rows == tuple(range(pass_.rows)):
        return {name: cache.reads[key] for name, key in keys.items()}
    return {name: cache.reads[key].slice_rows(run_rows) for name, key in keys.items()}


def _fill_unintervened(model: Any, units: list, keep: fusion.NextPrefix | None = None) -> None:
    """Put every read the un-intervened prompt forwards of ``units`` (``(pass, forward,
    state, resolved)`` over the same rows) still lack into the document cache, from one
    trace per window of rows: each small address is tapped whole once and serves every
    position read there, now and for any later point; others are gathered in the trace.

    Forwards whose rows another input batch of the pass holds (``forwards.host_of``) run on
    that batch instead, every read kept whole there and cut back to their own rows. ``keep``
    (what a later intervened forward enters with) asks the same trace to keep that forward's
    prefix (``prefixes``) when it runs on the trace's batch."""
    cache = units[0][2].cache
    batch, order = _fill_batch(units)
    wanted, taps, pending = {}, [], set()
    for unit, (pass_, forward, _, _) in enumerate(units):
        own = pass_.inputs[forward.input]
        for index, read in enumerate(forward.reads):
            key = forwards.read_key(own, read)
            if key in cache.reads or key in wanted:
                continue
            whole = cache.whole_key(pass_, forward, read, pending, batch)
            wanted[key] = (unit, read, whole)
            if whole is not None and (whole in cache.wholes or whole in pending):
                continue
            pending.update(() if whole is None else (whole,))
            out = (unit, read.name) if whole is None else whole
            taps.append(((tuple(read.address.order), unit, index), out, unit, read))
    if not wanted:
        return
    needs = _kept_alongside(model, keep, batch) if taps else []
    ordered = [tap[1:] for tap in sorted(taps, key=lambda tap: tap[0])]
    got = _trace_unintervened(model, units, ordered, batch, needs) if ordered else {}
    for whole in pending:
        cache.wholes[whole] = got[whole].detach()
    for need in needs:
        cache.prefixes[(forwards.batch_key(batch), need)] = got[("keep", need)]
    rows = units[0][0].rows
    for key, (unit, read, whole) in wanted.items():
        pass_, forward, _, resolved = units[unit]
        if whole is not None:
            tensor = cache.wholes[whole]
            tensor = tensor if order is None else tensor.index_select(0, order.to(tensor.device))
            found = forwards.from_whole(tensor, pass_, forward, read, resolved)
        else:
            found = got[(unit, read.name)]
        cache.reads[key] = output_rules.Published(found.value.detach(), found.counts, rows, "none")


def _fill_batch(units: list) -> tuple[Any, torch.Tensor | None]:
    """The batch a fill of ``units`` runs on, and per row of their own batch its row there
    (None when it is their own): the host batch (``forwards.host_of``) when every read the
    fill still lacks can be kept whole over it."""
    pass_, forward, state, _ = units[0]
    host = forwards.host_of(pass_, forward)
    fresh = [read for each, own, _, _ in units for read in own.reads
             if forwards.read_key(each.inputs[own.input], read) not in state.cache.reads]
    if host is None or not state.cache.wholes_fit(host.batch, fresh):
        return pass_.inputs[forward.input], None
    return host.batch, torch.tensor(host.rows, dtype=torch.long)


def _kept_alongside(model: Any, keep: fusion.NextPrefix | None, batch: Any) -> list:
    """The prefix needs of ``keep`` a fill over ``batch`` keeps too: those not kept yet that
    the resume budget takes, when the forward that enters with them runs on the same rows."""
    if keep is None or forwards.batch_key(keep.batch) != forwards.batch_key(batch):
        return []
    return _missing_prefixes(model, batch, keep.state, keep.needs, ahead=keep.ahead)


def _trace_unintervened(model: Any, units: list, taps: list, batch: Any,
                        needs: list = ()) -> dict:
    """``taps`` (``(out, unit, read)`` in forward order) over every row of ``batch``, one
    trace per window of rows: a whole tensor, or a read gathered with its counts, per
    ``out``; and per prefix need of ``needs``, under ``("keep", need)``, its ``Prefix``."""
    pass0, forward0, state0, _ = units[0]
    every = tuple(range(len(batch.input_ids)))
    pieces: dict = {out: [] for out, _, _ in taps}
    pieces.update({("keep", need): [] for need in needs})
    for chunk in forwards.chunks(every, state0.batch_size):
        prepared = {}
        for out, unit, read in taps:
            whole = out[0] == "whole"
            window = None
            if not whole:
                windows, _ = units[unit][3][("read", read.name, units[unit][1].input)]
                window = window_rules.layout(windows, chunk, read.pos.ragged)
            prepared[out] = PreparedTap("read", read, window, out=out, whole=whole)
        inputs, position_ids = forwards.prompt_inputs(model, batch, chunk, state0.cache.inputs)
        got = _trace(model, inputs, position_ids, [out for out, _, _ in taps], prepared,
                     keep=needs)
        for out in pieces:
            pieces[out].append(got[out])
    windows = tuple(forwards.chunks(every, state0.batch_size))
    found = {("keep", need): Prefix(pieces[("keep", need)], windows) for need in needs}
    for out, unit, read in taps:
        value = torch.cat(pieces[out], 0) if len(pieces[out]) > 1 else pieces[out][0]
        windows, _ = units[unit][3][("read", read.name, units[unit][1].input)]
        counts = None if out[0] == "whole" else window_rules.layout(
            windows, every, read.pos.ragged).flat_counts
        found[out] = value if out[0] == "whole" else output_rules.Published(
            value, counts, len(every), "none")
    return found


def _run_forward(model: Any, pass_: Pass, forward: Forward, state: WalkState,
                 run_rows: tuple, resolved: dict, values: dict) -> dict:
    """One trace per window of rows; raw reads concatenated in ``run_rows`` order, each
    trace resumed from the kept prefix where there is one."""
    local = {row: i for i, row in enumerate(run_rows)}
    pieces: dict[str, list] = {read.name: [] for read in forward.reads}
    entry = resume_point(forward)
    needs = entry.needs() if entry else ()
    kept = prefixes(model, pass_, forward, state, set(needs), fill=state.fill_prefixes)
    keys = None
    if state.fill_prefixes and entry is not None and tail.at_last_column(forward):
        keys = kept_keys(model, pass_, forward, state)
    for chunk in forwards.chunks(run_rows, state.batch_size):
        prepared = prepare(pass_, forward, state, chunk, resolved, values, local, forward.taps)
        inputs, position_ids = forwards.prompt_inputs(model, pass_.inputs[forward.input], chunk,
                                                      state.cache.inputs)
        cached = {need: kept[need].rows(chunk, any_rows=state.fill_prefixes) if need in kept
                  else None for need in needs}
        resume = (entry, cached) if entry and all(v is not None for v in cached.values()) else None
        width = inputs["input_ids"].shape[1]
        if keys is not None and resume is not None and tail.all_last(prepared, width):
            got = _trace_last(model, inputs, position_ids, forward.taps, prepared, resume,
                              keys.cache(chunk, model))
        else:
            got = _trace(model, inputs, position_ids, forward.taps, prepared, resume=resume)
        for name in pieces:
            pieces[name].append(got[name])
    return forwards.gathered(pass_, forward, run_rows, resolved, pieces)


def _trace_last(model: Any, inputs: dict, position_ids: torch.Tensor, taps: Any,
                prepared: dict, resume: tuple, cache: Any) -> dict:
    """A trace of the last column alone over ``cache`` (the other columns' keys and
    values), entering where ``resume`` says with the kept values' last column."""
    entry, values = resume
    last = {"input_ids": inputs["input_ids"][:, -1:], "attention_mask": inputs["attention_mask"]}
    return _trace(model, last, position_ids[:, -1:], taps, tail.moved(prepared), cache,
                  resume=(entry, {need: tail.last_of(value) for need, value in values.items()}))


def kept_keys(model: Any, pass_: Pass, forward: Forward, state: WalkState) -> tail.Keys | None:
    """The un-intervened keys and values of every row's columns before the last (a
    ``tail.Keys``), computed once per prompt batch (one trace per window of rows) while the
    resume budget allows; None for a one-column prompt or past the budget."""
    batch, cache = pass_.inputs[forward.input], state.cache
    key = forwards.batch_key(batch)
    if key in cache.keys:
        return cache.keys[key]
    layers = len(model.layers)
    if batch.tokens < 2 or not cache.prefix_room(batch, 2 * layers, kv_width(model)):
        return None
    filled = []
    for chunk in forwards.chunks(tuple(range(pass_.rows)), state.batch_size):
        inputs, position_ids = forwards.prompt_inputs(model, batch, chunk, cache.inputs)
        filled.append(forwards.kv_cache(model))
        before = {name: tensor[:, :-1] for name, tensor in inputs.items()}
        with torch.no_grad(), model.trace(before, position_ids=position_ids[:, :-1],
                                          cache=filled[-1], use_cache=True, logits_to_keep=1):
            pass
    cache.keys[key] = tail.Keys.joined(filled)
    return cache.keys[key]


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def prefixes(model: Any, pass_: Pass, forward: Forward, state: WalkState, needs: set,
             *, fill: bool = True, ahead: set = frozenset()) -> dict:
    """``{need: Prefix}``: un-intervened values over every row of the forward's input, a
    need being a layer (the residual leaving that block) or ``(layer, part)`` (the raw output
    of a block's attention or MLP module), for those of ``needs`` kept or, with ``fill``,
    computed now (one trace per window of rows) while the resume budget allows (past it,
    the deepest that fit). A fill also keeps the ``ahead`` values (later points') when all
    of them fit the budget too."""
    batch, cache = pass_.inputs[forward.input], state.cache
    key = forwards.batch_key(batch)
    missing = _missing_prefixes(model, batch, state, needs, ahead=ahead) if fill else []
    if missing:
        every = tuple(range(pass_.rows))
        pieces: dict = {need: [] for need in missing}
        for chunk in forwards.chunks(every, state.batch_size):
            inputs, position_ids = forwards.prompt_inputs(model, batch, chunk, cache.inputs)
            with torch.no_grad():  # no tap: stops after the deepest need (``_trace``)
                got = _trace(model, inputs, position_ids, (), {}, keep=missing)
            for need in missing:
                pieces[need].append(got[("keep", need)])
        windows = tuple(forwards.chunks(every, state.batch_size))
        for need in missing:
            cache.prefixes[(key, need)] = Prefix(pieces[need], windows)
    return {need: cache.prefixes[(key, need)] for need in needs if (key, need) in cache.prefixes}


def _missing_prefixes(model: Any, batch: Any, state: WalkState, needs: set, *,
                      ahead: set = frozenset()) -> list:
    """Of ``needs`` (and ``ahead``, when all of them fit too), the un-intervened values of
    ``batch`` not kept yet that the resume budget takes, in forward order; they are
    charged to it (past it, the deepest that fit)."""
    cache = state.cache
    key = forwards.batch_key(batch)
    missing = [need for need in needs if (key, need) not in cache.prefixes]
    extra = [need for need in ahead if need not in needs and (key, need) not in cache.prefixes]
    width = hidden_width(model)
    if not missing:
        return []
    if extra and cache.prefix_room(batch, len(missing) + len(extra), width):
        missing += extra
    elif not cache.prefix_room(batch, len(missing), width):
        # Over the budget: the deepest that fit, whose entries skip the most blocks.
        present = {need for (batch_key, need) in cache.prefixes if batch_key == key}
        missing = deepest(missing, cache.prefixes_left(batch, width), present)
        missing = missing if missing and cache.prefix_room(batch, len(missing), width) else []
    return sorted(missing, key=need_order)


def _kept_value(model: Any, need: Any) -> Any:
    """A copy of the value a prefix need names, inside a running trace: the residual
    leaving block ``need``, or the raw output of a block's part ``(layer, part)``."""
    if isinstance(need, int):
        return _copy(model.layers_output[need])
    return map_tensors(getattr(model, PART_MODULES[need[1]])[need[0]].output, _copy)


def _trace(model: Any, inputs: dict, position_ids: torch.Tensor, taps: Any, prepared: dict,
           cache: Any = None, resume: tuple | None = None, next_token: bool = False,
           keep: Any = ()) -> dict:
    """One nnterp trace: the taps in order, over ``cache`` (a KV cache) when given; with
    ``next_token`` (a decode step) also the greedy next token, under
    ``generate.GENERATED``; per prefix need of ``keep`` (an un-intervened forward), its
    value under ``("keep", need)``. ``resume = (entry, values)`` (a
    ``Resume`` and its needs' cached values) skips blocks ``0 … R−1``, block ``R−1`` handing
    on the cached residual, and serves block ``R``'s cached parts from their outputs."""
    nested = frozenset(entry.op.address.layer for entry in prepared.values()
                       if entry.op.address.key_axis)
    # Without a cache of ours the model would build and fill one nobody reads (on SmolLM2
    # the keys and values of a fused trace are ~0.8 GB).
    kwargs = {"use_cache": False} if cache is None else {"cache": cache, "use_cache": True}
    decoding = cache is not None or next_token
    head = None if decoding else _last_column_head(prepared, inputs["input_ids"])
    head_rows = None if head is None else inputs["input_ids"].shape[0]
    if head is not None:
        moved = tail.moved(head)
        prepared = {tap: moved.get(tap, entry) for tap, entry in prepared.items()}
    places = Places(model, nested, head_rows)
    no_logits = _no_logits(prepared)
    if head_rows is not None or no_logits:
        kwargs["logits_to_keep"] = 1
    # Nothing reads past the last tap when no tap comes from the head and no cache or next
    # token is wanted: the blocks above it are not run (a sweep at layer 3 of 30 runs 4).
    stop = not decoding and no_logits
    got: dict = {}
    with model.trace(inputs, position_ids=position_ids, **kwargs) as tracer:
        if resume is not None:
            _skip(model, *resume)
        _issue(places, taps, prepared, got, keep)
        if next_token:
            # A write at ``logits`` chooses the next token; the model's own output lacks it.
            logits = places.written_logits
            logits = model.output.logits if logits is None else logits
            got[generate.GENERATED] = logits[:, -1].argmax(-1)
        if stop:
            tracer.stop()
    return got


def _no_logits(prepared: dict) -> bool:
    """Whether no tap of the trace is computed from the output head: then the model forms
    the logits of the last position alone (``logits_to_keep=1``). A 49,152-word head over
    every position is a fifth of a small model's forward and most of a trace's memory.
    A trace that taps the head at the last column only does the same on at least
    ``HEAD_ROWS`` rows (``_last_column_head``): on fewer, the head's matmul sums in another
    order (2.7e-5 on SmolLM2's logits), and the numbers would not be the model's."""
    return not any(_from_head(entry) for entry in prepared.values())


def _from_head(entry: PreparedTap) -> bool:
    return entry.op.address.component in vocab.FROM_LOGITS


def _last_column_head(prepared: dict, ids: torch.Tensor) -> dict | None:
    """The trace's taps computed from the head, when the head may run over the last column
    alone: every one reads that column, and the rows, padded to ``HEAD_ROWS``, are fewer
    than the trace's tokens (the head is then cheaper; on SmolLM2 a fifth of a forward).

    From ``HEAD_ROWS`` rows on, each row's logits are the ones the head computes over every
    column, so tables stay byte-identical however points are fused or resumed."""
    rows, width = ids.shape
    head = {tap: entry for tap, entry in prepared.items() if _from_head(entry)}
    if not head or rows * width <= max(rows, HEAD_ROWS):
        return None
    if any(entry.kind != "read" or entry.whole for entry in head.values()):
        return None
    return head if tail.all_last(head, width) else None


def _skip(model: Any, entry: Resume, values: dict) -> None:
    # Earlier blocks' outputs feed only skipped blocks; any tensor of the shape will do.
    for layer in range(entry.layer):
        model.layers[layer].skip(values[entry.layer - 1])
    for part in entry.parts:
        getattr(model, PART_MODULES[part])[entry.layer].skip(values[(entry.layer, part)])


def _issue(places: Places, taps: Any, prepared: dict, got: dict, keep: Any = ()) -> None:
    """The taps, in the plan's forward order; writes at an address before its reads.

    A tap is a key of ``prepared``; its value lands in ``got`` under the entry's ``key``.
    A prefix need of ``keep`` is taken before the taps at its place or later.
    """
    waiting = sorted(keep, key=need_order)
    for tap in taps:
        entry = prepared[tap]
        op, address = entry.op, entry.op.address
        while waiting and need_place(waiting[0]) <= tuple(address.order):
            need = waiting.pop(0)
            got[("keep", need)] = _kept_value(places.model, need)
        places.settle(address.order)
        activation = places.get(address)
        if entry.kind == "write":
            original = places.original[(address.component, address.layer)]
            places.put(address, apply_write(activation, op, entry.window, entry.featurizer,
                                            entry.operand, original))
            continue
        if entry.whole:
            # Kept past this forward: a copy, safe from any in-place update after the tap.
            got[entry.key] = activation.detach().clone()
            continue
        value = gather(activation, address, entry.window)
        if op.view == "logits":
            value = project_to_vocabulary(places.model, value)
        got[entry.key] = value
    for need in waiting:
        got[("keep", need)] = _kept_value(places.model, need)
    places.settle()


def run_gradient_trace(model: Any, inputs: dict, position_ids: torch.Tensor, sites: tuple, *,
                       shift: bool = False, replace: tuple | None = None,
                       head: Any = None, last_only: bool = False) -> dict:
    """One trace for attribution patching (``causalab.engine.attribution``), under the
    caller's grad mode. Each address of ``sites`` (plan ``Address``es in forward order) is
    read, a detached copy coming back under ``("value", i)``; with ``shift`` the forward then
    continues from the value plus a zero leaf (under ``("shift", i)``), whose gradient is the
    metric's gradient at that site. ``replace = (address, tensor)`` puts ``tensor`` there
    before anything (integrated gradients' interpolated embeddings). ``head``: an address
    whose value, graph kept, comes back under ``"head"``; ``last_only`` forms the logits of
    the last column alone. The model's weights stay frozen: only the leaves take gradients.
    """
    places = Places(model, frozenset())
    kwargs = {"use_cache": False, **({"logits_to_keep": 1} if last_only else {})}
    got: dict = {}
    with model.trace(inputs, position_ids=position_ids, **kwargs):
        if replace is not None:
            places.put(replace[0], replace[1])
        for index, address in enumerate(sites):
            places.settle(address.order)
            value = places.get(address)
            got[("value", index)] = value.detach().clone()
            if shift:
                got[("shift", index)] = torch.zeros_like(value).requires_grad_(True)
                places.put(address, value + got[("shift", index)])
        places.settle()
        if head is not None:
            got["head"] = places.get(head)
    return got
