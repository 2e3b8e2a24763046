"""Trace jobs: one nnterp trace as frozen plain data, and the stages the planner groups them in.

``causalab.engine.planner`` makes them and makes every speed decision in them; the runner binds
each to its tensors (``taps.bind``) and runs it through ``runner.run_trace``; the pass assembly
(``causalab.engine.assembly``) keeps what a stage's traces produced. A job names no tensor and
no live object (the runner binds those beside it, ``taps.Live``), so ``explain --traces``
lists the jobs a run opens without loading weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple

from causalab.compile.plan import Address, Forward, PromptBatch, ReadOp, WriteOp
from causalab.engine.resume import Need, Resume, need_order, need_place

if TYPE_CHECKING:  # annotations only
    import torch
    from transformers import Cache


# kind -> what a trace of that kind is for.
KINDS = {
    "forward": "an intervened prompt forward",
    "reads": "an un-intervened prompt forward whose reads the document cache keeps",
    "prefix": "an un-intervened forward keeping residuals an intervened one resumes from",
    "keys": "an un-intervened forward keeping the keys and values of every column but the last",
    "decode": "one step of a greedy decode over its own growing KV cache",
    "attribute": "a forward of an attribute step: its sites kept whole, shifted by zero leaves "
                 "under grad, the metric's read kept with its graph",
    "edges": "a forward of an edges step: the transformers module under nnterp with plain torch "
             "hooks, no nnsight trace (``edge_step.forwards`` lists them; no stage holds one)",
}
# tap kind -> what it does at its address.
TAPS = {
    "read": "the value gathered at the tap's window (whole: the tensor, a detached copy)",
    "write": "the seam's apply_write at the tap's window",
    "shift": "the tensor kept as a detached copy, and the forward continued from it plus a "
             "zero leaf (the metric's gradient at the site is the leaf's)",
    "replace": "the bound tensor put in place of the address's (integrated gradients' "
               "interpolated embeddings)",
    "gate": "the tensor passed on unchanged, its gradient zeroed in the backward passes that "
            "drop its layer (GradDrop)",
}
# head -> how the output head runs in the trace.
HEADS = {
    "all": "over every column (a tap reads the head at some column other than the last)",
    "last": "over the last column alone, its rows padded to sites.HEAD_ROWS",
    "none": "over the last position only (logits_to_keep=1): no tap reads the head",
}
# The tables' keys as types, built from them as the schema's are (STYLE.md habit 4).
JobKind = Literal[tuple(KINDS)]
TapKind = Literal[tuple(TAPS)]
Head = Literal[tuple(HEADS)]
StageKind = Literal[(*KINDS, "serve")]
# A site op's role: the site itself or an AtP* correction's tensor.
ROLES = ("site", "partner", "scores", "pattern", "gate")
Role = Literal[ROLES]
# How ``explain --traces`` says a job's head: the model's final norm and unembedding.
UNEMBED = {"all": "unembed every position", "last": "unembed the last position",
           "none": "unembed unread"}


@dataclass(frozen=True)
class JobTap:
    """One tap of a trace, of a kind of ``TAPS``: the op, the pass context it serves
    (``unit``: a fused point, or one of a fill's forwards), the stacked copy of the job's
    rows it acts on (``slot``), and whether it acts on the address's whole tensor."""

    kind: TapKind
    op: ReadOp | WriteOp | SiteOp
    unit: int = 0
    slot: int = 0
    whole: bool = False


@dataclass(frozen=True)
class SiteOp:
    """An address an attribute job taps whole: the step's ``name``, the ``index`` of the
    address among its addresses (-1: the embeddings) and, for a ``replace`` tap, the
    integrated-gradients ``step`` whose interpolated embeddings go there; ``role`` is ``site``
    or an AtP* correction's tensor (``partner``, ``scores``, ``pattern``, ``gate``)."""

    name: str
    address: Address
    index: int = -1
    step: int = 0
    role: Role = "site"


@dataclass(frozen=True)
class TraceJob:
    """One trace: ``rows`` of ``batch`` (``copies`` of them stacked, fused points), its
    ``taps`` in issue order, where it enters (``resume``: blocks before skipped, served
    from kept prefixes), whether it runs the last column alone over the batch's kept keys
    and values (``tail``, the KV-tail handle), how the head runs (``head``, a key of
    ``HEADS``), whether it stops after its last tap, the prefix needs it keeps, its decode
    ``step``, and whether autograd records it (``grad``: a fit's update; a gradient-taking
    job asks the same of its kept reads)."""

    kind: JobKind
    batch: PromptBatch = field(repr=False)
    rows: tuple[int, ...]
    taps: tuple[JobTap, ...] = ()
    copies: int = 1
    resume: Resume | None = None
    tail: bool = False
    head: Head = "all"
    stop: bool = False
    keep: tuple[Need, ...] = ()
    step: int | None = None
    grad: bool = False


class Wanted(NamedTuple):
    """A read a ``reads`` stage puts into the document cache: its cache key, the unit whose
    forward asks for it, and the key of the whole tensor it is gathered from (None: it is
    gathered in the trace itself)."""

    key: tuple
    unit: int
    read: ReadOp
    whole: tuple | None


@dataclass(frozen=True)
class Stage:
    """Jobs whose values are kept together (``assembly.finish``): a ``kind`` of ``KINDS`` or
    ``serve`` (no trace: a forward's reads taken from the document cache), the forward each
    unit runs, and for a ``reads`` stage what it keeps and, on a host batch, per row of the
    forward's own batch its row there (``host``); ``kept``: a decode whose values go into
    the document cache (an un-intervened one) rather than to its pass."""

    kind: StageKind
    jobs: tuple[TraceJob, ...] = ()
    forwards: tuple[Forward, ...] = ()
    wanted: tuple[Wanted, ...] = ()
    host: tuple[int, ...] | None = None
    kept: bool = False


class NextPrefix(NamedTuple):
    """The kept values a later intervened forward will enter with: its input ``batch``, its
    ``needs`` and what later points' forwards need (``ahead``); an un-intervened fill on
    the same rows keeps them in its own trace."""

    batch: PromptBatch
    needs: set
    ahead: set


class Traced(NamedTuple):
    """What one trace gave: per tap its value (a write's ``seam.Written``), per kept need its value,
    the next token of a decode step, and the KV cache a ``keys`` job filled."""

    values: tuple
    kept: dict[Need, object]
    token: torch.Tensor | None = None
    cache: Cache | None = None


def _address(address: Address) -> str:
    return address.component if address.layer is None else f"{address.component}[{address.layer}]"


def _need(need: Need) -> str:
    return f"block {need} output" if isinstance(need, int) else f"block {need[0]} {need[1]}"


def span(rows: tuple) -> str:
    """``rows`` in words: ``row 3``, ``rows 0-41``, ``rows 0, 5``."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    if rows and rows == tuple(range(rows[0], rows[0] + len(rows))):
        return f"rows {rows[0]}-{rows[-1]}"
    shown = ", ".join(map(str, rows[:6]))
    return f"rows {shown}{', …' if len(rows) > 6 else ''}"


def describe(job: TraceJob, *, rows: bool = True) -> str:
    """One line saying what ``job`` runs: rows (which ones too, with ``rows``), entry, head,
    where it stops, taps."""
    count = f"{len(job.rows)} row{'s' if len(job.rows) != 1 else ''}"
    count = count if job.copies == 1 else f"{job.copies} x {count}"
    width = 1 if job.tail or (job.step or 0) > 0 else job.batch.tokens
    which = f" ({span(job.rows)})" if rows else ""
    parts = [f"{job.kind} on '{job.batch.role}' {count}{which} x {width} tokens"]
    if job.step is not None:
        parts.append(f"step {job.step}")
    if job.resume is not None:
        cached = f" ({', '.join(job.resume.parts)} cached)" if job.resume.parts else ""
        parts.append(f"resumes at block {job.resume.layer}{cached}")
    if job.tail:
        parts.append("last column over kept keys")
    parts.append(UNEMBED[job.head])
    if job.stop:
        places = [tuple(tap.op.address.order) for tap in job.taps]
        places += [need_place(need) for need in job.keep]
        last = max(places) if places else None
        deepest = next((_address(t.op.address) for t in job.taps
                        if tuple(t.op.address.order) == last), None)
        parts.append(f"stops after {deepest or _need(max(job.keep, key=need_order))}")
    if job.keep:
        parts.append("keeps " + ", ".join(_need(n) for n in sorted(job.keep, key=need_order)))
    taps = [f"{tap.kind} {tap.op.name}@{_address(tap.op.address)}"
            + (f"#{tap.slot}" if job.copies > 1 else "") + (" whole" if tap.whole else "")
            for tap in job.taps]
    if taps:
        parts.append("taps " + ", ".join(taps))
    return "; ".join(parts)
