"""Position specs (``pos``): frame, scope and exactly one cut, plus their static facts.

A position here is the spec as authored; it is resolved per row, at run time, against the
model's tokenizer (``causalab.compile.positions``). Rules that need the intervention (its
``decode``) or the site live in ``references.py``; this module knows one ``pos`` alone.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, StrictStr, model_validator

from causalab.document.nodes import Node, refuse
from causalab.document.vocab import POSITION_FORMS

CUTS = tuple(POSITION_FORMS["cuts"])
_ROLES = tuple(s for s in POSITION_FORMS["segments"] if s not in POSITION_FORMS["generated_only_segments"])
_NTH_MESSAGE = re.compile(rf"({'|'.join(_ROLES)})\[(0|[1-9][0-9]*)\]")
FORMS = ('an integer i, or one cut: {"index": i}, {"span": [a, b]}, {"last": n > 0}, '
         '{"all": true}, with optional "scope" {"variable", "segment"} and "frame" '
         '("prompt" | "generated")')


class Scope(Node):
    """An anchor narrowing the run: a row's variable value, a chat/eos segment, or both."""

    variable: StrictStr | None = None
    segment: StrictStr | None = None


class Position(Node):
    """``{"frame"?, "scope"?, <one cut>}``; see docs/format.md §6.1.

    >>> as_position(-1).width
    1
    """

    frame: Literal[POSITION_FORMS["frames"]] = "prompt"
    scope: Scope | None = None
    index: StrictInt | None = None
    span: Annotated[tuple[StrictInt, StrictInt], Field(strict=False)] | None = None
    last: StrictInt | None = None
    all: StrictBool | None = None

    @model_validator(mode="after")
    def _one_cut(self) -> "Position":
        cuts = [name for name in CUTS if getattr(self, name) is not None]
        if len(cuts) != 1:
            found = "no cut" if not cuts else f"{len(cuts)} cuts ({', '.join(cuts)})"
            raise refuse(f"a position needs exactly one cut, found {found}; valid forms: {FORMS}")
        if self.last is not None and self.last <= 0:
            raise refuse(f"last must be > 0, got {self.last}")
        if self.all is False:
            raise refuse('"all": false is not a cut; write "all": true or another cut')
        if self.span is not None and _same_signed(*self.span) and self.span[0] >= self.span[1]:
            raise refuse(f"span {list(self.span)} is empty or backwards: a < b is required")
        if self.scope is not None and self.scope.variable is None and self.scope.segment is None:
            raise refuse('scope needs "variable", "segment" or both')
        segment = self.scope.segment if self.scope is not None else None
        if segment is not None and segment not in POSITION_FORMS["segments"] \
                and not _NTH_MESSAGE.fullmatch(segment):
            raise refuse(f"segment {segment!r} is not one of "
                         f"{', '.join(POSITION_FORMS['segments'])} or role[i] (a role among "
                         f"{', '.join(_ROLES)}, i a message count from 0)")
        generated_only = POSITION_FORMS["generated_only_segments"]
        if self.frame == "prompt" and self.scope is not None and self.scope.segment in generated_only:
            raise refuse(f'segment "{self.scope.segment}" exists only in the generated frame')
        return self

    @property
    def cut(self) -> str:
        """The name of the one cut: ``index``, ``span``, ``last`` or ``all``."""
        return next(name for name in CUTS if getattr(self, name) is not None)

    @property
    def anchored(self) -> bool:
        return self.scope is not None

    @property
    def width(self) -> int | None:
        """Positions the cut names, known without a row (docs/format.md §6.2); None when unknown."""
        if self.index is not None:
            return 1
        if self.last is not None:
            return self.last
        if self.span is not None and _same_signed(*self.span):
            return self.span[1] - self.span[0]
        return None

    @property
    def ragged(self) -> bool:
        """True for a cut of unknown width and for any anchored spec, however narrow."""
        return self.width is None or self.anchored

    @property
    def finished_cut(self) -> bool:
        """A generated-frame cut of the finished continuation, not a step the decode reaches."""
        if self.frame != "generated":
            return False
        return self.anchored or self.last is not None or self.span is not None or (
            self.index is not None and self.index < 0)


def _same_signed(a: int, b: int) -> bool:
    return (a >= 0) == (b >= 0)


def _expand_sugar(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"index": value}
    if isinstance(value, (dict, Position)):
        return value
    raise refuse(f"not a position: valid forms are {FORMS}")


# The one spelling of a `pos` field: the JSON Schema admits a bare integer everywhere.
Pos = Annotated[Position, BeforeValidator(_expand_sugar,
                                          json_schema_input_type=Union[StrictInt, Position])]


def as_position(value: int | dict | Position) -> Position:
    """Normalise an authored ``pos`` (bare int sugar included) into a ``Position``.

    >>> as_position(-1) == Position(index=-1)
    True
    """
    if isinstance(value, Position):
        return value
    return Position.model_validate(_expand_sugar(value))
