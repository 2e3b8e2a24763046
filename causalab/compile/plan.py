"""The plan: a compiled point as frozen plain data, the contract between compile and engine.

Every node is a frozen dataclass of str/int/float/bool/None/tuple/dict. ``results`` is the
only mutable field: the engine's walk fills it. No node has ``run`` or ``execute``; only
the engine turns a plan into tensors. ``plan_to_json`` / ``plan_from_json`` round-trip a
plan exactly (``explain --json`` is the serialised plan).

Dimension names used in docs throughout: ``rows`` (examples of a pass), ``w`` (window of
positions), ``total`` (all positions of a ragged read), ``d`` (site width), ``k``."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from causalab.compile.masks import content_span
from causalab.document.interventions import Write
from causalab.document.positions import Position
from causalab.document.steps import Output


def _results() -> dict:
    return {}


def _default(node: type, name: str) -> Any:
    """The schema's default for a field, so a hand-built plan node never restates one."""
    return node.model_fields[name].default


@dataclass(frozen=True)
class Address:
    """A (component, layer) resolved against the checkpoint, plus the site's selection.

    ``accessor`` is how the engine reaches the tensor (the vocabulary's accessor column:
    nnterp's standardized name such as ``layers_output``, or ``interior.<part>`` inside the
    attention call). ``order`` is the forward-order sort key ``(layer, n)``.
    ``seq_axis`` is 1 at a module boundary and 2 inside attention. ``width`` is the feature
    width the site exposes after ``heads``/``units`` slicing (``None`` when it has none).
    ``full_width`` is the width before slicing; ``groups``/``per_group`` regroup the feature
    axis for a selection (heads: groups = head count; units: groups = full width, per_group 1)."""

    component: str
    layer: int | None
    accessor: str
    order: tuple[int, int]
    seq_axis: int
    width: int | None
    full_width: int | None
    heads: tuple[int, ...] | None = None
    units: tuple[int, ...] | None = None
    groups: int | None = None
    per_group: int | None = None
    interior: bool = False
    key_axis: bool = False
    read_only: bool = False


@dataclass(frozen=True)
class PositionSpec:
    """A position as authored (bare ints already expanded to ``index``), plus static facts."""

    frame: str = _default(Position, "frame")
    variable: str | None = None
    segment: str | None = None
    index: int | None = None
    span: tuple[int, int] | None = None
    last: int | None = None
    all: bool = False
    width: int | None = None
    ragged: bool = False

    @property
    def dynamic(self) -> bool:
        """Needs the character map: a text anchor or any generated-frame cut."""
        return self.variable is not None or self.segment is not None or self.frame == "generated"


@dataclass(frozen=True)
class PromptBatch:
    """One role's prompts for a pass, tokenized once and left-padded to one width.

    ``prefix`` is the tokenizer's empty-string length (BOS on Llama, 0 on GPT-2): index 0
    of a position is the first token after it. ``anchors`` maps a variable name to its
    per-row value (None where the row has none).
    """

    role: str
    field: str
    prompts: tuple[str, ...]
    input_ids: tuple[tuple[int, ...], ...]
    attention_mask: tuple[tuple[int, ...], ...]
    prefix: int
    pad_id: int
    anchors: dict[str, tuple[str | None, ...]] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return len(self.input_ids[0]) if self.input_ids else 0

    @functools.cached_property
    def lengths(self) -> tuple[int, ...]:
        """Per row, prompt tokens after the prefix (what a prompt-frame cut sees), counted
        once: the cuts of every sweep point sharing the batch read them."""
        spans = (content_span(mask, (self.role, row))
                 for row, mask in enumerate(self.attention_mask))
        return tuple(max(end - start - self.prefix, 0) for start, end in spans)


@dataclass(frozen=True)
class Operand:
    """What a write's mechanism takes: ``literal`` (value), ``read`` (a read of this
    intervention, by name), ``ref`` (an output published by an earlier step), or ``none``."""

    kind: str
    name: str | None = None
    value: float | None = None


@dataclass(frozen=True)
class ReadOp:
    name: str
    site: str
    address: Address
    pos: PositionSpec
    input: str
    model: str
    featurizer: str
    view: str


@dataclass(frozen=True)
class WriteOp:
    name: str
    site: str
    address: Address
    pos: PositionSpec
    mechanism: str
    operand: Operand
    featurizer: str = _default(Write, "featurizer")
    features: tuple[int, ...] | None = None
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Forward:
    """One model call for one (model, input) pair over every row of a pass.

    ``taps`` is the issue order inside the trace: ``("write"|"read", name)`` sorted by
    address order, writes before reads at one address, writes in the model's list order.
    """

    model: str
    input: str
    writes: tuple[WriteOp, ...]
    reads: tuple[ReadOp, ...]
    taps: tuple[tuple[str, str], ...]
    decode: int


@dataclass(frozen=True)
class MetricOp:
    """A metric bound to one read. ``token_ids[j][row]`` is the id of column ``columns[j]``
    on that row (-1 where the cell is empty); ``eligible`` is the column half, row indices."""

    name: str
    kind: str
    of: str
    model: str
    input: str
    columns: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]
    eligible: tuple[int, ...]
    unit: str
    estimand_version: str
    reads: tuple[str, ...] = ()  # the further reads a kind scores (interchange's clean pair)


@dataclass(frozen=True)
class Pass:
    """Every forward a step needs over its rows, then its metrics."""

    intervention: str
    rows: int
    example_ids: tuple[str, ...]
    inputs: dict[str, PromptBatch]
    forwards: tuple[Forward, ...]
    metrics: tuple[MetricOp, ...]
    dynamic: bool = False
    results: dict = field(default_factory=_results, compare=False)


@dataclass(frozen=True)
class OutputOp:
    name: str
    read: str
    reduce: str = _default(Output, "reduce")
    k: int | None = None


@dataclass(frozen=True)
class SaveOp:
    """``kind`` is ``table`` (a metric, ``.json``) or ``tensor`` (``.safetensors``)."""

    value: str
    file_path: str
    kind: str


@dataclass(frozen=True)
class FeaturizerSpec:
    """A declared featurizer with ``d`` filled in and the stamp the document implies."""

    name: str
    kind: str
    d: int
    k: int | None
    seed: int
    file_path: str | None
    trust_unstamped: bool
    parametrization: str
    stamp: dict[str, str]
    trained_by: str | None = None
    saelens: dict = field(default_factory=dict)  # the document's block for a cfg-less SAE file
    unchecked: str = ""  # why compile could not check the bundle's stamp or tensors ("" if it did)


@dataclass(frozen=True)
class Featurizers:
    name: str
    featurizers: tuple[FeaturizerSpec, ...]
    results: dict = field(default_factory=_results, compare=False)


@dataclass(frozen=True)
class Observe:
    name: str
    pass_: Pass
    outputs: tuple[OutputOp, ...] = ()
    saves: tuple[SaveOp, ...] = ()
    results: dict = field(default_factory=_results, compare=False)


@dataclass(frozen=True)
class Fit:
    """A fit: ``train`` holds every training row; ``batches[epoch][update]`` are row indices
    into it, pre-shuffled on the client from ``seed``."""

    name: str
    train: Pass
    batches: tuple[tuple[tuple[int, ...], ...], ...]
    eval: Pass
    params: tuple[str, ...]
    objective: tuple[tuple[float, str], ...]
    epochs: int
    pairs: int
    seed: int
    lr: float
    weight_decay: float
    early_stop_metric: str
    early_stop_mode: str
    patience: int
    anneal: dict[str, tuple[float, float]] = field(default_factory=dict)
    saves: tuple[SaveOp, ...] = ()
    eval_saves: tuple[SaveOp, ...] = ()
    results: dict = field(default_factory=_results, compare=False)


@dataclass(frozen=True)
class Weights:
    name: str
    names: tuple[str, ...]
    saves: tuple[SaveOp, ...] = ()
    results: dict = field(default_factory=_results, compare=False)


@dataclass(frozen=True)
class Attribute:
    """Attribution patching over a site set (docs/format.md §9.7).

    ``passes[i]`` is the interchange compiled with the write and its operand at position
    ``labels[i]`` (``(None,)``: the write's own position); all share the rows and ids.
    ``addresses[j]`` is the site at ``layers[j]`` (a head unit selects every head the site
    has); ``embeddings``: where ``steps > 1`` interpolates; AtP*'s tensors, ``verify``'s units;
    ``verify``: the units of largest estimate per round (and as many drawn), one round unless
    ``verify_bound`` is set, then rounds until the bound is below it or ``verify_cap`` units;
    ``circuit_k`` not None: ``edges: true``, every edge scored (EAP-IG), circuits of those sizes;
    ``receivers``: an edge step's attention receivers, ``heads`` (q, k, v per head) or ``blocks``."""

    name: str
    passes: tuple[Pass, ...]
    labels: tuple[str | None, ...]
    write: str
    operand: str
    base: str
    counterfactual: str
    layers: tuple[int | None, ...]
    addresses: tuple[Address, ...]
    unit: str
    metrics: tuple[str, ...]
    steps: int = 1
    embeddings: Address | None = None
    partners: tuple[Address, ...] = ()
    scores: tuple[Address, ...] = ()
    patterns: tuple[Address, ...] = ()
    gates: tuple[Address, ...] = ()
    verify: int = 0
    verify_bound: float | None = None
    verify_cap: int = 0
    units: tuple[Address, ...] = ()
    circuit_k: tuple[int, ...] | None = None
    receivers: str = "heads"
    saves: tuple[SaveOp, ...] = ()
    results: dict = field(default_factory=_results, compare=False)

    @property
    def verify_most(self) -> int:
        """How many units verification can reach: every unit, or with a bound its cap."""
        units = len(self.units) * len(self.labels)
        return units if self.verify_bound is None else min(self.verify_cap, units)

    @property
    def verify_round(self) -> int:
        """How many units a round patches: the ``N`` largest and ``N`` drawn, within reach."""
        return min(2 * self.verify, self.verify_most)


@dataclass(frozen=True)
class ModelRef:
    """The checkpoint as the document pins it, plus the local directory it resolved to."""

    key: str
    revision: str
    dtype: str
    attn_implementation: str | None
    path: str
    control: str | None = None


@dataclass(frozen=True)
class Plan:
    """A nested plan: the root, one per sweep point, or one per list-intervention entry.

    ``directory`` is relative to the run's ``--out`` ("" for the root). ``document`` is the
    lowered point (dict) for a sweep point or an unswept root, else None. ``coordinates``
    are the swept fields of a point: label name -> value.
    """

    name: str
    directory: str
    children: tuple[Any, ...]
    model: ModelRef | None = None
    digest: str | None = None
    document: dict | None = None
    coordinates: dict[str, Any] = field(default_factory=dict)
    # What the point reads besides its document, name -> digest (compile/inputs.py): run
    # state for the resume key, like ``results`` not part of the plan a reader is shown.
    input_digests: dict[str, str] = field(default_factory=dict, compare=False)
    results: dict = field(default_factory=_results, compare=False)


_NODES = {cls.__name__: cls for cls in (
    Address, PositionSpec, PromptBatch, Operand, ReadOp, WriteOp, Forward, MetricOp, Pass,
    OutputOp, SaveOp, FeaturizerSpec, Featurizers, Observe, Fit, Weights, Attribute, ModelRef,
    Plan,
)}

# Each node class's fields in order, once: looked up per node instead of asked of dataclasses.
_SERIALISED = {cls: tuple(f.name for f in dataclasses.fields(cls)
                          if f.name not in ("results", "input_digests"))
               for cls in _NODES.values()}
_LEAVES = frozenset({str, int, float, bool, type(None)})


def plan_to_json(node: Any) -> Any:
    """Serialise a plan to JSON-able data, tagging each node with ``"node": <class>``.

    ``results`` is left out: it is run state, not plan. Tuples become lists.
    """
    names = _SERIALISED.get(type(node))
    if names is not None:
        out: dict[str, Any] = {"node": type(node).__name__}
        for name in names:
            out[name] = plan_to_json(getattr(node, name))
        return out
    if isinstance(node, dict):
        return {str(k): v if type(v) in _LEAVES else plan_to_json(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [v if type(v) in _LEAVES else plan_to_json(v) for v in node]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return {"node": type(node).__name__, **{f.name: plan_to_json(getattr(node, f.name))
                                                for f in dataclasses.fields(node)
                                                if f.name != "results"}}
    return node


def _tupled(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    if isinstance(value, dict) and "node" not in value:
        return {k: _tupled(v) for k, v in value.items()}
    if isinstance(value, dict):
        return plan_from_json(value)
    return value


def plan_from_json(data: Any) -> Any:
    """Inverse of :func:`plan_to_json`: lists come back as tuples, tagged dicts as nodes."""
    if isinstance(data, dict) and "node" in data:
        cls = _NODES[data["node"]]
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                value = data[f.name]
                kwargs[f.name] = value if f.name == "document" else _tupled(value)
        return cls(**kwargs)
    return _tupled(data)
