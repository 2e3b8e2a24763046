"""Typed walk state: what a plan's walk carries, what one pass runs with, where its ops land.

The engine's low module: the walk, the planner, the binding of jobs and the pass assembly all
take these types, and it imports nothing of theirs (only the plan types, the document cache
and the events seam). It holds no logic beyond reading its own fields, and it never traces.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from causalab.compile.plan import ModelRef, Pass, Plan, PromptBatch
from causalab.engine.cache import DocumentCache
from causalab.engine.events import Events

if TYPE_CHECKING:  # annotations only: the types below import torch, nnterp, the seam
    import torch
    from nnterp import StandardizedTransformer
    from transformers import PretrainedConfig

    from causalab.engine.attribution.patching import Sums
    from causalab.engine.trace_jobs import JobTap, TapKind
    from causalab.engine.outputs import Published
    from causalab.engine.seam import Written


@dataclass
class WalkState:
    """What a plan's walk carries: live featurizers and their specs, the outputs published
    so far, resolved windows per pass, the document cache, and where the walk is.

    Mutable, and meant to be: featurizers, specs, published outputs and windows fill in as
    the walk goes. A nested plan walks with a copy (``dataclasses.replace``) holding its own
    outputs namespace and windows; featurizers, specs and the cache are the same objects.
    ``fill_prefixes`` (a fit) asks an intervened forward that can resume to keep its
    un-intervened prefix over every row first. ``where`` names the node being walked
    (``point/step``), as ``explain --traces`` says it.
    """

    cache: DocumentCache = field(default_factory=DocumentCache)
    featurizers: dict = field(default_factory=dict)
    specs: dict = field(default_factory=dict)
    published: dict = field(default_factory=dict)
    windows: dict[int, "Windows"] = field(default_factory=dict)
    model_ref: ModelRef | None = None
    digest: str = ""
    events: Events = field(default_factory=Events)
    point: Plan | None = None
    batch_size: int | None = None
    entry: str | None = None
    fill_prefixes: bool = False
    where: str = ""


def new_state(*, cache: DocumentCache | None = None, model_ref: ModelRef | None = None,
              digest: str = "") -> WalkState:
    """A plan's walk state, sharing ``cache`` (a fresh one when None)."""
    return WalkState(cache=DocumentCache() if cache is None else cache, model_ref=model_ref,
                     digest=digest or "")


class ModelFacts(NamedTuple):
    """What the planner knows of the model, read from its config (no weights): the block
    count, the residual width and one layer's key width (narrower under grouped-query
    attention), which size the resume budget's charges; the MLP's width, the head count and
    the vocabulary, which size a trace's estimate (``budget.row_bytes``)."""

    layers: int
    hidden: int
    kv: int
    intermediate: int = 0
    heads: int = 1
    vocab: int = 0
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: as many as ``heads``

    @classmethod
    def of(cls, config: PretrainedConfig) -> "ModelFacts":
        config = getattr(config, "text_config", None) or config
        hidden = int(getattr(config, "hidden_size", None) or getattr(config, "n_embd"))
        heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head")
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        kv = int(getattr(config, "num_key_value_heads", None) or heads) * int(head_dim)
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
        intermediate = (getattr(config, "intermediate_size", None)
                        or getattr(config, "n_inner", None) or 4 * hidden)
        vocab = getattr(config, "vocab_size", None) or 0
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        return cls(int(layers), hidden, kv, int(intermediate), int(heads), int(vocab), kv_heads)


class OpWindows(NamedTuple):
    """Where one op lands on every row of its pass: per row its padded positions (or decode
    steps) and the reason a row has none (``positions.PLACED`` when it has)."""

    windows: tuple[tuple[int, ...], ...]
    reasons: tuple[str, ...]


@dataclass
class Windows:
    """A pass's resolved windows (docs/format.md §6.2): ``reads`` by read name, ``writes`` by
    input role then write name (one write may act in several models' forwards), and the
    provenance (docs/format.md §6.4) of a dynamic pass's reads. A decoding forward fills in its
    generated-frame reads once the continuation is known."""

    reads: dict[str, OpWindows] = field(default_factory=dict)
    writes: dict[str, dict[str, OpWindows]] = field(default_factory=dict)
    provenance: dict[str, dict] = field(default_factory=dict)

    def read(self, name: str) -> OpWindows:
        return self.reads[name]

    def write(self, name: str, role: str) -> OpWindows:
        return self.writes[role][name]

    def of(self, kind: TapKind, name: str, role: str) -> OpWindows:
        """The windows of the tap ``(kind, name)`` of a forward on ``role``."""
        return self.write(name, role) if kind == "write" else self.read(name)

    def positions(self, tap: JobTap, role: str, rows: tuple) -> list[int]:
        """The padded positions a job's ``tap`` acts at on ``rows`` (none for a whole tensor)."""
        if tap.whole:
            return []
        windows = self.of(tap.kind, tap.op.name, role).windows
        return [position for row in rows for position in windows[row]]


@dataclass
class Produced:
    """What a pass's forwards have produced so far, filled as they run: ``values`` (read
    name -> featurized ``Published``), ``raw`` (the forward being run: read name -> raw
    ``Published``), ``generated`` (result name -> ids) and ``written`` (write name -> per
    trace its rows and ``seam.Written``, checked when the result is read)."""

    values: dict[str, Published] = field(default_factory=dict)
    raw: dict[str, Published] = field(default_factory=dict)
    generated: dict[str, torch.Tensor] = field(default_factory=dict)
    written: dict[str, list[tuple[tuple[int, ...], Written]]] = field(default_factory=dict)


@dataclass(frozen=True)
class PassContext:
    """One pass over its run rows: the model (None when nothing runs, ``explain --traces``),
    the walk state, the pass's windows, the model facts, whether the graph is kept (a fit's
    update); what its forwards produced so far in ``produced``, the one part that changes;
    an attribute step's running sums (``attribution.Sums``, mutable) in ``attributed``."""

    model: StandardizedTransformer | None
    pass_: Pass
    state: WalkState
    rows: tuple[int, ...]
    windows: Windows
    facts: ModelFacts
    grad: bool = False
    produced: Produced = field(default_factory=Produced)
    attributed: Sums | None = None

    def window(self, batch: PromptBatch, grad: bool = False, decode: int = 0) -> int | None:
        """Rows per trace over ``batch``: the run's batch size within the memory budget. One
        size per batch and grad, so the prefixes a fill keeps cover the windows that resume."""
        return self.state.cache.window(self.state.batch_size, batch.tokens + decode, grad)
