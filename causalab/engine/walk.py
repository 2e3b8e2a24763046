"""The walk: a plan tree run in written order on nnterp, the only place a trace is opened.

It turns plan data into tensors: each forward of a pass is one nnterp trace per window of
rows, taps issued in the plan's order, writes through the seam's one ``apply_write``, reads
through its one ``gather``. It never reads a document, a data table or a config: what it
needs was compiled into the plan, except positions, which it resolves per row against the
ids the model runs on (FORMAT §6). Un-intervened forwards are shared: their reads are kept
per document, keyed by the exact ids, so the points of a sweep compute them once.
Generation (``decode > 0``) is not run by this walk and is refused when met.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from causalab.compile import positions as position_rules
from causalab.compile.plan import (Featurizers, Fit, Forward, Observe, Pass, Plan, PromptBatch,
                                   ReadOp, SaveOp, Weights, WriteOp)
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
    eligible pass-row indices)}, "positions": {op: {...}}, "rows": run rows}``. Read values
    are in their featurizer's space, rectangular ``(rows, w, width)`` or flat ``(total,
    width)`` as the plan's positions say, concatenated in ``rows`` order. With ``grad`` the
    graph through featurizer parameters is kept (a fit's update).
    """
    state = state if state is not None else new_state()
    run_rows = tuple(range(pass_.rows)) if rows is None else tuple(int(r) for r in rows)
    resolved = _resolved(model, pass_, state)
    values: dict[str, output_rules.Published] = {}
    with torch.set_grad_enabled(grad):
        for forward in pass_.forwards:
            if forward.decode:
                raise RunError(("interventions", pass_.intervention, "decode"),
                               "generation (decode > 0) is not supported by this engine yet")
            raw = _forward_reads(model, pass_, forward, state, run_rows, resolved, values)
            for read in forward.reads:
                values[read.name] = _featurized(raw[read.name], read, state)
        result = _results(pass_, run_rows, resolved, values)
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
            where = ("interventions", pass_.intervention, kind + "s", op.name)
            found = [_resolve_row(op.pos, batch, row, decode, where) for row in range(pass_.rows)]
            resolved[op_key] = (tuple(w for w, _ in found), tuple(r for _, r in found))
            if kind == "write":
                _refuse_empty_write(op, resolved[op_key], pass_, where)
            elif pass_.dynamic:
                resolved[("provenance", op.name, forward.input)] = _provenance(
                    resolved[op_key], batch, decode)
    _check_operand_windows(pass_, resolved)
    state["windows"][key] = resolved
    return resolved


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
            if write.operand.kind != "read" or not write.pos.ragged:
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


def _read_key(batch: PromptBatch, read: ReadOp) -> tuple:
    return (_batch_key(batch), read.address, read.pos, read.view)


def _forward_reads(model: Any, pass_: Pass, forward: Forward, state: dict, run_rows: tuple,
                   resolved: dict, values: dict) -> dict:
    """Raw gathered reads of one forward over ``run_rows`` (pre-featurizer).

    A forward with no writes is computed once over all rows of its input and kept in the
    document-wide cache, so sweep points and fit updates that ask again are served from it.
    """
    batch = pass_.inputs[forward.input]
    if forward.writes:
        return _run_forward(model, pass_, forward, state, run_rows, resolved, values)
    cache = state["shared"]
    keys = {read.name: _read_key(batch, read) for read in forward.reads}
    if any(key not in cache for key in keys.values()):
        every = tuple(range(pass_.rows))
        fresh = _run_forward(model, pass_, forward, state, every, resolved, values)
        for read in forward.reads:
            cache[keys[read.name]] = output_rules.Published(
                fresh[read.name].value.detach(), fresh[read.name].counts, pass_.rows, "none")
    if run_rows == tuple(range(pass_.rows)):
        return {name: cache[key] for name, key in keys.items()}
    return {name: cache[key].slice_rows(run_rows) for name, key in keys.items()}


def _chunks(rows: tuple, batch_size: int | None) -> list[tuple]:
    if not batch_size or batch_size >= len(rows):
        return [rows]
    return [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]


def _run_forward(model: Any, pass_: Pass, forward: Forward, state: dict, run_rows: tuple,
                 resolved: dict, values: dict) -> dict:
    """One trace per window of rows; raw reads concatenated in ``run_rows`` order."""
    local = {row: i for i, row in enumerate(run_rows)}
    pieces: dict[str, list] = {read.name: [] for read in forward.reads}
    for chunk in _chunks(run_rows, state["batch_size"]):
        prepared = _prepare(pass_, forward, state, chunk, resolved, values, local)
        got = _trace(model, pass_.inputs[forward.input], chunk, forward, prepared)
        for name in pieces:
            pieces[name].append(got[name])
    out = {}
    for read in forward.reads:
        windows, _ = resolved[("read", read.name, forward.input)]
        layout = Window.from_windows([windows[r] for r in run_rows], ragged=read.pos.ragged)
        value = torch.cat(pieces[read.name], 0) if len(pieces[read.name]) > 1 else pieces[read.name][0]
        counts = None if layout.width is not None else layout.counts
        out[read.name] = output_rules.Published(value, counts, len(run_rows), "none")
    return out


def _prepare(pass_: Pass, forward: Forward, state: dict, chunk: tuple, resolved: dict,
             values: dict, local: dict) -> dict:
    """Per tap: the op, its window over this chunk, its featurizer and operand."""
    device = _device_of(state)
    ops = {("write", w.name): w for w in forward.writes}
    ops.update({("read", r.name): r for r in forward.reads})
    prepared = {}
    for kind, name in forward.taps:
        op = ops[(kind, name)]
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


def _trace(model: Any, batch: PromptBatch, chunk: tuple, forward: Forward, prepared: dict) -> dict:
    """One nnterp trace over the rows ``chunk``: position ids from the mask, taps in order."""
    device = model._model.get_input_embeddings().weight.device
    ids = torch.tensor([batch.input_ids[r] for r in chunk], dtype=torch.long, device=device)
    mask = torch.tensor([batch.attention_mask[r] for r in chunk], dtype=torch.long, device=device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    nested = frozenset(entry["op"].address.layer for entry in prepared.values()
                       if entry["op"].address.component in _KEY_AXIS)
    places = Places(model, nested)
    got: dict = {}
    with model.trace({"input_ids": ids, "attention_mask": mask}, position_ids=position_ids):
        _issue(places, forward, prepared, got)
    return got


def _issue(places: Places, forward: Forward, prepared: dict, got: dict) -> None:
    """The taps, in the plan's forward order; writes at an address before its reads."""
    for kind, name in forward.taps:
        entry = prepared[(kind, name)]
        op, window = entry["op"], entry["window"]
        address = op.address
        activation = places.get(address)
        if kind == "write":
            original = places.original[(address.component, address.layer)]
            places.put(address, apply_write(activation, op, window, entry["featurizer"],
                                            entry["operand"], original))
            continue
        value = gather(activation, address, window)
        if op.view == "logits":
            value = project_to_vocabulary(places.model, value)
        got[name] = value


def save_value(save: SaveOp, directory: Path, value: Any, metadata: dict | None = None) -> str:
    """Write one save (a table's rows or a tensor) under ``directory``."""
    path = directory / save.file_path
    if save.kind == "table":
        return record.write_json(path, value)
    return record.write_tensor(path, value, metadata)
