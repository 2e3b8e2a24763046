"""A run's memory budget as the planner spends it: an estimate of each trace's peak, and windows sized to it.

Plain arithmetic over the model's facts (``state.ModelFacts``, read from its config) and a
job's shape; it never opens a trace and never measures the machine (``causalab.memory`` does,
once, before the model loads). The budget counts the whole process: what it ``held`` once the
weights were in (weights, runtime, tokenizer) is spent already; of the ``room`` left, half goes
to the trace running now, a quarter to kept prefixes (prefix resume) and a quarter to kept whole
reads. An estimate errs high: on a CPU the kernel kills a process over its memory without a
warning, so the budget must hold by construction.

>>> Budget(total=10 * 2**20, held=2 * 2**20, itemsize=4).room
8388608
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from causalab.engine.trace_jobs import TraceJob
    from causalab.engine.state import ModelFacts

# The share of the room one trace may fill, and the shares kept prefixes and whole reads take.
TRACE_SHARE, RESUME_SHARE, WHOLE_SHARE = 0.5, 0.25, 0.25
# Values a block's forward holds at once per token, in units of the residual width (``hidden``)
# and of the MLP's (``intermediate``): the residual, its norm, q/k/v/o, the MLP's gate, up and
# product, plus the copies a kernel makes on the way.
_FORWARD_HIDDEN, _FORWARD_MLP = 8, 4
# What autograd keeps per token per block for a backward (inputs of every linear, norms,
# activations) and the gradients alive during it.
_GRAD_HIDDEN, _GRAD_MLP = 14, 6
# Bytes per logit a head over a column costs: the logits, their float log-softmax and its
# gradient under grad.
_LOGIT_BYTES, _LOGIT_GRAD_BYTES = 8, 16


@dataclass(frozen=True)
class Budget:
    """The whole process's budget in bytes, what it held before any trace, the bytes of one
    element in the model's dtype, the model's facts (None: no trace is sized) and the device
    it is counted on."""

    total: int
    held: int
    itemsize: int
    facts: ModelFacts | None = None
    device: str = "cpu"  # where the budget is counted (``memory.peak_bytes``)

    @property
    def room(self) -> int:
        """What traces and kept values may take together."""
        return max(self.total - self.held, 0)

    def over(self, peak: int, slack: float) -> bool:
        """Whether ``peak`` (what the process held at most) passed the budget by more than
        ``slack`` of it."""
        return peak > self.total * (1 + slack)

    def share(self, fraction: float) -> int:
        return int(self.room * fraction)

    def rows(self, tokens: int, grad: bool = False) -> int:
        """The most rows of ``tokens`` tokens one trace may run within its share (at least one:
        a row that alone does not fit runs anyway, as the smallest window there is)."""
        if self.facts is None:
            return 2 ** 31
        return max(1, self.share(TRACE_SHARE) // max(row_bytes(self.facts, tokens,
                                                                self.itemsize, grad), 1))


def row_bytes(facts: ModelFacts, tokens: int, itemsize: int, grad: bool = False) -> int:
    """The estimated bytes one row of ``tokens`` tokens adds to a trace: one block's transient
    values (a forward frees each block's as the next runs), the attention scores (float, every
    head), the head over every column; under grad, what every block keeps for the backward."""
    hidden, mlp = facts.hidden, facts.intermediate or 4 * facts.hidden
    block = tokens * (_FORWARD_HIDDEN * hidden + _FORWARD_MLP * mlp) * itemsize
    scores = facts.heads * tokens * tokens * 4
    head = tokens * facts.vocab * (_LOGIT_GRAD_BYTES if grad else _LOGIT_BYTES)
    kept = 0
    if grad:
        kept = facts.layers * (tokens * (_GRAD_HIDDEN * hidden + _GRAD_MLP * mlp) * itemsize
                               + 2 * scores)
    return block + scores + head + kept


def trace_bytes(job: TraceJob, facts: ModelFacts, itemsize: int) -> int:
    """A ``trace_jobs.TraceJob``'s estimate beyond what the process holds: its rows' costs, the
    whole tensors it keeps, the prefixes it keeps and, on a decode step, its KV cache."""
    rows = job.copies * len(job.rows)
    tokens = job.batch.tokens
    width = 1 if job.tail or (job.step or 0) > 0 else tokens
    cost = rows * row_bytes(facts, width, itemsize, job.grad)
    residual = rows * tokens * facts.hidden * itemsize
    cost += residual * (sum(tap.whole for tap in job.taps) + len(job.keep))
    if job.step is not None or job.tail or job.kind == "keys":
        cost += 2 * facts.layers * rows * (tokens + (job.step or 0)) * facts.kv * itemsize
    return cost
