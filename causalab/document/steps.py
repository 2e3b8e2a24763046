"""Steps: ``observe``, ``fit`` and ``weights``, discriminated on ``kind`` (docs/format.md §9).

One node at a time: an output's ``reduce``/``k`` pairing, an anneal schedule's positive
ends. What a save may name, which refs are published and which featurizers a fit may train
need other nodes and live in ``references.py``. ``interventions`` is optional here so that
its absence is refused at the step's path with the declared names listed (rule V9).
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, StrictInt, StrictStr, model_validator

from causalab.document.interventions import Intervention
from causalab.document.nodes import Node, Number, refuse
from causalab.document.vocab import EARLY_STOP_MODES, OPTIMIZERS, REDUCE_MODES

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
    outputs: dict[StrictStr, OutputField] = {}
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


Step = Annotated[Union[Observe, Fit, Weights], Field(discriminator="kind")]


def step_interventions(step: Observe | Fit) -> list[tuple[str | Intervention, tuple]]:
    """A step's interventions as ``(name or inline object, path below the step)`` pairs."""
    value = step.interventions
    if value is None:
        return []
    if isinstance(value, list):
        return [(entry, ("interventions", j)) for j, entry in enumerate(value)]
    return [(value, ("interventions",))]
