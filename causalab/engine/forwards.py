"""Forwards' data: the document-wide cache keys, the input tensors, and reads put back together.

Plain torch and python around the walk's traces: it never opens a trace and never decides
which forward runs. A forward's inputs are tensors made once per document from a prompt
batch (left padding, position ids from the mask); its reads come back per chunk of rows and
are concatenated here; a read at an address kept whole (``cache.DocumentCache``) is gathered
from the kept tensor.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from causalab.compile.plan import Forward, Pass, PromptBatch, ReadOp
from causalab.engine import outputs as output_rules
from causalab.engine import windows as window_rules
from causalab.engine.seam import gather


def tap_ops(forward: Forward) -> dict[tuple[str, str], Any]:
    """``forward.taps`` entries -> the op each names: ``("write", w)`` / ``("read", r)``."""
    ops: dict[tuple[str, str], Any] = {("write", w.name): w for w in forward.writes}
    ops.update({("read", r.name): r for r in forward.reads})
    return ops


def batch_key(batch: PromptBatch) -> tuple:
    """What makes two prompt batches the same model input: their ids and masks."""
    return (batch.input_ids, batch.attention_mask)


class Host(NamedTuple):
    """Another input batch of a pass whose un-intervened forward also serves a forward's
    rows: the batch, and per row of the forward's own batch the host row with its ids."""

    batch: PromptBatch
    rows: tuple[int, ...]


def host_of(pass_: Pass, forward: Forward) -> Host | None:
    """The batch an un-intervened prompt forward runs on when it is not its own: another
    input of the pass, as wide and as long, holding every row of the forward's batch (a
    counterfactual drawn from the same prompts as the base, say). An intervened forward's
    input is preferred, since its un-intervened values (prefix resume) come from the same
    trace; then the role name, so two batches holding each other's rows pick one host.
    None when the forward's own batch is its host. Rows are computed in a batch of the same
    size either way; only their order differs.
    """
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
            found.append(((role not in intervened, role), Host(batch, tuple(rows))))
    if not found:
        return None
    ours = (forward.input not in intervened, forward.input)
    best_key, best = min(found, key=lambda item: item[0])
    return best if best_key < ours else None


def read_key(batch: PromptBatch, read: ReadOp, decode: int = 0) -> tuple:
    """The document-wide cache key of an un-intervened read: a scoped (dynamic) position's
    windows depend on the rows' anchor values too, not on the ids alone."""
    anchors = tuple(sorted(batch.anchors.items())) if read.pos.dynamic else ()
    return (batch_key(batch), read.address, read.pos, read.view, decode, anchors)


def from_whole(tensor: torch.Tensor, pass_: Pass, forward: Forward, read: ReadOp,
                resolved: dict) -> output_rules.Published:
    """``read`` over every row of the pass, gathered from its address's kept whole tensor."""
    windows, _ = resolved[("read", read.name, forward.input)]
    window = window_rules.layout(windows, range(len(windows)), read.pos.ragged)
    return output_rules.Published(gather(tensor, read.address, window), window.flat_counts,
                                  pass_.rows, "none")


def chunks(rows: tuple, batch_size: int | None) -> list[tuple]:
    """``rows`` cut into windows of at most ``batch_size`` (all at once when None)."""
    if not batch_size or batch_size >= len(rows):
        return [rows]
    return [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]


def gathered(pass_: Pass, forward: Forward, run_rows: tuple, resolved: dict,
              pieces: dict, whole: frozenset = frozenset()) -> dict:
    """Per-chunk raw reads concatenated in ``run_rows`` order, with their prompt layouts;
    a read in ``whole`` is its address's whole tensor, ``(rows, …)``."""
    out = {}
    for read in forward.reads:
        value = torch.cat(pieces[read.name], 0) if len(pieces[read.name]) > 1 else pieces[read.name][0]
        counts = None
        if read.pos.frame != "generated" and read.name not in whole:
            windows, _ = resolved[("read", read.name, forward.input)]
            counts = window_rules.layout(windows, run_rows, read.pos.ragged).flat_counts
        out[read.name] = output_rules.Published(value, counts, len(run_rows), "none")
    return out


def kv_cache(model: Any):
    """An empty KV cache laid out for the loaded model's layers (sliding ones included)."""
    from transformers import DynamicCache

    return DynamicCache(config=model._model.config)


def prompt_inputs(model: Any, batch: PromptBatch, chunk: tuple,
                  kept: dict) -> tuple[dict, torch.Tensor]:
    """The rows ``chunk`` as model inputs, position ids taken from the mask (docs/format.md §18).

    The whole batch is made into tensors once per document (a sweep point's batch is a
    new object holding equal rows, hence the value key) and kept in ``kept`` (the document
    cache's ``inputs``); a chunk is a row selection.
    """
    device = model._model.get_input_embeddings().weight.device
    key = ("inputs", batch_key(batch), str(device))
    whole = kept.get(key)
    if whole is None:
        ids = torch.tensor(batch.input_ids, dtype=torch.long, device=device)
        mask = torch.tensor(batch.attention_mask, dtype=torch.long, device=device)
        whole = kept[key] = (ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    if chunk == tuple(range(len(batch.input_ids))):
        ids, mask, position_ids = whole
    else:
        index = torch.tensor(chunk, dtype=torch.long, device=device)
        ids, mask, position_ids = (t.index_select(0, index) for t in whole)
    return {"input_ids": ids, "attention_mask": mask}, position_ids
