"""Forwards' plain data: the ops of a forward in issue order, cache keys, and windows of rows.

Plain python over plan data: it never opens a trace, never touches a tensor and never
decides which forward runs (the planner does). ``chunks`` is the one place rows are cut
into the windows a trace runs on.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.plan import Forward, PromptBatch, ReadOp


def tap_ops(forward: Forward) -> tuple[tuple[str, Any], ...]:
    """``forward.taps`` as ``(kind, op)`` pairs in issue order (kind ``write`` or ``read``)."""
    writes = {write.name: write for write in forward.writes}
    reads = {read.name: read for read in forward.reads}
    return tuple((kind, writes[name] if kind == "write" else reads[name])
                 for kind, name in forward.taps)


def batch_key(batch: PromptBatch) -> tuple:
    """What makes two prompt batches the same model input: their ids and masks."""
    return (batch.input_ids, batch.attention_mask)


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
