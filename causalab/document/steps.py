"""Steps: ``observe``, ``fit``, ``weights`` and ``attribute``, discriminated on ``kind`` (docs/format.md §9).

One node at a time: an output's ``reduce``/``k`` pairing, an anneal schedule's positive
ends. What a save may name, which refs are published and which featurizers a fit may train
need other nodes and live in ``references.py``. ``interventions`` is optional here so that
its absence is refused at the step's path with the declared names listed (rule V9).
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, StrictStr, model_validator

from causalab.document.interventions import Intervention
from causalab.document.nodes import Name, Node, Number, refuse
from causalab.document.positions import Pos
from causalab.document.vocab import (ATTRIBUTION_LAYERS_ALL, ATTRIBUTION_UNITS, EARLY_STOP_MODES,
                                     OPTIMIZERS, REDUCE_MODES)

Rows = dict[StrictStr, StrictStr]
PositiveInt = Annotated[StrictInt, Field(gt=0)]
# "name" | {…} | ["name", {…}, …]: a list lowers into one nested plan per entry.
InterventionsField = Union[StrictStr, Intervention,
                           Annotated[list[Union[StrictStr, Intervention]], Field(min_length=1)]]


class Save(Node):
    """``{"value", "file_path"}``: one file the step writes (docs/format.md §9.4)."""

    value: StrictStr
    file_path: StrictStr


class Output(Node):
    """A read published for later steps, optionally reduced (docs/format.md §9.3)."""

    read: StrictStr
    reduce: Literal[tuple(REDUCE_MODES)] = "none"
    k: PositiveInt | None = None

    @model_validator(mode="after")
    def _k_with_pca_only(self) -> "Output":
        needs_k = REDUCE_MODES[self.reduce]["needs_k"]
        if needs_k and self.k is None:
            raise refuse(f'reduce "{self.reduce}" needs k')
        if not needs_k and self.k is not None:
            ranked = " or ".join(f'"{m}"' for m, row in REDUCE_MODES.items() if row["needs_k"])
            raise refuse(f'k is only for reduce {ranked}, not "{self.reduce}"')
        return self


def _bare_output(value: object) -> object:
    return {"read": value} if isinstance(value, str) else value


OutputField = Annotated[Output, BeforeValidator(_bare_output,
                                                json_schema_input_type=Union[StrictStr, Output])]


class Observe(Node):
    """One pass over the rows: metrics, outputs, generated ids (docs/format.md §9.2)."""

    kind: Literal["observe"]
    interventions: InterventionsField | None = None
    rows: Rows
    outputs: dict[Name, OutputField] = {}
    saves: list[Save] = []


class Optimizer(Node):
    name: Literal[OPTIMIZERS] = "adamw"
    lr: Annotated[Number, Field(gt=0)]
    weight_decay: Annotated[Number, Field(ge=0)] = 0.0


class EarlyStop(Node):
    metric: StrictStr
    mode: Literal[EARLY_STOP_MODES] = "max"
    patience: PositiveInt


class Eval(Node):
    """The held-out pass run after every epoch; its saves name metrics it produces."""

    rows: Rows
    saves: list[Save] = []


class Anneal(Node):
    """A gate's temperature, geometric from ``start`` on the first update to ``end``."""

    start: Number
    end: Number

    @model_validator(mode="after")
    def _positive(self) -> "Anneal":
        if self.start <= 0 or self.end <= 0:
            raise refuse(f"anneal start and end must be > 0, got {self.start} and {self.end}")
        return self


# [weight, term]: a term is a metric name or "<gate>.mask".
Term = Annotated[tuple[Number, StrictStr], Field(strict=False)]


class Fit(Node):
    """Train featurizers through an intervention and score held-out rows (docs/format.md §9.5)."""

    kind: Literal["fit"]
    interventions: InterventionsField | None = None
    rows: Rows
    params: list[StrictStr]
    objective: Annotated[list[Term], Field(min_length=1)]
    epochs: PositiveInt
    pairs: PositiveInt
    seed: StrictInt = 0
    optimizer: Optimizer
    early_stop: EarlyStop
    eval: Eval
    anneal: dict[StrictStr, Anneal] = {}
    saves: list[Save] = []


class Weights(Node):
    """Publish named featurizers' parameters; a save writes a stamped bundle (docs/format.md §9.6)."""

    kind: Literal["weights"]
    names: list[StrictStr]
    saves: list[Save] = []


class VerifyBound(Node):
    """``verify: {bound: b}``: exact patches in rounds until the bound on what the unverified
    units can still hide is below ``b`` (docs/format.md §9.7); a fixed count stops where the
    estimate says, a tolerance where the error does."""

    bound: Annotated[Number, Field(gt=0)]
    round: PositiveInt = 4
    max_units: PositiveInt = 64


class Attribute(Node):
    """Every unit of a site set scored at once by attribution patching (docs/format.md §9.7).

    ``interventions`` is one interchange (a swap of a read of the counterfactual into the
    base run); the step estimates, per unit and per row, what each of its metrics would be
    with only that unit patched: ``metric(base) + (a_cf − a_base) · ∂metric/∂a``, from one
    forward of each role and one backward per metric (``steps > 1``: gradients averaged along
    the straight path between the two prompts' embeddings, EAP-IG style). ``qk_fix`` and
    ``graddrop`` are AtP*'s corrections; ``verify: N`` patches 2 N units exactly in the step,
    ``verify: {bound: b}`` rounds of them until the bound on the rest is below ``b``.
    ``edges: true`` scores every edge between components instead (EAP-IG,
    ``causalab.engine.attribution.edges``) and the faithfulness of the top-``circuit_k`` circuits;
    ``receivers``: ``heads`` (default: each head's query, key and value input) or ``blocks``.
    """

    kind: Literal["attribute"]
    interventions: Union[StrictStr, Intervention, None] = None
    rows: Rows
    layers: Union[Literal[ATTRIBUTION_LAYERS_ALL],
                  Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)],
                  None] = None
    unit: Literal[tuple(ATTRIBUTION_UNITS)] = "site"
    positions: dict[StrictStr, Pos] = {}
    metrics: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    steps: PositiveInt = 1
    qk_fix: StrictBool = False
    graddrop: StrictBool = False
    verify: Union[Annotated[StrictInt, Field(ge=0)], VerifyBound] = 0
    edges: StrictBool = False
    circuit_k: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)] | None = None
    receivers: Literal["heads", "blocks"] | None = None
    saves: list[Save] = []

    @model_validator(mode="after")
    def _distinct_layers(self) -> "Attribute":
        if self.circuit_k is not None and not self.edges:
            raise refuse("circuit_k sizes the circuits of an edge step: it needs edges: true",
                         "circuit_k")
        if self.receivers is not None and not self.edges:
            raise refuse("receivers chooses an edge step's receivers: it needs edges: true",
                         "receivers")
        for field in ("qk_fix", "graddrop", "verify"):
            if self.edges and getattr(self, field):
                raise refuse(f"{field} corrects or checks node attribution; edges: true scores "
                             "edges (EAP-IG) and takes none", field)
        if isinstance(self.layers, list) and len(set(self.layers)) != len(self.layers):
            raise refuse(f"layers must be distinct, got {self.layers}", "layers")
        for field in ("qk_fix", "graddrop"):
            if getattr(self, field) and self.steps > 1:
                raise refuse(f"{field} corrects plain AtP: it takes steps: 1, got "
                             f"{self.steps}", field)
        return self


Step = Annotated[Union[Observe, Fit, Weights, Attribute], Field(discriminator="kind")]


def step_interventions(step: Observe | Fit | Attribute) -> list[tuple[str | Intervention, tuple]]:
    """A step's interventions as ``(name or inline object, path below the step)`` pairs."""
    value = step.interventions
    if value is None:
        return []
    if isinstance(value, list):
        return [(entry, ("interventions", j)) for j, entry in enumerate(value)]
    return [(value, ("interventions",))]
