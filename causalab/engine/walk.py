"""The walk: a plan tree run in written order on nnterp, the only place a trace is opened.

It turns plan data into tensors: each forward of a pass is one nnterp trace per window of
rows, taps issued in the plan's order, writes through the seam's one ``apply_write``, reads
through its one ``gather``. It never reads a document, a data table or a config: what it
needs was compiled into the plan, except positions, which it resolves per row against the
ids the model runs on (FORMAT §6). Un-intervened forwards are shared: their reads are kept
per document, keyed by the exact ids, so the points of a sweep compute them once.
A decoding forward (``decode > 0``, FORMAT §11) is one trace per decode step over one KV
cache; which taps act at which step and how stacked generated reads are cut is
``causalab.engine.generate``'s business.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from causalab.compile import positions as position_rules
from causalab.compile.plan import (Featurizers, Fit, Forward, Observe, Pass, Plan, PromptBatch,
                                   ReadOp, SaveOp, Weights, WriteOp)
from causalab.engine import generate
from causalab.engine import outputs as output_rules
from causalab.engine import record, steps
from causalab.engine.events import Events
from causalab.engine.metrics import score
from causalab.engine.seam import Window, apply_write, express, gather
from causalab.engine.sites import Places, project_to_vocabulary
from causalab.errors import RunError
from causalab.files import DOCUMENT

_KEY_AXIS = ("attention_scores", "attention_probs")


def new_state(*, shared: dict | None = None, model_ref: Any = None, digest: str = "") -> dict:
    """A plan's walk state: live featurizers, published outputs, and caches it may share."""
    return {"featurizers": {}, "specs": {}, "published": {}, "windows": {},
            "shared": {} if shared is None else shared, "model_ref": model_ref,
            "digest": digest or "", "events": Events(), "point": None, "batch_size": None}


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
    state["events"], state["batch_size"] = events, batch_size
    directory = Path(out) / plan.directory
    written: list[str] = []
    if plan.directory and plan.document is not None:
        written.append(record.write_json(directory / DOCUMENT, plan.document))
    for node in plan.children:
        written += _run_node(node, model, state, out, directory)
    return written


def _run_node(node: Any, model: Any, state: dict, out: str, directory: Path) -> list[str]:
    if isinstance(node, Plan):
        return run_plan(node, model, out=out, batch_size=state["batch_size"],
                        events=state["events"], state=state)
    if isinstance(node, Featurizers):
        steps.build_featurizers(node, model, state)
        return []
    if isinstance(node, Observe):
        result = run_pass(model, node.pass_, state, batch_size=state["batch_size"])
        return steps.finish_observe(node, result, state, directory)
    if isinstance(node, Fit):
        runner = functools.partial(run_pass, batch_size=state["batch_size"])
        return steps.run_fit_step(node, model, state, directory, runner)
    if isinstance(node, Weights):
        return steps.run_weights(node, state, directory)
    raise RunError((getattr(node, "name", type(node).__name__),), "unknown plan node")


def run_pass(model: Any, pass_: Pass, state: dict | None, *, rows=None,
             batch_size: int | None = None, grad: bool = False) -> dict:
    """Every forward of ``pass_`` over ``rows`` (default: all), then its metrics.

    Returns ``{"reads": {name: value}, "layouts": {name: Window}, "metrics": {name: (values,
    eligible pass-row indices)}, "positions": {op: {...}}, "rows": run rows, "generated":
    {"<model>[.<input>].generated": int64 (rows, decode)}}``. Read values
    are in their featurizer's space, rectangular ``(rows, w, width)`` or flat ``(total,
    width)`` as the plan's positions say, concatenated in ``rows`` order. With ``grad`` the
    graph through featurizer parameters is kept (a fit's update).
    """
    state = state if state is not None else new_state()
    run_rows = tuple(range(pass_.rows)) if rows is None else tuple(int(r) for r in rows)
    resolved = _resolved(model, pass_, state)
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
            layouts[read.name] = Window.from_windows([windows[r] for r in run_rows],
                                                     ragged=read.pos.ragged)
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


def _decode(model: Any):
    tokenizer = model.tokenizer
    return lambda ids: tokenizer.decode(list(ids))


def _resolved(model: Any, pass_: Pass, state: dict) -> dict:
    """Windows of every read and write over ALL rows of the pass, resolved once (§6.2, §6.5)."""
    key = id(pass_)
    if key in state["windows"]:
        return state["windows"][key]
    decode = _decode(model)
    if pass_.dynamic:
        for role, batch in pass_.inputs.items():
            _check_tokenizer(model, batch, pass_)
    resolved: dict = {}
    for forward in pass_.forwards:
        batch = pass_.inputs[forward.input]
        for op in (*forward.writes, *forward.reads):
            kind = "write" if isinstance(op, WriteOp) else "read"
            op_key = (kind, op.name, forward.input)
            if op_key in resolved:
                continue
            if op.pos.frame == "generated":
                # Known once the continuation is: filled in by _cut_generated.
                resolved[op_key] = (((),) * pass_.rows, (position_rules.MISSING,) * pass_.rows)
                continue
            where = ("interventions", pass_.intervention, kind + "s", op.name)
            resolved[op_key] = _windows(op.pos, batch, pass_.rows, decode, where, state)
            if kind == "write":
                _refuse_empty_write(op, resolved[op_key], pass_, where)
            elif pass_.dynamic:
                resolved[("provenance", op.name, forward.input)] = _provenance(
                    resolved[op_key], batch, decode)
    _check_operand_windows(pass_, resolved)
    state["windows"][key] = resolved
    return resolved


def _windows(spec, batch: PromptBatch, rows: int, decode, where: tuple, state: dict) -> tuple:
    """(windows, reasons) of ``spec`` on every row; an unscoped prompt cut depends on the
    masks and prefix alone, so a document's points share it."""
    key = None
    if spec.frame == "prompt" and spec.variable is None and spec.segment is None:
        key = ("positions", spec, batch.attention_mask, batch.prefix, rows)
        if key in state["shared"]:
            return state["shared"][key]
    found = [_resolve_row(spec, batch, row, decode, where) for row in range(rows)]
    result = (tuple(w for w, _ in found), tuple(r for _, r in found))
    if key is not None:
        state["shared"][key] = result
    return result


def _resolve_row(spec, batch: PromptBatch, row: int, decode, where: tuple):
    try:
        return position_rules.resolve(spec, batch, row, decode)
    except RunError as error:
        raise RunError(where + ("pos",) + error.path, error.message) from None


def _check_tokenizer(model: Any, batch: PromptBatch, pass_: Pass) -> None:
    """R4: row 0's ids must decode to the prompt recorded at compile time."""
    if not batch.prompts:
        return
    start, end = position_rules.content_span(batch.attention_mask[0], (batch.role, 0))
    ids = list(batch.input_ids[0][start + batch.prefix:end])
    tokenizer = model.tokenizer
    seen = {tokenizer.decode(ids), tokenizer.decode(ids, skip_special_tokens=True)}
    if batch.prompts[0] not in seen:
        raise RunError(("interventions", pass_.intervention, batch.role),
                       f"tokenizer skew: row 0 decodes to {sorted(seen)[0]!r}, "
                       f"not the recorded prompt {batch.prompts[0]!r}")


def _provenance(found: tuple, batch: PromptBatch, decode) -> dict:
    windows, reasons = found
    tokens = tuple(tuple(decode([batch.input_ids[row][p]]) for p in window)
                   for row, window in enumerate(windows))
    return {"windows": windows, "reasons": reasons, "tokens": tokens}


def _refuse_empty_write(write: WriteOp, found: tuple, pass_: Pass, where: tuple) -> None:
    """R1: a write may not skip a row (a read may)."""
    windows, reasons = found
    empty = {pass_.example_ids[row] if row < len(pass_.example_ids) else str(row): reasons[row]
             for row, window in enumerate(windows) if not window}
    if empty:
        raise RunError(where, f"write {write.name!r} has an empty window on rows {empty}; "
                              "a read may skip a row, a write may not")


def _check_operand_windows(pass_: Pass, resolved: dict) -> None:
    """R2: a ragged write meets a read operand over the same number of positions per row."""
    for forward in pass_.forwards:
        for write in forward.writes:
            if write.operand.kind != "read" or not write.pos.ragged or write.pos.frame == "generated":
                continue
            source = next(((f.input, r) for f in pass_.forwards for r in f.reads
                           if r.name == write.operand.name), None)
            if source is None:
                continue
            mine, _ = resolved[("write", write.name, forward.input)]
            theirs, _ = resolved[("read", source[1].name, source[0])]
            bad = [row for row in range(pass_.rows) if len(mine[row]) != len(theirs[row])]
            if bad:
                raise RunError(("interventions", pass_.intervention, "writes", write.name, "operand"),
                               f"write {write.name!r} and its operand {write.operand.name!r} cover "
                               f"different numbers of positions on rows {bad}")


def _batch_key(batch: PromptBatch) -> tuple:
    return (batch.input_ids, batch.attention_mask)


def _read_key(batch: PromptBatch, read: ReadOp, decode: int = 0) -> tuple:
    return (_batch_key(batch), read.address, read.pos, read.view, decode)


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
    keys = {read.name: _read_key(batch, read, forward.decode) for read in forward.reads}
    if forward.decode:
        keys[generate.GENERATED] = (_batch_key(batch), generate.GENERATED, forward.decode)
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


# An un-intervened address tensor is kept whole when at most this big and while the
# document's kept tensors fit the budget; otherwise its reads are kept gathered.
_WHOLE_BYTES, _WHOLE_BUDGET, _WHOLE_SPENT = 32 * 2 ** 20, 512 * 2 ** 20, "whole bytes"


def _whole_key(pass_: Pass, forward: Forward, read: ReadOp, cache: dict) -> tuple | None:
    """The cache key of ``read``'s whole address tensor (a new one is charged to the
    budget), or None: only plain prompt reads of known width (not vocabulary, not keys)."""
    address, batch = read.address, pass_.inputs[forward.input]
    if read.view != "raw" or not address.full_width or address.key_axis or read.pos.frame != "prompt":
        return None
    key = ("whole", _batch_key(batch), address.component, address.layer)
    if key in cache:
        return key
    size = pass_.rows * len(batch.input_ids[0] if pass_.rows else ()) * address.full_width * 4
    spent = cache.get(_WHOLE_SPENT, 0) + size
    if size > _WHOLE_BYTES or spent > _WHOLE_BUDGET:
        return None
    cache[_WHOLE_SPENT] = spent
    return key


def _shared_prompt_reads(model: Any, pass_: Pass, forward: Forward, state: dict,
                         resolved: dict, values: dict, keys: dict) -> dict:
    """An un-intervened prompt forward's reads over all rows, for the document-wide cache.

    A small address is kept whole, so a later point reading it at other positions (the
    counterfactual forward of a position sweep) needs no forward of its own: its reads
    are gathered from the kept tensor exactly as the trace would have gathered them.
    """
    cache = state["shared"]
    todo = [read for read in forward.reads if keys[read.name] not in cache]
    wholes = {read.name: _whole_key(pass_, forward, read, cache) for read in todo}
    fresh = frozenset(name for name, key in wholes.items() if key is not None and key not in cache)
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
            out[name] = _from_whole(cache[wholes[name]], pass_, forward, read, resolved)
        else:
            out[name] = got[name]
    return out


def _from_whole(tensor: torch.Tensor, pass_: Pass, forward: Forward, read: ReadOp,
                resolved: dict) -> output_rules.Published:
    windows, _ = resolved[("read", read.name, forward.input)]
    window = Window.from_windows(windows, ragged=read.pos.ragged)
    counts = None if window.width is not None else window.counts
    return output_rules.Published(gather(tensor, read.address, window), counts, pass_.rows, "none")


def _chunks(rows: tuple, batch_size: int | None) -> list[tuple]:
    if not batch_size or batch_size >= len(rows):
        return [rows]
    return [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]


def _gathered(pass_: Pass, forward: Forward, run_rows: tuple, resolved: dict,
              pieces: dict, whole: frozenset = frozenset()) -> dict:
    """Per-chunk raw reads concatenated in ``run_rows`` order, with their prompt layouts;
    a read in ``whole`` is its address's whole tensor, ``(rows, …)``."""
    out = {}
    for read in forward.reads:
        value = torch.cat(pieces[read.name], 0) if len(pieces[read.name]) > 1 else pieces[read.name][0]
        counts = None
        if read.pos.frame != "generated" and read.name not in whole:
            windows, _ = resolved[("read", read.name, forward.input)]
            layout = Window.from_windows([windows[r] for r in run_rows], ragged=read.pos.ragged)
            counts = None if layout.width is not None else layout.counts
        out[read.name] = output_rules.Published(value, counts, len(run_rows), "none")
    return out


def _run_forward(model: Any, pass_: Pass, forward: Forward, state: dict, run_rows: tuple,
                 resolved: dict, values: dict, whole: frozenset = frozenset()) -> dict:
    """One trace per window of rows; raw reads concatenated in ``run_rows`` order (the
    reads named in ``whole`` as their address's whole tensor)."""
    local = {row: i for i, row in enumerate(run_rows)}
    pieces: dict[str, list] = {read.name: [] for read in forward.reads}
    for chunk in _chunks(run_rows, state["batch_size"]):
        prepared = _prepare(pass_, forward, state, chunk, resolved, values, local, forward.taps)
        for name in whole:
            prepared[("read", name)]["whole"] = True
        inputs, position_ids = _prompt_inputs(model, pass_.inputs[forward.input], chunk,
                                              state["shared"])
        got = _trace(model, inputs, position_ids, forward.taps, prepared)
        for name in pieces:
            pieces[name].append(got[name])
    return _gathered(pass_, forward, run_rows, resolved, pieces, whole)


def _run_decode(model: Any, pass_: Pass, forward: Forward, state: dict, run_rows: tuple,
                resolved: dict, values: dict) -> dict:
    """A greedy decode of ``forward.decode`` tokens per window of rows (FORMAT §11)."""
    local = {row: i for i, row in enumerate(run_rows)}
    pieces: dict[str, list] = {read.name: [] for read in forward.reads}
    tokens = []
    for chunk in _chunks(run_rows, state["batch_size"]):
        per_step, ids = _decode_chunk(model, pass_, forward, state, chunk, resolved, values, local)
        tokens.append(ids)
        for read in forward.reads:
            pieces[read.name].append(_step_value(pass_, read, per_step, forward.decode))
    out = _gathered(pass_, forward, run_rows, resolved, pieces)
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

    inputs, position_ids = _prompt_inputs(model, pass_.inputs[forward.input], chunk,
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
    decode_text = _decode(model)
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
            layout = Window.from_windows([w for w, _ in found], ragged=read.pos.ragged)
            counts = None if layout.width is not None else layout.counts
            cut[read.name] = output_rules.Published(value, counts, len(run_rows), "none")
    return cut


def _prepare(pass_: Pass, forward: Forward, state: dict, chunk: tuple, resolved: dict,
             values: dict, local: dict, taps: tuple, last: int | None = None) -> dict:
    """Per tap: the op, its window over this chunk, its featurizer and operand.

    A generated-frame op lands on ``last``, the last index of its decode step's sequence.
    """
    device = _device_of(state)
    ops = {("write", w.name): w for w in forward.writes}
    ops.update({("read", r.name): r for r in forward.reads})
    prepared = {}
    for kind, name in taps:
        op = ops[(kind, name)]
        if op.pos.frame == "generated":
            window = Window.from_windows([(last,)] * len(chunk))
        else:
            windows, _ = resolved[(kind, name, forward.input)]
            window = Window.from_windows([windows[r] for r in chunk], ragged=op.pos.ragged)
        entry = {"kind": kind, "op": op, "window": window if device is None else window.to(device)}
        if kind == "write":
            name_f = op.featurizer
            entry["featurizer"] = state["featurizers"].get(name_f) if name_f != "identity" else None
            entry["operand"] = _operand(op, pass_, state, chunk, values, local, window)
        prepared[(kind, name)] = entry
    return prepared


def _device_of(state: dict):
    return state.get("device")


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


def _prompt_inputs(model: Any, batch: PromptBatch, chunk: tuple,
                   shared: dict) -> tuple[dict, torch.Tensor]:
    """The rows ``chunk`` as model inputs, position ids taken from the mask (§18.7).

    The whole batch is made into tensors once per document (a sweep point's batch is a
    new object holding equal rows, hence the value key); a chunk is a row selection.
    """
    device = model._model.get_input_embeddings().weight.device
    key = ("inputs", _batch_key(batch), str(device))
    whole = shared.get(key)
    if whole is None:
        ids = torch.tensor(batch.input_ids, dtype=torch.long, device=device)
        mask = torch.tensor(batch.attention_mask, dtype=torch.long, device=device)
        whole = shared[key] = (ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    if chunk == tuple(range(len(batch.input_ids))):
        ids, mask, position_ids = whole
    else:
        index = torch.tensor(chunk, dtype=torch.long, device=device)
        ids, mask, position_ids = (t.index_select(0, index) for t in whole)
    return {"input_ids": ids, "attention_mask": mask}, position_ids


def _trace(model: Any, inputs: dict, position_ids: torch.Tensor, taps: tuple, prepared: dict,
           cache: Any = None) -> dict:
    """One nnterp trace: the taps in order; with a KV cache (a decode step) also the
    greedy next token, under ``generate.GENERATED``."""
    nested = frozenset(entry["op"].address.layer for entry in prepared.values()
                       if entry["op"].address.component in _KEY_AXIS)
    places = Places(model, nested)
    kwargs = {} if cache is None else {"cache": cache, "use_cache": True}
    got: dict = {}
    with model.trace(inputs, position_ids=position_ids, **kwargs):
        _issue(places, taps, prepared, got)
        if cache is not None:
            got[generate.GENERATED] = model.output.logits[:, -1].argmax(-1)
    return got


def _issue(places: Places, taps: tuple, prepared: dict, got: dict) -> None:
    """The taps, in the plan's forward order; writes at an address before its reads."""
    for kind, name in taps:
        entry = prepared[(kind, name)]
        op, window = entry["op"], entry["window"]
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


def save_value(save: SaveOp, directory: Path, value: Any, metadata: dict | None = None) -> str:
    """Write one save (a table's rows or a tensor) under ``directory``."""
    path = directory / save.file_path
    if save.kind == "table":
        return record.write_json(path, value)
    return record.write_tensor(path, value, metadata)
