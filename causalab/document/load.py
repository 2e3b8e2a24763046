"""Read a document's JSON text: duplicate keys (V4) and non-finite numbers (V3) refused.

Python's ``json`` silently keeps the last of two equal keys and reads ``NaN``/``Infinity``;
docs/format.md §0 refuses both, each at its JSON path. A syntax error names the file, line and column.
Opens at most one file; knows nothing of the schema.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path as FilePath
from typing import Any

from causalab.errors import DocumentError, Path


class _Pairs(list):
    """An object's key/value pairs as parsed, before duplicates are looked for."""


class _NonFinite:
    def __init__(self, text: str):
        self.text = text


def _number(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _build(node: Any, path: Path) -> Any:
    if isinstance(node, _Pairs):
        out: dict = {}
        for key, value in node:
            if key in out:
                raise DocumentError(path, f"duplicate key {key!r} in one object")
            out[key] = _build(value, path + (key,))
        return out
    if isinstance(node, list):
        return [_build(value, path + (index,)) for index, value in enumerate(node)]
    if isinstance(node, _NonFinite):
        raise DocumentError(path, f"non-finite number {node.text} (JSON has no NaN/Infinity)")
    return node


def _is_path(value: str | os.PathLike) -> bool:
    if isinstance(value, os.PathLike):
        return True
    if value.lstrip()[:1] in ("{", "[") or "\n" in value or len(value) > 4096:
        return False
    return value.endswith(".json") or FilePath(value).is_file()


def load_json(text_or_path: str | os.PathLike, *, name: str | None = None) -> Any:
    """Parse a document from JSON text or a file path; ``name`` labels text in messages.

    >>> load_json('{"a": [1, 2]}')
    {'a': [1, 2]}
    """
    name = name or "<text>"
    if _is_path(text_or_path):
        name = os.fspath(text_or_path)
        try:
            text = FilePath(name).read_text(encoding="utf-8")
        except OSError as error:
            raise DocumentError((), f"cannot read {name}: {error.strerror or error}") from None
    else:
        text = text_or_path
    try:
        parsed = json.loads(text, object_pairs_hook=_Pairs, parse_float=_number,
                            parse_constant=_NonFinite)
    except json.JSONDecodeError as error:
        raise DocumentError((), f"{name}: line {error.lineno} column {error.colno}: "
                            f"not valid JSON ({error.msg})") from None
    return _build(parsed, ())
