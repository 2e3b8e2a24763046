"""Read a document's JSON: its bytes, then its tree, refusing what docs/format.md §0 forbids.

Python's ``json`` silently keeps the last of two equal keys, reads ``NaN``/``Infinity``,
accepts lone surrogates, parses integers of any length and recurses as deep as the input
nests. docs/format.md §0 refuses each: duplicate keys (V4), non-finite numbers (V3), strings that are
not Unicode and integers past ±(2⁵³−1) at their JSON path; input that is not UTF-8, nests
deeper than ``MAX_DEPTH`` or is longer than ``MAX_BYTES`` at its file, line and column.
A syntax error names the file, line and column. Opens at most one file; knows nothing of
the schema.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path as FilePath
from typing import Any

from causalab.errors import DocumentError, Path

MAX_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
MAX_INTEGER = 2 ** 53 - 1  # the integers every JSON reader holds exactly
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class _Pairs(list):
    """An object's key/value pairs as parsed, before duplicates are looked for."""


class _Refused:
    """A scalar the parser met and the tree builder refuses at its path."""

    def __init__(self, message: str):
        self.message = message


def _number(text: str) -> Any:
    value = float(text)
    if math.isfinite(value):
        return value
    return _Refused(f"non-finite number {text} (JSON has no NaN/Infinity)")


def _integer(text: str) -> Any:
    digits = text.lstrip("-")
    if len(digits) > 16 or int(digits) > MAX_INTEGER:
        shown = text if len(text) <= 24 else f"{text[:12]}… ({len(digits)} digits)"
        return _Refused(f"integer {shown} is out of range (|n| ≤ 2^53 - 1)")
    return int(text)


def _constant(text: str) -> _Refused:
    return _Refused(f"non-finite number {text} (JSON has no NaN/Infinity)")


def _unicode(text: str, path: Path) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DocumentError(path, "string is not valid Unicode (a lone surrogate escape)") from None
    return text


def _build(node: Any, path: Path) -> Any:
    if isinstance(node, _Pairs):
        out: dict = {}
        for key, value in node:
            if key in out:
                raise DocumentError(path, f"duplicate key {key!r} in one object")
            shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
            out[_unicode(key, path + (shown,))] = _build(value, path + (key,))
        return out
    if isinstance(node, list):
        return [_build(value, path + (index,)) for index, value in enumerate(node)]
    if isinstance(node, _Refused):
        raise DocumentError(path, node.message)
    if isinstance(node, str):
        return _unicode(node, path)
    return node


def _where(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"line {line} column {offset - (text.rfind(chr(10), 0, offset) + 1) + 1}"


def _check_depth(text: str, name: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH at the bracket that goes too deep, before parsing.

    Strings are blanked first (same length, so offsets hold) and only brackets are walked.
    """
    blank = _STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', text)
    depth = 0
    for match in _BRACKET.finditer(blank):
        depth += 1 if match.group() in "[{" else -1
        if depth > MAX_DEPTH:
            raise DocumentError((), f"{name}: {_where(text, match.start())}: nested more than "
                                f"{MAX_DEPTH} deep")


def _decode(data: bytes, name: str) -> str:
    if len(data) > MAX_BYTES:
        raise DocumentError((), f"{name}: {len(data)} bytes, more than MAX_BYTES = {MAX_BYTES}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        good = data[:error.start].decode("utf-8", errors="replace")
        raise DocumentError((), f"{name}: {_where(good, len(good))}: not UTF-8 "
                            f"(byte 0x{data[error.start]:02x} at offset {error.start})") from None


def _is_path(value: str | os.PathLike) -> bool:
    if isinstance(value, os.PathLike):
        return True
    if value.lstrip()[:1] in ("{", "[") or "\n" in value or len(value) > 4096:
        return False
    try:
        return value.endswith(".json") or FilePath(value).is_file()
    except (OSError, ValueError):  # a name too long for the system, a NUL byte
        return False


def _text(source: str | bytes | os.PathLike, name: str | None) -> tuple[str, str]:
    """(JSON text, the name messages use) of text, bytes or a file path."""
    if isinstance(source, bytes):
        return _decode(source, name or "<bytes>"), name or "<bytes>"
    if not _is_path(source):
        text = source[1:] if source.startswith("\ufeff") else source
        if len(text) > MAX_BYTES:
            raise DocumentError((), f"{name or '<text>'}: longer than MAX_BYTES = {MAX_BYTES}")
        return text, name or "<text>"
    name = os.fspath(source)
    try:
        if os.path.getsize(name) > MAX_BYTES:
            raise DocumentError((), f"{name}: larger than MAX_BYTES = {MAX_BYTES}")
        data = FilePath(name).read_bytes()
    except OSError as error:
        raise DocumentError((), f"cannot read {name}: {error.strerror or error}") from None
    return _decode(data, name), name


def load_json(source: str | bytes | os.PathLike, *, name: str | None = None) -> Any:
    """Parse a document from JSON text, bytes or a file path; ``name`` labels it in messages.

    >>> load_json('{"a": [1, 2]}')
    {'a': [1, 2]}
    """
    text, name = _text(source, name)
    _check_depth(text, name)
    try:
        parsed = json.loads(text, object_pairs_hook=_Pairs, parse_float=_number,
                            parse_int=_integer, parse_constant=_constant)
    except json.JSONDecodeError as error:
        raise DocumentError((), f"{name}: line {error.lineno} column {error.colno}: "
                            f"not valid JSON ({error.msg})") from None
    return _build(parsed, ())
