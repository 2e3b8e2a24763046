"""Windows: where each read and write of a pass lands on every row, resolved before any trace.

Plain python over the plan's prompt batches and the model's tokenizer (to decode ids for a
scoped position and to check R4). It never opens a trace and never touches an activation;
positions are resolved by ``causalab.compile.positions``, the one place that knows the
forms. Refusals found here (R1 empty write windows, R2 operand widths, R4 tokenizer skew)
carry the intervention's path. An unscoped prompt cut is kept per document, since the
points of a sweep share it.
"""
from __future__ import annotations

from typing import Any

from causalab.compile import positions as position_rules
from causalab.compile.plan import Pass, PromptBatch, WriteOp
from causalab.engine.seam import Window
from causalab.errors import RunError


def decoder(model: Any):
    """``ids -> text`` with the model's tokenizer (what a scoped position matches against)."""
    tokenizer = model.tokenizer
    return lambda ids: tokenizer.decode(list(ids))


def layout(windows: tuple, rows, ragged: bool) -> Window:
    """The window of ``rows`` of a pass whose windows over ALL its rows are ``windows``.

    Flat when the positions are ragged or the pass's rows differ in width (a read some rows
    cannot place), decided once over every row (docs/format.md §6.2): a batch window of placed rows only
    must not come back rectangular while another comes back flat.
    """
    widths = {len(window) for window in windows}
    flat = ragged or len(widths) != 1 or 0 in widths
    return Window.from_windows([windows[r] for r in rows], ragged=flat)


def resolve_pass(model: Any, pass_: Pass, state: Any) -> dict:
    """Windows of every read and write over ALL rows of the pass, resolved once (docs/format.md §6.2, §6.4).

    Keyed ``(kind, name, input role) -> (windows, reasons)``, plus ``("provenance", name,
    role)`` for the reads of a dynamic pass; kept in ``state.windows`` per pass.
    """
    key = id(pass_)
    if key in state.windows:
        return state.windows[key]
    decode = decoder(model)
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
    state.windows[key] = resolved
    return resolved


def _windows(spec, batch: PromptBatch, rows: int, decode, where: tuple, state: Any) -> tuple:
    """(windows, reasons) of ``spec`` on every row; an unscoped prompt cut depends on the
    masks and prefix alone, so a document's points share it."""
    key = None
    if spec.frame == "prompt" and spec.variable is None and spec.segment is None:
        key = ("positions", spec, batch.attention_mask, batch.prefix, rows)
        if key in state.cache.positions:
            return state.cache.positions[key]
    found = [_resolve_row(spec, batch, row, decode, where) for row in range(rows)]
    result = (tuple(w for w, _ in found), tuple(r for _, r in found))
    if key is not None:
        state.cache.positions[key] = result
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
    """R2: a write meets a read operand over the same number of positions on every row. A
    width the document fixes is checked at validate (V17); this catches what only rows show:
    an anchored or ``all`` operand, or one whose read skipped a row."""
    for forward in pass_.forwards:
        for write in forward.writes:
            if write.operand.kind != "read" or write.pos.frame == "generated":
                continue
            source = next(((f.input, r) for f in pass_.forwards for r in f.reads
                           if r.name == write.operand.name), None)
            if source is None:
                continue
            mine, _ = resolved[("write", write.name, forward.input)]
            theirs, _ = resolved[("read", source[1].name, source[0])]
            bad = [row for row in range(pass_.rows) if len(mine[row]) != len(theirs[row])]
            if bad:
                first = bad[0]
                raise RunError(("interventions", pass_.intervention, "writes", write.name, "operand"),
                               f"write {write.name!r} and its operand {write.operand.name!r} cover "
                               f"different numbers of positions on rows {bad} (row {first}: "
                               f"{len(mine[first])} written, {len(theirs[first])} read)")
