"""Validate points: the one boundary where pydantic errors become ``DocumentError``.

``validate_point`` runs the schema, then the cross-node rules; ``validate`` lowers a raw
document's sweeps first. Pydantic's error locations name union branches
(``steps.s.observe.rows``, ``operand.Ref.ref``); they are walked against the input so the
reported path is the JSON path alone. Needs no model, tokenizer, data or network.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from causalab.document.references import check_references
from causalab.document.schema import Document
from causalab.document.references import check_steps
from causalab.document.sweep import (Point, authored_path, find_wrappers, lower,
                                     refuse_near_wrappers)
from causalab.errors import DocumentError, Path, shorten

_TAG_ERRORS = ("union_tag_invalid", "union_tag_not_found")


def _json_path(loc: tuple, data: Any, missing: bool) -> Path:
    """Keep the parts of ``loc`` that index the input; drop pydantic's branch names."""
    path: list = []
    node = data
    for n, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif (isinstance(node, list) and isinstance(part, int) and not isinstance(part, bool)
              and 0 <= part < len(node)):
            node = node[part]
        elif not (missing and n == len(loc) - 1 and isinstance(node, dict)):
            continue
        path.append(part)
    return tuple(path)


# pydantic words these with the schema's class (``instance of ModelSpec``): not the author's.
_NAMING_A_CLASS = ("model_type", "dict_type")
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "finite_number":
             "a finite number", "string_type": "a string", "bool_type": "a boolean",
             "model_type": "an object", "dict_type": "an object", "list_type": "a list",
             "tuple_type": "a list", "none_type": "null"}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return f"non-finite {value}"
    return {int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _message(item: dict) -> str:
    ctx = item.get("ctx") or {}
    if item["type"] == "causalab":
        return ctx["message"]
    if item["type"] == "union_tag_not_found":
        return "missing required field 'kind'"
    if item["type"] == "union_tag_invalid":
        # pydantic quotes the tag whole; a list or object there has quotes inside it, so the
        # cut of long quoted strings would not find it.
        return (f"unknown kind {shorten(str(ctx.get('tag')))!r}; expected one of "
                f"{ctx.get('expected_tags')}")
    return item["msg"]


def _path(item: dict, data: Any) -> Path:
    path = _json_path(item["loc"], data, item["type"] == "missing")
    if item["type"] == "causalab":
        return path + tuple((item.get("ctx") or {}).get("at", ()))
    if item["type"] in _TAG_ERRORS:
        return path + ("kind",)
    return path


def translate(error: ValidationError, data: Any) -> DocumentError:
    """The most specific of pydantic's errors as one ``DocumentError``.

    A failed union reports every branch; the branch that got deepest into the input is the
    one the author meant, so the deepest path wins (the first error among equals). Type
    errors of several branches at that path are merged into one "expected a or b".
    """
    items = error.errors(include_url=False)
    paths = [_path(item, data) for item in items]
    best = max(range(len(items)), key=lambda i: (len(paths[i]), -i))
    path, item = paths[best], items[best]
    message = _message(item)
    if item["type"] == "extra_forbidden" and path:
        message = f"unknown key {path[-1]!r}"
    elif item["type"] == "missing" and path:
        message = f"missing required field {path[-1]!r}"
    elif item["type"] in ("too_short", "string_too_short") \
            and (item.get("ctx") or {}).get("min_length") == 1:
        message = "must not be empty"
    same = [it for it, p in zip(items, paths) if p == path and it["type"] in _EXPECTED]
    if item["type"] in _EXPECTED and (len(same) > 1 or item["type"] in _NAMING_A_CLASS):
        expected = list(dict.fromkeys(_EXPECTED[it["type"]] for it in same))
        message = f"expected {' or '.join(expected)}, got {_json_type(item.get('input'))}"
    return DocumentError(path, message)


def validate_point(doc: dict) -> Document:
    """Schema plus cross-reference rules for one lowered point; raises ``DocumentError``."""
    if not isinstance(doc, dict):
        raise DocumentError((), "a document is one JSON object")
    for path, _ in find_wrappers(doc):
        raise DocumentError(path, "a sweep wrapper survives in a point; lower the document "
                            "(causalab.document.lower) before validating its points")
    refuse_near_wrappers(doc)
    try:
        document = Document.model_validate(doc)
    except ValidationError as error:
        raise translate(error, doc) from None
    check_steps(document, check_references(document))
    return document


def validate(raw: dict) -> list[tuple[Point, Document]]:
    """Lower the sweeps of a raw document and validate every point on its own; a point's
    refusal names the path as authored (``heads.sweep.1.0``, not the lowered ``heads.0``)."""
    checked = []
    for point in lower(raw):
        try:
            checked.append((point, validate_point(point.document)))
        except DocumentError as error:
            raise DocumentError(authored_path(point, error.path), error.message) from None
    return checked


def naming_warnings(raw: Any) -> list[tuple[Path, str]]:
    """Names a reader would misread, as ``(path, message)``: never a refusal. ``iia`` (the
    interchange-intervention accuracy) names a ``match`` metric only; MLflow, the plots and
    the tables show a metric by its name, so a logit difference called ``iia`` reads as an
    accuracy there.

    >>> naming_warnings({"interventions": {"das": {"metrics": {"iia": {"kind": "logit_diff"}}}}})
    [(('interventions', 'das', 'metrics', 'iia'), "a metric named 'iia' is an interchange-intervention accuracy, a match; this one is a logit_diff: name it for what it is (e.g. 'logit_diff')")]
    """
    found: list[tuple[Path, str]] = []
    interventions = raw.get("interventions") if isinstance(raw, dict) else None
    for name, body in (interventions or {}).items():
        entries = list(enumerate(body)) if isinstance(body, list) else [(None, body)]
        for index, entry in entries:
            metrics = entry.get("metrics") if isinstance(entry, dict) else None
            metric = (metrics or {}).get("iia") if isinstance(metrics, dict) else None
            kind = metric.get("kind") if isinstance(metric, dict) else None
            if isinstance(kind, str) and kind != "match":
                at = ("interventions", name) + (() if index is None else (index,))
                found.append((at + ("metrics", "iia"),
                              f"a metric named 'iia' is an interchange-intervention accuracy, "
                              f"a match; this one is a {kind}: name it for what it is "
                              f"(e.g. {kind!r})"))
    return found
