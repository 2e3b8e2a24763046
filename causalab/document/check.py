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
from causalab.document.step_references import check_steps
from causalab.document.sweep import Point, find_wrappers, lower
from causalab.errors import DocumentError, Path

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


def translate(error: ValidationError, data: Any) -> DocumentError:
    """The most specific of pydantic's errors as one ``DocumentError``.

    A failed union reports every branch; the branch that got deepest into the input is the
    one the author meant, so the deepest path wins (the first error among equals).
    """
    best: tuple[int, Path, str] | None = None
    for item in error.errors(include_url=False):
        path = _json_path(item["loc"], data, item["type"] == "missing")
        ctx = item.get("ctx") or {}
        message = item["msg"]
        if item["type"] == "causalab":
            path += tuple(ctx.get("at", ()))
            message = ctx["message"]
        elif item["type"] in _TAG_ERRORS:
            path += ("kind",)
        elif item["type"] == "extra_forbidden":
            message = f"unknown key {path[-1]!r}" if path else message
        if best is None or len(path) > best[0]:
            best = (len(path), path, message)
    assert best is not None
    return DocumentError(best[1], best[2])


def validate_point(doc: dict) -> Document:
    """Schema plus cross-reference rules for one lowered point; raises ``DocumentError``."""
    if not isinstance(doc, dict):
        raise DocumentError((), "a document is one JSON object")
    for path, _ in find_wrappers(doc):
        raise DocumentError(path, "a sweep wrapper survives in a point; lower the document "
                            "(causalab.document.lower) before validating its points")
    try:
        document = Document.model_validate(doc)
    except ValidationError as error:
        raise translate(error, doc) from None
    check_steps(document, check_references(document))
    return document


def validate(raw: dict) -> list[tuple[Point, Document]]:
    """Lower the sweeps of a raw document and validate every point on its own."""
    return [(point, validate_point(point.document)) for point in lower(raw)]


def json_schema() -> dict:
    """The JSON Schema of one point (a bare integer is accepted at every ``pos``)."""
    return Document.model_json_schema()
