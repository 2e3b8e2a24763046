"""The exported JSON Schema: the authored form, with the point form beside it.

A document is written with ``{"sweep": …}`` wrappers wherever a value is (except under
``model`` and ``header``), and each point is the same document with every wrapper replaced by
one of its values. The export's root describes the authored form, so a schema-aware editor
accepts what ``causalab validate`` accepts; ``$defs.Document`` is the lowered point. The
authored definitions are derived from pydantic's point schema by one walk, so there is no
second schema to keep in step. Like the schema itself, this knows nothing about what a swept
value means: a sweep's values must each fit the slot they replace.
"""
from __future__ import annotations

import copy
from typing import Any

from causalab.document.schema import Document
from causalab.document.sweep import UNSWEEPABLE

_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_REF = "#/$defs/"
_AUTHORED = "Authored"
_SHOWN = ("title", "description", "default")
_RANGE = {
    "type": "object", "additionalProperties": False, "required": ["range"],
    "properties": {"range": {"type": "array", "items": {"type": "integer"},
                             "minItems": 2, "maxItems": 3}},
}


def _authored_ref(ref: str) -> str:
    return _REF + _AUTHORED + ref[len(_REF):]


def _accepts_integer(node: dict) -> bool:
    """A ``range`` sweep yields integers, so it is offered only where an integer fits."""
    if node.get("type") in ("integer", "number"):
        return True
    return any(_accepts_integer(branch) for branch in node.get("anyOf", ()))


def _wrapper(slot: dict) -> dict:
    """A sweep over ``slot``: a non-empty list of point-form values (or a range of ints)."""
    values: Any = {"type": "array", "minItems": 1, "items": slot}
    if _accepts_integer(slot):
        values = {"anyOf": [values, {"$ref": _REF + "SweepRange"}]}
    return {
        "type": "object", "additionalProperties": False, "required": ["sweep"],
        "properties": {"sweep": values, "as": {"type": "string", "minLength": 1}},
    }


def _value(slot: dict) -> dict:
    """A value position: the slot itself (authored inside) or a sweep over it."""
    point = {k: v for k, v in slot.items() if k not in _SHOWN}
    shown = {k: slot[k] for k in _SHOWN if k in slot}
    return {**shown, "anyOf": [_inner(point), _wrapper(point)]}


def _inner(node: dict) -> dict:
    """``node`` with every value below it (properties, entries, items) made sweepable."""
    out = dict(node)
    if "$ref" in out:
        out["$ref"] = _authored_ref(out["$ref"])
    if "properties" in out:
        out["properties"] = {name: _value(sub) for name, sub in out["properties"].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _value(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = _value(out["items"])
    if "prefixItems" in out:
        out["prefixItems"] = [_value(sub) for sub in out["prefixItems"]]
    for key in ("anyOf", "oneOf"):
        if key in out:
            # Branches share one position: sweepable once, around the union, not per branch.
            out["anyOf"] = [_inner(branch) for branch in out.pop(key)]
    if "discriminator" in out:
        mapping = out["discriminator"].get("mapping", {})
        out["discriminator"] = {**out["discriminator"],
                                "mapping": {k: _authored_ref(v) for k, v in mapping.items()}}
    return out


def json_schema() -> dict:
    """The authored form at the root; ``$defs`` holds each point node and its authored twin.

    >>> schema = json_schema()
    >>> sorted(k for k in schema["$defs"] if not k.startswith("Authored"))[:3]
    ['Anneal', 'CrossEntropyMetric', 'Document']
    """
    point = Document.model_json_schema()
    defs = point.pop("$defs")
    authored_defs = {_AUTHORED + name: _inner(body) for name, body in defs.items()}
    root = _inner(copy.deepcopy(point))
    for name in UNSWEEPABLE:
        root["properties"][name] = point["properties"][name]
    return {
        "$schema": _DIALECT,
        **root,
        "title": "causalab document (authored: sweep wrappers allowed)",
        "$defs": {**defs, "Document": point, **authored_defs, "SweepRange": _RANGE},
    }


def point_schema() -> dict:
    """The schema of one lowered point, resolvable on its own (the same ``$defs``)."""
    return {"$schema": _DIALECT, "$ref": _REF + "Document", "$defs": json_schema()["$defs"]}
