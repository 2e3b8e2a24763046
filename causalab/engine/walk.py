"""The walk: a plan tree run in written order on nnterp, the only place a trace is opened.

It turns plan data into tensors: each forward of a pass is one nnterp trace per window of
rows, taps issued in the plan's order, writes through the seam's one ``apply_write``, reads
through its one ``gather``. It never reads a document, a data table or a config: what it
needs was compiled into the plan, except positions, which it resolves per row against the
ids the model runs on (FORMAT §6). Un-intervened forwards are shared: their reads are kept
per document, keyed by the exact ids, so the points of a sweep compute them once; the
intervened forwards of sweep points that ``causalab.engine.fusion`` finds alike run as one
trace over their rows stacked (``prefetch``), each point's taps on its own rows.
A decoding forward (``decode > 0``, FORMAT §11) is one trace per decode step over one KV
cache; which taps act at which step and how stacked generated reads are cut is
``causalab.engine.generate``'s business.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from causalab.compile.plan import (Featurizers, Fit, Forward, Observe, Pass, Plan, ReadOp,
                                   Weights, WriteOp)
from causalab.engine import forwards, fusion, generate, record, steps
from causalab.engine import outputs as output_rules
from causalab.engine import windows as window_rules
from causalab.engine.events import Events
from causalab.engine.metrics import score
from causalab.engine.seam import Window, apply_write, express, gather
from causalab.engine.sites import Places, project_to_vocabulary
from causalab.engine.step_sources import build_from_step
from causalab.errors import RunError
from causalab.files import DOCUMENT

# A fused point's pass result, waiting in the document cache for the point's own walk.
_PREFETCHED = "prefetched"


def new_state(*, shared: dict | None = None, model_ref: Any = None, digest: str = "") -> dict:
    """A plan's walk state: live featurizers, published outputs, and caches it may share."""
    return {"featurizers": {}, "specs": {}, "published": {}, "windows": {},
            "shared": {} if shared is None else shared, "model_ref": model_ref,
            "digest": digest or "", "events": Events(), "point": None, "batch_size": None,
            "entry": None}


def run_plan(plan: Plan, model: Any, *, out: str, batch_size: int | None = None,
             events: Events | None = None, state: dict | None = None,
             shared: dict | None = None) -> list[str]:
    """Walk ``plan`` and write its saves under ``out``; returns the written paths in order.

    A nested plan (a sweep point or a list entry) gets its own outputs namespace and
    directory; featurizers built by a plan are shared live by the steps (and list entries)
    beneath it. ``shared`` carries the un-intervened-forward cache across the points of one
    document.
    """
    events = events or Events()
    if state is None:
        state = new_state(shared=shared, model_ref=plan.model, digest=plan.digest or "")
        state["point"] = plan
    else:
        state = dict(state, published=dict(state["published"]), windows={})
        state["digest"] = plan.digest or state["digest"]
        state["model_ref"] = plan.model or state["model_ref"]
        # A list-intervention entry (no digest, no document of its own) names its step's
        # events "<step>/<entry>", so sibling entries' metrics stay apart.
        state["entry"] = plan.name if plan.digest is None and plan.document is None else None
    state["events"], state["batch_size"] = events, batch_size
    directory = Path(out) / plan.directory
    written: list[str] = []
    if plan.directory and plan.document is not None:
        written.append(record.write_json(directory / DOCUMENT, plan.document))
    for node in plan.children:
        written += _run_node(node, model, state, out, directory)
        build_from_step(node, state)
    return written


def _run_node(node: Any, model: Any, state: dict, out: str, directory: Path) -> list[str]:
    if isinstance(node, Plan):
        return run_plan(node, model, out=out, batch_size=state["batch_size"],
                        events=state["events"], state=state)
    if isinstance(node, Featurizers):
        steps.build_featurizers(node, model, state)
        return []
    if isinstance(node, Observe):
        kept = state["shared"].pop((_PREFETCHED, id(node.pass_)), None)
        if kept is not None and kept[0] is node.pass_:
            result = kept[1]
        else:
            result = run_pass(model, node.pass_, state, batch_size=state["batch_size"])
        return steps.finish_observe(node, result, state, directory)
    if isinstance(node, Fit):
        runner = functools.partial(run_pass, batch_size=state["batch_size"])
        return steps.run_fit_step(node, model, state, directory, runner)
    if isinstance(node, Weights):
        return steps.run_weights(node, state, directory)
    raise RunError((getattr(node, "name", type(node).__name__),), "unknown plan node")


def prefetch(points: list, model: Any, *, batch_size: int | None = None,
             shared: dict) -> None:
    """Run the passes of ``points`` (one ``fusion.groups`` run) side by side, each
    intervened forward one trace over every point's rows; a point's results wait in
    ``shared`` for its own walk, which then runs no forward of its own.

    A failure leaves nothing behind: the points then run one at a time, and a point's own
    error is met on its own walk, at its own path, as if fusion had never been tried.
    """
    if len(points) < 2:
        return
    states = []
    for point in points:
        state = new_state(shared=shared, model_ref=point.model, digest=point.digest or "")
        state["point"], state["batch_size"] = point, batch_size
        states.append(state)
    kept = []
    try:
        for index in range(len(points[0].children)):
            passes = [point.children[index].pass_ for point in points]
            for pass_, result in zip(passes, _lockstep(model, passes, states)):
                kept.append((_PREFETCHED, id(pass_)))
                shared[kept[-1]] = (pass_, result)
    except Exception:
        for key in kept:
            shared.pop(key, None)


def discard_prefetched(point: Plan, shared: dict) -> None:
    """Drop what ``prefetch`` left for ``point`` and its walk did not take (it raised first)."""
    for node in point.children:
        if hasattr(node, "pass_"):
            shared.pop((_PREFETCHED, id(node.pass_)), None)


def _lockstep(model: Any, passes: list, states: list) -> list[dict]:
    """``run_pass`` over several passes of one signature at once (every row, no grad):
    un-intervened forwards from the document cache, intervened ones fused."""
    rows = tuple(range(passes[0].rows))
    resolved = [window_rules.resolve_pass(model, p, s) for p, s in zip(passes, states)]
    values: list[dict] = [{} for _ in passes]
    with torch.no_grad():
        for index, forward in enumerate(passes[0].forwards):
            each = [pass_.forwards[index] for pass_ in passes]
            if forward.writes:
                raws = _run_fused(model, passes, each, states, rows, resolved, values)
            else:
                _share_unintervened(model, passes, each, states, resolved)
                raws = [_forward_reads(model, passes[i], each[i], states[i], rows, resolved[i],
                                       values[i]) for i in range(len(passes))]
            for own, raw, known, state in zip(each, raws, values, states):
                for read in own.reads:
                    known[read.name] = _featurized(raw[read.name], read, state)
        results = [_results(pass_, rows, found, known)
                   for pass_, found, known in zip(passes, resolved, values)]
    for result in results:
        result["generated"] = {}
    return results


def _share_unintervened(model: Any, passes: list, each: list, states: list,
                        resolved: list) -> None:
    """Put every read the passes' un-intervened forwards still lack into the document
    cache, from one trace over the rows they share: each whole address is tapped once and
    serves every position read there, as a later point would be served from it."""
    cache, rows = states[0]["shared"], tuple(range(passes[0].rows))
    wanted, prepared, keyed, pending = {}, {}, [], set()
    for unit, (pass_, forward) in enumerate(zip(passes, each)):
        batch = pass_.inputs[forward.input]
        for index, read in enumerate(forward.reads):
            key = forwards.read_key(batch, read)
            if key in cache or key in wanted:
                continue
            whole = forwards.whole_key(pass_, forward, read, cache, pending)
            wanted[key] = (unit, read, whole)
            if whole is not None and (whole in cache or whole in pending):
                continue
            windows, _ = resolved[unit][("read", read.name, forward.input)]
            window = window_rules.layout(windows, rows, read.pos.ragged)
            out = (unit, read.name) if whole is None else whole
            pending.update(() if whole is None else (whole,))
            prepared[out] = {"kind": "read", "op": read, "out": out, "whole": whole is not None,
                             "window": window}
            keyed.append(((tuple(read.address.order), unit, index), out))
    if not wanted:
        return
    got = {}
    if prepared:
        inputs, position_ids = forwards.prompt_inputs(
            model, passes[0].inputs[each[0].input], rows, cache)
        got = _trace(model, inputs, position_ids, [out for _, out in sorted(keyed)], prepared)
    for whole in pending:
        cache[whole] = got[whole].detach()
    for key, (unit, read, whole) in wanted.items():
        if whole is not None:
            found = forwards.from_whole(cache[whole], passes[unit], each[unit], read,
                                        resolved[unit])
        else:
            counts = prepared[(unit, read.name)]["window"].flat_counts
            found = output_rules.Published(got[(unit, read.name)], counts, len(rows), "none")
        cache[key] = output_rules.Published(found.value.detach(), found.counts, len(rows), "none")


def _run_fused(model: Any, passes: list, each: list, states: list, rows: tuple,
               resolved: list, values: list) -> list[dict]:
    """One trace over every pass's rows stacked: pass ``i`` holds batch rows ``i·n …
    (i+1)·n − 1`` and its taps act there only; raw reads come back per pass."""
    local = {row: i for i, row in enumerate(rows)}
    prepared = {}
    for unit, (pass_, forward, state) in enumerate(zip(passes, each, states)):
        entries = _prepare(pass_, forward, state, rows, resolved[unit], values[unit], local,
                           forward.taps)
        for (kind, name), entry in entries.items():
            entry["window"] = fusion.shifted(entry["window"], unit * len(rows))
            entry["out"] = (unit, name)
            prepared[(unit, kind, name)] = entry
    inputs, position_ids = forwards.prompt_inputs(model, passes[0].inputs[each[0].input], rows,
                                                  states[0]["shared"])
    copies = len(passes)
    inputs = {key: tensor.repeat(copies, 1) for key, tensor in inputs.items()}
    got = _trace(model, inputs, position_ids.repeat(copies, 1), fusion.issue_order(each),
                 prepared)
    return [forwards.gathered(pass_, forward, rows, resolved[unit],
                              {read.name: [got[(unit, read.name)]] for read in forward.reads})
            for unit, (pass_, forward) in enumerate(zip(passes, each))]


def run_pass(model: Any, pass_: Pass, state: dict | None, *, rows=None,
             batch_size: int | None = None, grad: bool = False) -> dict:
    """Every forward of ``pass_`` over ``rows`` (default: all), then its metrics.

    Returns ``{"reads": {name: value}, "layouts": {name: Window}, "metrics": {name: (values,
    eligible pass-row indices)}, "positions": {op: {...}}, "rows": run rows, "generated":
    {"<model>[.<input>].generated": int64 (rows, decode)}}``. Read values
    are in their featurizer's space, rectangular ``(rows, w, width)`` or flat ``(total,
    width)`` as the plan's positions say, concatenated in ``rows`` order; ``"resolved"`` is
    the pass's windows over all its rows (``windows.resolve_pass``: ``(kind, name, input
    role) -> (windows, reasons)``, plus provenance). ``batch_size`` (default: the walk
    state's) cuts ``rows`` into windows, one trace each. With ``grad`` the graph through
    featurizer parameters is kept (a fit's update).
    """
    state = state if state is not None else new_state()
    if batch_size is not None:
        # The argument wins over the walk's own setting; a copy, so the caller's state keeps it.
        state = dict(state, batch_size=batch_size)
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
                raw = _cut_generated(model, pass_, forward, raw, ids, run_rows, resolved)
            for read in forward.reads:
                values[read.name] = _featurized(raw[read.name], read, state)
        result = _results(pass_, run_rows, resolved, values)
    result["generated"] = generated
    return result


def _results(pass_: Pass, run_rows: tuple, resolved: dict, values: dict) -> dict:
    reads = {name: published.value for name, published in values.items()}
    layouts = {}
    for forward in pass_.forwards:
        for read in forward.reads:
            windows, _ = resolved[("read", read.name, read.input)]
            if read.pos.frame == "generated":
                layouts[read.name] = Window.from_windows([windows[r] for r in run_rows],
                                                         ragged=read.pos.ragged)
            else:
                layouts[read.name] = window_rules.layout(windows, run_rows, read.pos.ragged)
    metrics = {}
    for metric in pass_.metrics:
        windows, _ = resolved[("read", metric.of, metric.input)]
        placed = [r for r in run_rows if windows[r]]
        metrics[metric.name] = score(metric, reads[metric.of], placed)
    positions = {key[1]: entry for key, entry in resolved.items() if key[0] == "provenance"}
    return {"reads": reads, "layouts": layouts, "metrics": metrics, "positions": positions,
            "rows": run_rows, "resolved": resolved}


def _featurized(raw: output_rules.Published, read: ReadOp, state: dict) -> output_rules.Published:
    """A read's raw gathered value expressed in its featurizer's space (float32)."""
    if read.address.component == "input_ids" or read.view == "logits":
        return raw
    featurizer = state["featurizers"].get(read.featurizer) if read.featurizer != "identity" else None
    return output_rules.Published(express(featurizer, raw.value), raw.counts, raw.rows, "none")


def _forward_reads(model: Any, pass_: Pass, forward: Forward, state: dict, run_rows: tuple,
                   resolved: dict, values: dict) -> dict:
    """Raw gathered reads of one forward over ``run_rows`` (pre-featurizer).

    A forward with no writes is computed once over all rows of its input and kept in the
    document-wide cache, so sweep points and fit updates that ask again are served from it.
    A decoding forward also yields its generated ids (under ``generate.GENERATED``) and
    its generated-frame reads stacked per step, ``(rows, decode, width)``, still uncut.
    """
    batch = pass_.inputs[forward.input]
    run = _run_decode if forward.decode else _run_forward
    if forward.writes:
        return run(model, pass_, forward, state, run_rows, resolved, values)
    cache = state["shared"]
    keys = {read.name: forwards.read_key(batch, read, forward.decode) for read in forward.reads}
    if forward.decode:
        keys[generate.GENERATED] = (forwards.batch_key(batch), generate.GENERATED, forward.decode)
    if any(key not in cache for key in keys.values()):
        every = tuple(range(pass_.rows))
        if forward.decode:
            fresh = run(model, pass_, forward, state, every, resolved, values)
        else:
            fresh = _shared_prompt_reads(model, pass_, forward, state, resolved, values, keys)
        for name, key in keys.items():
            cache[key] = output_rules.Published(
                fresh[name].value.detach(), fresh[name].counts, pass_.rows, "none")
    if run_rows == tuple(range(pass_.rows)):
        return {name: cache[key] for name, key in keys.items()}
    return {name: cache[key].slice_rows(run_rows) for name, key in keys.items()}


def _shared_prompt_reads(model: Any, pass_: Pass, forward: Forward, state: dict,
                         resolved: dict, values: dict, keys: dict) -> dict:
    """An un-intervened prompt forward's reads over all rows, for the document-wide cache.

    A small address is kept whole, so a later point reading it at other positions (the
    counterfactual forward of a position sweep) needs no forward of its own: its reads
    are gathered from the kept tensor exactly as the trace would have gathered them.
    """
    cache = state["shared"]
    todo = [read for read in forward.reads if keys[read.name] not in cache]
    wholes, fresh, pending = {}, set(), set()
    for read in todo:
        # Two reads at one address: the first keeps (and is charged for) the whole tensor.
        key = wholes[read.name] = forwards.whole_key(pass_, forward, read, cache, pending)
        if key is not None and key not in cache and key not in pending:
            pending.add(key)
            fresh.add(read.name)
    fresh = frozenset(fresh)
    got = {}
    if any(key is None or name in fresh for name, key in wholes.items()):
        got = _run_forward(model, pass_, forward, state, tuple(range(pass_.rows)), resolved,
                           values, whole=fresh)
    out = {}
    for read in forward.reads:
        name = read.name
        if name in fresh:
            cache[wholes[name]] = got[name].value.detach()
        if keys[name] in cache:
            out[name] = cache[keys[name]]
        elif wholes[name] is not None:
            out[name] = forwards.from_whole(cache[wholes[name]], pass_, forward, read, resolved)
        else:
            out[name] = got[name]
    return out


def _run_forward(model: Any, pass_: Pass, forward: Forward, state: dict, run_rows: tuple,
                 resolved: dict, values: dict, whole: frozenset = frozenset()) -> dict:
    """One trace per window of rows; raw reads concatenated in ``run_rows`` order (the
    reads named in ``whole`` as their address's whole tensor)."""
    local = {row: i for i, row in enumerate(run_rows)}
    pieces: dict[str, list] = {read.name: [] for read in forward.reads}
    for chunk in forwards.chunks(run_rows, state["batch_size"]):
        prepared = _prepare(pass_, forward, state, chunk, resolved, values, local, forward.taps)
        for name in whole:
            prepared[("read", name)]["whole"] = True
        inputs, position_ids = forwards.prompt_inputs(model, pass_.inputs[forward.input], chunk,
                                              state["shared"])
        got = _trace(model, inputs, position_ids, forward.taps, prepared)
        for name in pieces:
            pieces[name].append(got[name])
    return forwards.gathered(pass_, forward, run_rows, resolved, pieces, whole)


def _run_decode(model: Any, pass_: Pass, forward: Forward, state: dict, run_rows: tuple,
                resolved: dict, values: dict) -> dict:
    """A greedy decode of ``forward.decode`` tokens per window of rows (FORMAT §11)."""
    local = {row: i for i, row in enumerate(run_rows)}
    pieces: dict[str, list] = {read.name: [] for read in forward.reads}
    tokens = []
    for chunk in forwards.chunks(run_rows, state["batch_size"]):
        per_step, ids = _decode_chunk(model, pass_, forward, state, chunk, resolved, values, local)
        tokens.append(ids)
        for read in forward.reads:
            pieces[read.name].append(_step_value(pass_, read, per_step, forward.decode))
    out = forwards.gathered(pass_, forward, run_rows, resolved, pieces)
    out[generate.GENERATED] = output_rules.Published(torch.cat(tokens, 0), None, len(run_rows), "none")
    return out


def _step_value(pass_: Pass, read: ReadOp, per_step: list, decode: int) -> torch.Tensor:
    """A read's value over a chunk: its one step, or every step stacked for a later cut."""
    if read.pos.frame != "generated":
        return per_step[0][read.name]
    k = generate.fixed_step(read.pos)
    if k is not None:
        return per_step[k][read.name]
    where = ("interventions", pass_.intervention, "reads", read.name, "pos")
    return generate.stack([per_step[s][read.name] for s in range(decode)], where)


def _decode_chunk(model: Any, pass_: Pass, forward: Forward, state: dict, chunk: tuple,
                  resolved: dict, values: dict, local: dict) -> tuple[list, torch.Tensor]:
    """N traced steps over one KV cache: the prefill, then one generated token per step.

    Each step feeds the argmax of the logits the previous step's writes left; the cache
    carries every earlier step's writes forward, as a cached decode does.
    """
    from transformers import DynamicCache

    inputs, position_ids = forwards.prompt_inputs(model, pass_.inputs[forward.input], chunk,
                                              state["shared"])
    cache = DynamicCache(config=model._model.config)
    per_step, tokens = [], []
    for step in range(forward.decode):
        taps = generate.step_taps(forward, step)
        last = inputs["input_ids"].shape[1] - 1
        prepared = _prepare(pass_, forward, state, chunk, resolved, values, local, taps, last)
        got = _trace(model, inputs, position_ids, taps, prepared, cache)
        token = got.pop(generate.GENERATED)
        per_step.append(got)
        tokens.append(token)
        mask = inputs["attention_mask"]
        inputs = {"input_ids": token[:, None],
                  "attention_mask": torch.cat([mask, torch.ones_like(mask[:, :1])], 1)}
        position_ids = position_ids[:, -1:] + 1
    return per_step, torch.stack(tokens, 1).to(torch.int64)


def _cut_generated(model: Any, pass_: Pass, forward: Forward, raw: dict, ids: torch.Tensor,
                   run_rows: tuple, resolved: dict) -> dict:
    """Resolve each generated-frame read on the continuation and cut its stacked steps."""
    decode_text = window_rules.decoder(model)
    stops = generate.eos_ids(model)
    batch = pass_.inputs[forward.input]
    cut = dict(raw)
    for read in forward.reads:
        if read.pos.frame != "generated":
            continue
        where = ("interventions", pass_.intervention, "reads", read.name)
        found = generate.resolve_rows(read.pos, batch, run_rows, ids, decode_text, stops, where)
        key = ("read", read.name, forward.input)
        windows, reasons = (list(part) for part in resolved[key])
        for row, (window, reason) in zip(run_rows, found):
            windows[row], reasons[row] = window, reason
        resolved[key] = (tuple(windows), tuple(reasons))
        resolved[("provenance", read.name, forward.input)] = generate.provenance(
            [(windows[r], reasons[r]) for r in run_rows], ids, decode_text)
        if generate.fixed_step(read.pos) is None:
            value = generate.cut(raw[read.name].value, [w for w, _ in found], read.pos.ragged)
            counts = Window.from_windows([w for w, _ in found], ragged=read.pos.ragged).flat_counts
            cut[read.name] = output_rules.Published(value, counts, len(run_rows), "none")
    return cut


def _prepare(pass_: Pass, forward: Forward, state: dict, chunk: tuple, resolved: dict,
             values: dict, local: dict, taps: tuple, last: int | None = None) -> dict:
    """Per tap: the op, its window over this chunk, its featurizer and operand.

    A generated-frame op lands on ``last``, the last index of its decode step's sequence.
    """
    ops = forwards.tap_ops(forward)
    prepared = {}
    for kind, name in taps:
        op = ops[(kind, name)]
        if op.pos.frame == "generated":
            window = Window.from_windows([(last,)] * len(chunk))
        else:
            windows, _ = resolved[(kind, name, forward.input)]
            window = window_rules.layout(windows, chunk, op.pos.ragged)
        entry = {"kind": kind, "op": op, "window": window}
        if kind == "write":
            name_f = op.featurizer
            entry["featurizer"] = state["featurizers"].get(name_f) if name_f != "identity" else None
            entry["operand"] = _operand(op, pass_, state, chunk, values, local, window)
        prepared[(kind, name)] = entry
    return prepared


def _operand(write: WriteOp, pass_: Pass, state: dict, chunk: tuple, values: dict,
             local: dict, window: Window) -> Any:
    operand = write.operand
    if operand.kind == "literal":
        return operand.value
    if operand.kind == "none":
        return None
    if operand.kind == "read":
        published = values[operand.name].slice_rows([local[r] for r in chunk])
        return published.value
    published = state["published"].get(operand.name)
    if published is None:
        raise RunError(("interventions", pass_.intervention, "writes", write.name, "operand"),
                       f"no published output {operand.name!r}")
    if published.reduce != "none":
        return published.value
    sliced = published.slice_rows(chunk)
    if sliced.counts is not None and tuple(sliced.counts) != tuple(window.counts):
        bad = [row for row, a, b in zip(chunk, sliced.counts, window.counts) if a != b]
        raise RunError(("interventions", pass_.intervention, "writes", write.name, "operand"),
                       f"operand {operand.name!r} was read over a different number of positions "
                       f"on rows {bad}")
    return sliced.value


def _trace(model: Any, inputs: dict, position_ids: torch.Tensor, taps: tuple, prepared: dict,
           cache: Any = None) -> dict:
    """One nnterp trace: the taps in order; with a KV cache (a decode step) also the
    greedy next token, under ``generate.GENERATED``."""
    nested = frozenset(entry["op"].address.layer for entry in prepared.values()
                       if entry["op"].address.key_axis)
    places = Places(model, nested)
    kwargs = {} if cache is None else {"cache": cache, "use_cache": True}
    got: dict = {}
    with model.trace(inputs, position_ids=position_ids, **kwargs):
        _issue(places, taps, prepared, got)
        if cache is not None:
            # A write at ``logits`` chooses the next token; the model's own output lacks it.
            logits = places.written_logits
            logits = model.output.logits if logits is None else logits
            got[generate.GENERATED] = logits[:, -1].argmax(-1)
    return got


def _issue(places: Places, taps: tuple, prepared: dict, got: dict) -> None:
    """The taps, in the plan's forward order; writes at an address before its reads.

    A tap is a key of ``prepared``; its value lands in ``got`` under the entry's ``out``
    (a fused point's ``(point, name)``) or the op's name.
    """
    for tap in taps:
        entry = prepared[tap]
        kind, op, window = entry["kind"], entry["op"], entry["window"]
        name = entry.get("out", op.name)
        address = op.address
        places.settle(address.order)
        activation = places.get(address)
        if kind == "write":
            original = places.original[(address.component, address.layer)]
            places.put(address, apply_write(activation, op, window, entry["featurizer"],
                                            entry["operand"], original))
            continue
        if entry.get("whole"):
            # Kept past this forward: a copy, safe from any in-place update after the tap.
            got[name] = activation.detach().clone()
            continue
        value = gather(activation, address, window)
        if op.view == "logits":
            value = project_to_vocabulary(places.model, value)
        got[name] = value
    places.settle()

