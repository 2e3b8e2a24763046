"""Forwards' plain data: the ops of a forward in issue order, cache keys, host batches, row windows.

Plain python over plan data: it never opens a trace, never touches a tensor and never
decides which forward runs (the planner does, from these facts). ``chunks`` is the one
place rows are cut into the windows a trace runs on.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.plan import Forward, Pass, PromptBatch, ReadOp


def tap_ops(forward: Forward) -> tuple[tuple[str, Any], ...]:
    """``forward.taps`` as ``(kind, op)`` pairs in issue order (kind ``write`` or ``read``)."""
    writes = {write.name: write for write in forward.writes}
    reads = {read.name: read for read in forward.reads}
    return tuple((kind, writes[name] if kind == "write" else reads[name])
                 for kind, name in forward.taps)


def batch_key(batch: PromptBatch) -> tuple:
    """What makes two prompt batches the same model input: their ids and masks."""
    return (batch.input_ids, batch.attention_mask)


def host_of(pass_: Pass, forward: Forward) -> tuple[PromptBatch, tuple] | None:
    """Another input of the pass, as wide and as long, holding every row of the forward's
    batch (a counterfactual drawn from the base prompts, say), with per row its host row.
    An intervened forward's input is preferred, since its prefix comes from the same trace;
    then the role name, so two batches holding each other's rows pick one host. None when
    the forward's own batch is its host; rows run in a batch of the same size either way."""
    own = pass_.inputs[forward.input]
    if forward.writes or forward.decode or not own.input_ids:
        return None
    intervened = {other.input for other in pass_.forwards if other.writes}
    found = []
    for role, batch in pass_.inputs.items():
        if (len(batch.input_ids) != len(own.input_ids) or batch.tokens != own.tokens
                or batch_key(batch) == batch_key(own)):
            continue
        where = {row: index for index, row in reversed(list(enumerate(
            zip(batch.input_ids, batch.attention_mask))))}
        rows = [where.get(row) for row in zip(own.input_ids, own.attention_mask)]
        if None not in rows:
            found.append(((role not in intervened, role), (batch, tuple(rows))))
    if not found:
        return None
    best_key, best = min(found, key=lambda item: item[0])
    return best if best_key < (forward.input not in intervened, forward.input) else None


def read_key(batch: PromptBatch, read: ReadOp, decode: int = 0) -> tuple:
    """The document-wide cache key of an un-intervened read: a scoped (dynamic) position's
    windows depend on the rows' anchor values too, not on the ids alone."""
    anchors = tuple(sorted(batch.anchors.items())) if read.pos.dynamic else ()
    return (batch_key(batch), read.address, read.pos, read.view, decode, anchors)


def chunks(rows: tuple, batch_size: int | None) -> list[tuple]:
    """``rows`` cut into windows of at most ``batch_size`` (all at once when None)."""
    if not batch_size or batch_size >= len(rows):
        return [rows]
    return [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
