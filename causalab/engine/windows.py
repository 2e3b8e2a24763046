"""Windows: where each read and write of a pass lands on every row, the engine's one place for positions.

Plain python over the plan's prompt batches and the model's tokenizer (to decode ids for a
scoped position and to check R4). It never opens a trace and never touches an activation;
every row is resolved by ``causalab.compile.positions.resolve_rows``, the one place that
knows the forms, called only from here: the prompt frame before any trace, a generated frame
once its decode has run. Refusals found here (R1 empty write windows, R2 operand widths, R4
tokenizer skew) carry the intervention's path. An unscoped prompt cut is kept per document,
since the points of a sweep share it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from causalab.compile import positions as position_rules
from causalab.compile.plan import Pass, PromptBatch, ReadOp, WriteOp
from causalab.engine.generate import fixed_step
from causalab.engine.seam import Window
from causalab.engine.state import OpWindows, WalkState, Windows
from causalab.errors import RunError

if TYPE_CHECKING:  # annotations only
    from transformers import PreTrainedTokenizerBase


def decoder(tokenizer: PreTrainedTokenizerBase):
    """``ids -> text`` with the model's tokenizer (what a scoped position matches against)."""
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


def resolve_pass(pass_: Pass, tokenizer: PreTrainedTokenizerBase, state: WalkState) -> Windows:
    """Windows of every read and write over ALL rows of the pass, resolved once
    (docs/format.md §6.2, §6.4), with the provenance of a dynamic pass's reads; kept in
    ``state.windows`` per pass."""
    key = id(pass_)
    if key in state.windows:
        return state.windows[key]
    decode = decoder(tokenizer)
    if pass_.dynamic:
        for batch in pass_.inputs.values():
            _check_tokenizer(tokenizer, batch, pass_)
    found = Windows()
    for forward in pass_.forwards:
        batch = pass_.inputs[forward.input]
        writes = found.writes.setdefault(forward.input, {})
        for op in (*forward.writes, *forward.reads):
            is_write = isinstance(op, WriteOp)
            if op.name in (writes if is_write else found.reads):
                continue
            if op.pos.frame == "generated":
                # Known once the continuation is: filled in by ``resolve_generated``.
                windows = OpWindows(((),) * pass_.rows, (position_rules.MISSING,) * pass_.rows)
            else:
                where = ("interventions", pass_.intervention,
                         ("writes" if is_write else "reads"), op.name)
                windows = _windows(op.pos, batch, pass_.rows, decode, where, state)
            if is_write:
                writes[op.name] = windows
                if op.pos.frame != "generated":
                    _refuse_empty_write(op, windows, pass_, where)
                continue
            found.reads[op.name] = windows
            if pass_.dynamic and op.pos.frame != "generated":
                found.provenance[op.name] = _provenance(windows, batch, decode)
    _check_operand_windows(pass_, found)
    state.windows[key] = found
    return found


def resolve_generated(found: Windows, pass_: Pass, read: ReadOp, rows: tuple,
                      generated: Sequence[Sequence[int]], tokenizer: PreTrainedTokenizerBase,
                      stops: Sequence[int]) -> list[tuple[tuple[int, ...], str]]:
    """A generated-frame read on each of ``rows`` once their continuation (``generated``, one
    id sequence per row) is known: per row the decode steps it keeps and the reason
    (docs/format.md §6.4, §11), written into ``found`` with the read's provenance. A fixed
    step is kept on every row, whatever the row generated; any other cut runs over the
    continuation cut after its first stop."""
    decode = decoder(tokenizer)
    k = fixed_step(read.pos)
    if k is not None:
        cut = [((k,), position_rules.PLACED) for _ in rows]
    else:
        where = ("interventions", pass_.intervention, "reads", read.name)
        cut = position_rules.resolve_rows(read.pos, pass_.inputs[read.input], rows, decode,
                                          where, generated=generated, eos_ids=stops)
    windows, reasons = (list(part) for part in found.reads[read.name])
    for row, (window, reason) in zip(rows, cut):
        windows[row], reasons[row] = window, reason
    found.reads[read.name] = OpWindows(tuple(windows), tuple(reasons))
    tokens = tuple(tuple(decode([int(ids[s])]) for s in window)
                   for ids, (window, _) in zip(generated, cut))
    found.provenance[read.name] = {"windows": tuple(w for w, _ in cut),
                                   "reasons": tuple(r for _, r in cut), "tokens": tokens}
    return cut


def _windows(spec, batch: PromptBatch, rows: int, decode, where: tuple,
             state: WalkState) -> OpWindows:
    """``spec`` on every row; an unscoped prompt cut depends on the masks and prefix alone,
    so a document's points share it."""
    key = None
    if spec.frame == "prompt" and spec.variable is None and spec.segment is None:
        key = (spec, batch.attention_mask, batch.prefix, rows)
        if key in state.cache.positions:
            return state.cache.positions[key]
    found = position_rules.resolve_rows(spec, batch, range(rows), decode, where)
    result = OpWindows(tuple(w for w, _ in found), tuple(r for _, r in found))
    if key is not None:
        state.cache.positions[key] = result
    return result


def _check_tokenizer(tokenizer: PreTrainedTokenizerBase, batch: PromptBatch, pass_: Pass) -> None:
    """R4: row 0's ids must decode to the prompt recorded at compile time."""
    if not batch.prompts:
        return
    start, end = position_rules.content_span(batch.attention_mask[0], (batch.role, 0))
    ids = list(batch.input_ids[0][start + batch.prefix:end])
    seen = {tokenizer.decode(ids), tokenizer.decode(ids, skip_special_tokens=True)}
    if batch.prompts[0] not in seen:
        raise RunError(("interventions", pass_.intervention, batch.role),
                       f"tokenizer skew: row 0 decodes to {sorted(seen)[0]!r}, "
                       f"not the recorded prompt {batch.prompts[0]!r}")


def _provenance(found: OpWindows, batch: PromptBatch, decode) -> dict:
    tokens = tuple(tuple(decode([batch.input_ids[row][p]]) for p in window)
                   for row, window in enumerate(found.windows))
    return {"windows": found.windows, "reasons": found.reasons, "tokens": tokens}


def _refuse_empty_write(write: WriteOp, found: OpWindows, pass_: Pass, where: tuple) -> None:
    """R1: a write may not skip a row (a read may)."""
    empty = {pass_.example_ids[row] if row < len(pass_.example_ids) else str(row):
             found.reasons[row] for row, window in enumerate(found.windows) if not window}
    if empty:
        raise RunError(where, f"write {write.name!r} has an empty window on rows {empty}; "
                              "a read may skip a row, a write may not")


def _check_operand_windows(pass_: Pass, found: Windows) -> None:
    """R2: a write meets a read operand over the same number of positions on every row. A
    width the document fixes is checked at validate (V17); this catches what only rows show:
    an anchored or ``all`` operand, or one whose read skipped a row."""
    for forward in pass_.forwards:
        for write in forward.writes:
            if write.operand.kind != "read" or write.pos.frame == "generated":
                continue
            source = next((r for f in pass_.forwards for r in f.reads
                           if r.name == write.operand.name), None)
            if source is None:
                continue
            mine = found.write(write.name, forward.input).windows
            theirs = found.read(source.name).windows
            bad = [row for row in range(pass_.rows) if len(mine[row]) != len(theirs[row])]
            if bad:
                first = bad[0]
                raise RunError(("interventions", pass_.intervention, "writes", write.name, "operand"),
                               f"write {write.name!r} and its operand {write.operand.name!r} cover "
                               f"different numbers of positions on rows {bad} (row {first}: "
                               f"{len(mine[first])} written, {len(theirs[first])} read)")
