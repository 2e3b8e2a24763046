"""The strict, closed base every schema node derives from, and the shared scalar types.

Strict means no coercion: ``true`` is not an int, ``"1"`` is not a number, ``1.0`` is not
an int; the one allowance is an int where a number is expected. Every object is closed and
non-finite numbers are refused. Knows no vocabulary and no cross-node rule.
"""
from __future__ import annotations

from typing import Annotated, Union

from pydantic import AfterValidator, AllowInfNan, BaseModel, ConfigDict, Strict, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

from causalab.document.names import unreadable_name, unsafe_segment

FiniteFloat = Annotated[float, Strict(), AllowInfNan(False)]
# An int stays an int (a gaussian seed must be one); a float is any finite float.
Number = Union[StrictInt, FiniteFloat]


class Node(BaseModel):
    """Closed, strict, frozen: the rules of docs/format.md §0 for every object."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False,
                              hide_input_in_errors=True)


def refuse(message: str, *at: str | int) -> PydanticCustomError:
    """An error for a validator to raise, placed ``at`` below the node it checks.

    The boundary in ``check.py`` appends ``at`` to pydantic's location, so a rule checked
    on a write can still name ``….writes.<w>.params``.
    """
    return PydanticCustomError("causalab", "{message}", {"message": message, "at": tuple(at)})


def _name(name: str) -> str:
    """V30: a name that cannot be shown on one line as itself, or that is not one safe path
    segment (it becomes a file, a folder or a part of an MLflow key)."""
    why = unreadable_name(name)
    if why is not None:
        raise refuse(f"name {name!r} {why}: a name is shown in explain, MLflow and tables, so "
                     "it is printable, non-empty and has no leading or trailing space")
    why = unsafe_segment(name)
    if why is not None:
        # The path names it already (a key): said once keeps a long name's line short.
        raise refuse(f"this name {why}: a name becomes a file, a folder or an MLflow key, so "
                     "it is one safe path segment (no / or \\, not . or ..)")
    return name


# A name the author gives a node (a site, step, read, metric…): shown, so readable, and
# stored (a folder, a file, an MLflow key), so one safe path segment.
Name = Annotated[StrictStr, AfterValidator(_name)]
