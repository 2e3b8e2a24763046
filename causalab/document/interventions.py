"""Interventions: reads, writes, intervened models and metrics (docs/format.md §7), one node each.

Only rules about one node live here: a write's mechanism against its params and operand, a
logits view with a featurizer, a generated-frame write cut. Whether a name is declared, a
site is read-only or a metric's read is vocabulary-shaped needs two nodes and lives in
``references.py``. The metric models are built from the COLUMNS table in ``vocab.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import Field, StrictInt, StrictStr, create_model, model_validator

from causalab.document.nodes import Name, Node, Number, refuse
from causalab.document.positions import Pos
from causalab.document.vocab import (IDENTITY, MECHANISMS, METRIC_KINDS, ORIGINAL,
                                     TOKEN_FORMS, VIEWS)
from causalab.errors import Path


class Ref(Node):
    """``{"ref": name}``: a value published under ``outputs`` by an earlier step."""

    ref: StrictStr


# "name" (a read of this intervention) | number (a literal) | {"ref": name} | null.
Operand = Union[StrictStr, Number, Ref, None]


class Read(Node):
    """A value taken out of one forward (docs/format.md §7.2)."""

    site: StrictStr
    pos: Pos
    input: StrictStr
    model: StrictStr = ORIGINAL
    featurizer: StrictStr = IDENTITY
    view: Literal[VIEWS] = "raw"

    @model_validator(mode="after")
    def _logits_view_is_plain(self) -> "Read":
        if self.view == "logits" and self.featurizer != IDENTITY:
            raise refuse(f'view "logits" cannot go through featurizer "{self.featurizer}"',
                         "view")
        return self


class Write(Node):
    """A change put into a forward: the mechanism, its operand and params (docs/format.md §7.3)."""

    site: StrictStr
    pos: Pos
    mechanism: Literal[tuple(MECHANISMS)]
    operand: Operand = None
    featurizer: StrictStr = IDENTITY
    features: Annotated[list[StrictInt], Field(min_length=1)] | None = None
    params: dict[StrictStr, Number] = {}

    @model_validator(mode="after")
    def _mechanism_contract(self) -> "Write":
        spec = MECHANISMS[self.mechanism]
        _check_params(self.mechanism, spec, self.params)
        if spec["operand"] == "forbidden" and self.operand is not None:
            raise refuse(f"{self.mechanism} takes no operand", "operand")
        if spec["operand"] == "required" and self.operand is None:
            raise refuse(f"{self.mechanism} needs an operand: a read of this intervention, "
                         'a number, or {"ref": <published output>}', "operand")
        if self.pos.finished_cut:
            raise refuse("a write cannot use a scope, a negative index, last or span in the "
                         "generated frame: those cut a finished continuation; use "
                         '{"frame": "generated", "index": k} or "all": true', "pos")
        return self


def _check_params(mechanism: str, spec: dict, params: dict) -> None:
    allowed = spec["params"]
    extra = sorted(set(params) - set(allowed))
    missing = sorted(name for name, p in allowed.items() if p["required"] and name not in params)
    expects = ", ".join(allowed) or "none"
    if extra:
        raise refuse(f"{mechanism} has no param {', '.join(extra)} (params: {expects})", "params")
    if missing:
        raise refuse(f"{mechanism} needs param {', '.join(missing)} (params: {expects})", "params")
    for name, value in params.items():
        if allowed[name]["type"] == "int" and not isinstance(value, int):
            raise refuse(f"{mechanism}.{name} must be an integer, got {value!r}", "params")
    needs_one = spec.get("at_least_one")
    if needs_one and not any(name in params for name in needs_one):
        raise refuse(f"{mechanism} needs at least one of {', '.join(needs_one)}", "params")
    low, high = spec.get("ordered", (None, None))
    if low in params and high in params and params[low] > params[high]:
        raise refuse(f"{mechanism}.{low} {params[low]!r} is above {high} {params[high]!r}: "
                     "no value lies between them", "params")


class InterventionModel(Node):
    """An intervened model: a role plus the writes applied to it, in order (docs/format.md §7.7)."""

    input: StrictStr
    writes: list[StrictStr]


def _metric_model(kind: str, row: dict) -> type[Node]:
    columns = {column: (StrictStr, ...) for column in (*row.get("reads", ()), *row["columns"])}
    name = "".join(part.title() for part in kind.split("_")) + "Metric"
    reads = f"reads {', '.join(row['reads'])}; " if row.get("reads") else ""
    return create_model(name, __base__=Node, __doc__=f"A `{kind}` metric: {reads}columns "
                        f"{', '.join(row['columns'])}; unit {row['unit']}.",
                        kind=(Literal[kind], ...), of=(StrictStr, ...),
                        token_form=(Literal[TOKEN_FORMS], TOKEN_FORMS[0]), **columns)


METRIC_MODELS = {kind: _metric_model(kind, row) for kind, row in METRIC_KINDS.items()}
Metric = Annotated[Union[tuple(METRIC_MODELS.values())], Field(discriminator="kind")]


class Intervention(Node):
    """A named experiment: reads, writes, models, metrics and decode (docs/format.md §7.1)."""

    reads: dict[Name, Read]
    writes: dict[Name, Write] = {}
    models: dict[Name, InterventionModel] = {}
    metrics: dict[Name, Metric] = {}
    decode: Annotated[StrictInt, Field(ge=0)] = 0


@dataclass(frozen=True)
class Entry:
    """One intervention a step runs: its registered name, body and JSON path."""

    name: str
    body: Intervention
    path: Path
