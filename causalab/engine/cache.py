"""The document cache: what the points of one document share, kept by kind under named methods.

One cache lives for one document's run (``pipeline.run_document``) and is handed to every
point's walk. It holds only values that do not depend on any intervention: the prompt
batches as tensors, resolved prompt windows, un-intervened reads (gathered, or the whole
address tensor while a byte budget allows), and the results ``walk.prefetch`` computed for
fused points ahead of their own walks. It never opens a trace and never decides what runs;
the planner asks it what is known and the pass assembly tells it what was computed (or,
for ``explain --traces``, the dry runner that a value would be there).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from causalab.compile.plan import Forward, Pass, PromptBatch, ReadOp
from causalab.document import vocab
from causalab.engine.budget import RESUME_SHARE, WHOLE_SHARE, Budget
from causalab.engine.forwards import batch_key
from causalab.engine.resume import map_tensors
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only: the pass assembly imports this module
    from causalab.engine.assembly import PassResult
# A kept prefix value: a residual, or a module's raw output (a tensor or a tuple of them).
Kept: TypeAlias = "torch.Tensor | tuple[torch.Tensor, ...] | None"

# An un-intervened address tensor is kept whole when at most this big and while the
# document's kept tensors fit the budget; otherwise its reads are kept gathered.
WHOLE_BYTES, WHOLE_BUDGET = 32 * 2 ** 20, 512 * 2 ** 20
# Bytes of un-intervened residuals kept per document for prefix resume (0 turns it off).
RESUME_BUDGET = 256 * 2 ** 20


@dataclass(frozen=True)
class Prefix:
    """An un-intervened residual ``(rows, seq, d)`` per window of rows it was computed in.

    A forward's values depend on which rows share its batch (the kernels' blocking follows
    the batch), so a trace resumes from it only over exactly one of those windows, or copies
    of one stacked (fusion): then the skipped blocks would have computed the same bits. A
    fit's minibatch is another set of rows each epoch; it takes its rows out of the windows
    (``any_rows``), and its bits then differ from a whole forward's by float rounding.
    """

    pieces: list
    windows: tuple

    def covers(self, chunk: tuple, *, any_rows: bool = False) -> bool:
        """Whether :meth:`rows` gives the residual over ``chunk`` (plain data, no tensor)."""
        if any(tuple(window) == tuple(chunk) for window in self.windows):
            return True
        return any_rows and all(row in self._where for row in chunk)

    def rows(self, chunk: tuple, *, any_rows: bool = False) -> Kept:
        """The residual over ``chunk`` when it is one of the windows; with ``any_rows``, its
        rows gathered from the windows; else None."""
        for piece, window in zip(self.pieces, self.windows):
            if tuple(window) == tuple(chunk):
                return piece
        if not any_rows or any(row not in self._where for row in chunk):
            return None
        index = torch.tensor([self._where[row] for row in chunk], dtype=torch.long)
        return map_tensors(self._joined, lambda t: t.index_select(0, index.to(t.device)))

    @functools.cached_property
    def _where(self) -> dict:
        """Row -> its index in the windows concatenated."""
        rows = [row for window in self.windows for row in window]
        return {row: index for index, row in enumerate(rows)}

    @functools.cached_property
    def _joined(self) -> Kept:
        """The windows' values concatenated along rows, once (every minibatch gathers here)."""
        return _joined(self.pieces)


def _joined(pieces: list) -> Kept:
    """The pieces' tensors concatenated along rows, a kept module output's tuple kept whole."""
    first = pieces[0]
    if len(pieces) == 1 or first is None:
        return first
    if isinstance(first, tuple):
        return tuple(_joined([piece[k] for piece in pieces]) for k in range(len(first)))
    return torch.cat(pieces, 0) if isinstance(first, torch.Tensor) else first


class DocumentCache:
    """The one mutable store a document's walks share; each kind of entry in its own dict.

    ``reads``: un-intervened read key (``forwards.read_key``) -> ``Published`` over every row;
    ``generated``: (batch key, decode) -> an un-intervened decode's ids ``(rows, decode)``;
    ``wholes``: whole key -> an address's whole tensor ``(rows, seq, …)``; ``inputs``: (batch
    key, device) -> (ids, mask, position ids); ``positions``: an unscoped prompt cut's
    ``OpWindows``; ``prefetched``: ``id(pass_)`` -> (pass, its result); ``prefixes``:
    (batch key, layer) -> the un-intervened residual leaving block ``layer`` (a
    :class:`Prefix`), and ``keys``: batch key -> the un-intervened keys and values of every
    column but the last (a ``tail.Keys``), both while ``resume_budget`` bytes allow.
    """

    __slots__ = ("reads", "generated", "wholes", "inputs", "positions", "prefetched",
                 "whole_bytes", "prefixes", "keys", "resume_budget", "resume_bytes",
                 "whole_budget", "memory")

    def __init__(self, resume_budget: int | None = None, memory: Budget | None = None) -> None:
        self.reads: dict = {}
        self.generated: dict = {}
        self.wholes: dict = {}
        self.inputs: dict = {}
        self.positions: dict = {}
        self.prefetched: dict = {}
        self.whole_bytes = 0
        self.prefixes: dict = {}
        self.keys: dict = {}
        # A memory budget caps both keeping budgets at its shares (``budget.Budget``).
        self.memory = memory
        shares = (memory.share(RESUME_SHARE), memory.share(WHOLE_SHARE)) if memory else (
            RESUME_BUDGET, WHOLE_BUDGET)
        self.resume_budget = (min(RESUME_BUDGET, shares[0]) if resume_budget is None
                              else resume_budget)
        self.resume_bytes = 0
        self.whole_budget = min(WHOLE_BUDGET, shares[1])

    def window(self, batch_size: int | None, tokens: int, grad: bool = False) -> int | None:
        """Rows per trace: ``batch_size``, narrowed to what the memory budget's trace share
        holds of rows of ``tokens`` tokens (with a graph kept when ``grad``)."""
        if self.memory is None:
            return batch_size
        fits = self.memory.rows(tokens, grad)
        return min(batch_size, fits) if batch_size else fits

    def prefix_room(self, batch: PromptBatch, layers: int, width: int) -> bool:
        """Whether ``layers`` more residuals of ``batch`` (``width`` wide, fp32) fit the
        resume budget; if so they are charged to it."""
        if layers > self.prefixes_left(batch, width):
            return False
        self.resume_bytes += _residual_bytes(batch, width) * layers
        return True

    def prefixes_left(self, batch: PromptBatch, width: int) -> int:
        """How many more residuals of ``batch`` (``width`` wide, fp32) the budget holds."""
        size = _residual_bytes(batch, width)
        return max(self.resume_budget - self.resume_bytes, 0) // size if size else 2 ** 62

    def whole_key(self, pass_: Pass, forward: Forward, read: ReadOp,
                  pending: frozenset | set = frozenset(), batch: PromptBatch | None = None) -> tuple | None:
        """The key of ``read``'s whole address tensor over ``batch`` (default: the forward's
        input; a new one, not already ``pending`` in this trace, is charged to the budget),
        or None: only plain prompt reads of known width (not vocabulary, not keys) are kept
        whole."""
        batch = pass_.inputs[forward.input] if batch is None else batch
        if not keeps_whole(read):
            return None
        key = whole_id(batch, read)
        if key in self.wholes or key in pending:
            return key
        size = _whole_bytes(batch, read)
        if size > WHOLE_BYTES or self.whole_bytes + size > self.whole_budget:
            return None
        self.whole_bytes += size
        return key

    def wholes_fit(self, batch: PromptBatch, reads: list) -> bool:
        """Whether every one of ``reads`` can be kept whole over ``batch`` (nothing charged)."""
        new = {}
        for read in reads:
            if not keeps_whole(read):
                return False
            if whole_id(batch, read) not in self.wholes:
                new[whole_id(batch, read)] = _whole_bytes(batch, read)
        return (all(size <= WHOLE_BYTES for size in new.values())
                and self.whole_bytes + sum(new.values()) <= self.whole_budget)

    def keep_prefetched(self, pass_: Pass, result: PassResult) -> None:
        self.prefetched[id(pass_)] = (pass_, result)

    def take_prefetched(self, pass_: Pass) -> PassResult | None:
        """The result ``prefetch`` left for exactly this pass (removed), or None."""
        kept = self.prefetched.pop(id(pass_), None)
        return kept[1] if kept is not None and kept[0] is pass_ else None

    def drop_prefetched(self, pass_: Pass) -> None:
        self.prefetched.pop(id(pass_), None)


def keeps_whole(read: ReadOp) -> bool:
    """Whether ``read``'s address may be kept whole: a plain prompt read of known width
    (not vocabulary, not keys)."""
    address = read.address
    return (read.view == "raw" and bool(address.full_width) and not address.key_axis
            and read.pos.frame == "prompt" and address.component not in vocab.FROM_LOGITS)


def whole_id(batch: PromptBatch, read: ReadOp) -> tuple:
    """The key of ``read``'s address kept whole over ``batch``."""
    return (batch_key(batch), read.address.component, read.address.layer)


def _whole_bytes(batch: PromptBatch, read: ReadOp) -> int:
    return _residual_bytes(batch, read.address.full_width)


def _residual_bytes(batch: PromptBatch, width: int) -> int:
    return len(batch.input_ids) * batch.tokens * width * 4
