"""Fusion: which sweep points' intervened forwards share one trace, and how they share it.

Planning over plan data and the seam's windows, and the lockstep run of a fused group
through the ``trace`` the walk hands it: it never opens a trace itself and never changes a
number. Fused points run the same prompt rows padded to the same width,
stacked one copy per point; left padding, the mask and position ids make a row's
activations independent of the rows beside it, and each point's writes and reads act on its
own slice of rows only. Points fuse only where that is plainly so: every step is an
``Observe``, nothing decodes, every operand is computed inside the pass (a literal, a read,
none; never an output published by another step), and the points' passes have the same
rows, the same inputs and the same forwards. Anything else runs one point at a time.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from causalab.compile.plan import Forward, Observe, Plan
from causalab.engine import forwards
from causalab.engine import windows as window_rules
from causalab.engine.forwards import batch_key, tap_ops
from causalab.engine.passes import PassResult, featurized, result_of
from causalab.engine.resume import map_tensors, resume_point, shared_entry
from causalab.engine.seam import Window
from causalab.engine.taps import prepare

# Tokens one fused trace may hold when no batch size bounds it (rows × padded width).
_FUSED_TOKENS = 16384
_OPERANDS = ("literal", "read", "none")


def signature(point: Any) -> tuple | None:
    """What a point's passes must share with another's to be fused, or None when it cannot
    be: a step other than ``Observe``, a decode, an operand from outside the pass, or no
    intervened forward at all (un-intervened forwards are already shared per document)."""
    if not isinstance(point, Plan) or not point.children:
        return None
    shape, written = [], False
    for node in point.children:
        if not isinstance(node, Observe):
            return None
        pass_ = node.pass_
        forwards = []
        for forward in pass_.forwards:
            if forward.decode or any(w.operand.kind not in _OPERANDS for w in forward.writes):
                return None
            written = written or bool(forward.writes)
            forwards.append((forward.input, bool(forward.writes)))
        inputs = tuple(sorted((role, batch_key(batch)) for role, batch in pass_.inputs.items()))
        shape.append((pass_.rows, inputs, tuple(forwards)))
    return tuple(shape) if written else None


def _capacity(point: Plan, batch_size: int | None) -> int:
    """How many copies of the point's rows one trace may hold."""
    passes = [node.pass_ for node in point.children]
    rows = max(pass_.rows for pass_ in passes)
    if batch_size:
        return batch_size // max(rows, 1)
    tokens = max(pass_.rows * batch.tokens for pass_ in passes for batch in pass_.inputs.values())
    return _FUSED_TOKENS // max(tokens, 1)


def groups(points: list, batch_size: int | None = None) -> list[list]:
    """``points`` in order, cut into runs that share traces: consecutive points of one
    signature, as many as one trace holds. A point that cannot be fused is alone."""
    runs: list[tuple[tuple | None, list]] = []
    for point in points:
        key = signature(point)
        if (key is not None and runs and runs[-1][0] == key
                and len(runs[-1][1]) < _capacity(point, batch_size)):
            runs[-1][1].append(point)
        else:
            runs.append((key, [point]))
    return [members for _, members in runs]


def alike_later(runs: list) -> list[list]:
    """Per run of ``groups``, the points of the later runs with its signature when it is the
    first run of that signature (else none): the prompt values they will ask of the document
    cache (un-intervened reads, kept prefixes) are computed in the first run's traces, not
    in one more pair of forwards per run. A run's points share one signature, so each run's
    is computed once, and only the first run resolves the later points' windows."""
    keys = [signature(run[0]) for run in runs]
    first = {key: index for index, key in reversed(list(enumerate(keys))) if key is not None}
    return [[point for later, other in zip(runs[index + 1:], keys[index + 1:]) if other == key
             for point in later] if first.get(key) == index else []
            for index, key in enumerate(keys)]


def shifted(window: Window, start: int) -> Window:
    """``window`` moved to rows ``start …`` of a fused batch."""
    return Window(window.batch_rows + start, window.positions, window.width, window.counts)


def issue_order(forwards: list[Forward]) -> list[tuple[int, str, str]]:
    """Every fused point's taps as ``(point, kind, name)`` in one forward order.

    Address order first, then writes before reads at one order, then the point, then the
    point's own tap order: each point's taps keep the plan's order among themselves.
    """
    keyed = []
    for unit, forward in enumerate(forwards):
        ops = tap_ops(forward)
        for index, (kind, name) in enumerate(forward.taps):
            order = tuple(ops[(kind, name)].address.order)
            keyed.append(((order, kind != "write", unit, index), (unit, kind, name)))
    return [tap for _, tap in sorted(keyed, key=lambda item: item[0])]


def lockstep(model: Any, passes: list, states: list, *, trace: Callable, fill: Callable,
             reads: Callable, prefixes: Callable, ahead: tuple = ((), ())) -> list[PassResult]:
    """The walk's ``run_pass`` over several passes of one signature at once (every row, no
    grad): un-intervened forwards filled into the document cache in one trace (``fill``)
    and served from it (``reads``), intervened ones fused (``_run_fused``). ``ahead``:
    (passes, states) of later points of the signature, filled for in the same traces."""
    rows = tuple(range(passes[0].rows))
    resolved = [window_rules.resolve_pass(model, p, s) for p, s in zip(passes, states)]
    later, later_states = ahead
    later_resolved = [window_rules.resolve_pass(model, p, s) for p, s in zip(later, later_states)]
    values: list[dict] = [{} for _ in passes]
    with torch.no_grad():
        for index, forward in enumerate(passes[0].forwards):
            each = [pass_.forwards[index] for pass_ in passes]
            if forward.writes:
                wanted_later = _later_needs([pass_.forwards[index] for pass_ in later])
                raws = _run_fused(model, passes, each, states, rows, resolved, values, trace,
                                  prefixes, wanted_later)
            else:
                fill(model, list(zip(passes, each, states, resolved))
                     + list(zip(later, [p.forwards[index] for p in later], later_states,
                                later_resolved)),
                     keep=_next_prefix(passes, states, later, index))
                raws = [reads(model, passes[i], each[i], states[i], rows, resolved[i], values[i])
                        for i in range(len(passes))]
            for own, raw, known, state in zip(each, raws, values, states):
                for read in own.reads:
                    known[read.name] = featurized(raw[read.name], read, state)
        return [result_of(pass_, rows, found, known)
                for pass_, found, known in zip(passes, resolved, values)]


def _later_needs(others: list) -> set:
    """What later points' forwards will enter with: as the later runs will group them, or
    alone if a run boundary splits them."""
    return _needs(_entries(others)) | _needs(map(resume_point, others))


class NextPrefix(NamedTuple):
    """The kept values a later intervened forward will enter with: its input ``batch``, the
    walk ``state`` holding the cache, its ``needs`` and what later points' forwards need
    (``ahead``). An un-intervened fill on the same rows keeps them in its own trace."""

    batch: Any
    state: Any
    needs: set
    ahead: set


def _next_prefix(passes: list, states: list, later: list, index: int) -> NextPrefix | None:
    """What the next intervened forward after forward ``index`` will enter with: the fill
    before it keeps that too, one forward instead of two."""
    for step in range(index + 1, len(passes[0].forwards)):
        forward = passes[0].forwards[step]
        if forward.writes:
            each = [pass_.forwards[step] for pass_ in passes]
            return NextPrefix(passes[0].inputs[forward.input], states[0], _needs(_entries(each)),
                              _later_needs([pass_.forwards[step] for pass_ in later]))
    return None


def _entries(each: list) -> list:
    """Where each unit's trace enters (``None``: from the start), shared where it can be."""
    entries = [resume_point(forward) for forward in each]
    present = {entry for entry in entries if entry is not None}
    return [None if entry is None else shared_entry(entry, present) for entry in entries]


def _needs(entries: list) -> set:
    return {need for entry in entries if entry is not None for need in entry.needs()}


def _by_entry(entries: list, kept: dict) -> dict:
    """Units grouped by their entry, in unit order; a unit whose cached values are not kept
    over these rows starts from the start."""
    runs: dict = {}
    for unit, entry in enumerate(entries):
        if entry is not None and any(kept.get(need) is None for need in entry.needs()):
            entry = None
        runs.setdefault(entry, []).append(unit)
    return runs


def _stacked(copies: int) -> Callable:
    """Repeat a kept tensor for ``copies`` stacked points (rows first)."""
    return lambda tensor: tensor.repeat(copies, *([1] * (tensor.dim() - 1)))


def _run_fused(model: Any, passes: list, each: list, states: list, rows: tuple,
               resolved: list, values: list, trace: Callable, prefixes: Callable,
               later: set = frozenset()) -> list[dict]:
    """One trace per entry point over its passes' rows stacked: the ``i``-th pass of a trace
    holds batch rows ``i·n … (i+1)·n − 1`` and its taps act there only; points entering at
    the same place share a trace that skips what comes before (``causalab.engine.resume``).
    ``later``: what later points will enter with, kept in the same fill when it fits."""
    local = {row: i for i, row in enumerate(rows)}
    entries = _entries(each)
    kept = {need: prefix.rows(rows) for need, prefix in
            prefixes(model, passes[0], each[0], states[0], _needs(entries), ahead=later).items()}
    inputs, position_ids = forwards.prompt_inputs(model, passes[0].inputs[each[0].input], rows,
                                                  states[0].cache.inputs)
    raws: list = [None] * len(passes)
    for entry, units in _by_entry(entries, kept).items():
        prepared = {}
        for slot, unit in enumerate(units):
            own = prepare(passes[unit], each[unit], states[unit], rows, resolved[unit],
                          values[unit], local, each[unit].taps)
            for (kind, name), found in own.items():
                prepared[(unit, kind, name)] = found._replace(
                    window=shifted(found.window, slot * len(rows)), out=(unit, name))
        copies = len(units)
        stacked = {key: tensor.repeat(copies, 1) for key, tensor in inputs.items()}
        resume = None if entry is None else (
            entry, {need: map_tensors(kept[need], _stacked(copies)) for need in entry.needs()})
        order = [(units[slot], kind, name)
                 for slot, kind, name in issue_order([each[unit] for unit in units])]
        got = trace(model, stacked, position_ids.repeat(copies, 1), order, prepared,
                    resume=resume)
        for unit in units:
            raws[unit] = forwards.gathered(passes[unit], each[unit], rows, resolved[unit],
                                           {read.name: [got[(unit, read.name)]]
                                            for read in each[unit].reads})
    return raws
