"""Data tables: dataset references, role fields, example ids and anchor values (docs/format.md §4).

Reads JSON tables under the data root and nothing else; it never tokenizes. Every refusal is a
:class:`CompileError` at the path of the document node that asked for the rows (C1, C14, C17).

    >>> field_value({"c": [{"x": "hi"}]}, "c[0].x", ())
    'hi'
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from causalab import files
from causalab.errors import CompileError

_SEGMENT = re.compile(r"^([^\[\]]+)((?:\[\d+\])*)$")


@dataclass(frozen=True)
class Table:
    """The rows a reference selects, in file order, with their stable ids."""

    ref: str
    rows: tuple[dict, ...]
    example_ids: tuple[str, ...]
    # Zero-based indices of these rows in the whole file, for the disjointness check (C18).
    source: tuple[int, ...]
    file: str


@functools.lru_cache(maxsize=32)
def _parsed(file: str, stamp: tuple | None) -> Any:
    """A data file's JSON, parsed once while it is unchanged: every pass and every sweep point
    of a document reads the same tables. Callers never mutate rows. A leading byte-order
    mark is dropped, as a document's is."""
    return json.loads(Path(file).read_text(encoding="utf-8-sig"))


def load_rows(ref: str, data_root: str, path: tuple) -> Table:
    """The rows of ``ref`` (``weekdays/data#train``) under ``data_root``; refusals at ``path``."""
    name, hash_, split = ref.partition("#")
    if hash_ and not split:
        raise CompileError(path, f"dataset {ref!r} names no split after '#' (drop the '#' for "
                                 "every row)")
    try:
        root = Path(data_root).resolve()
        file = (root / f"{name}.json").resolve()
        found = file.is_file()
    except (OSError, ValueError) as err:  # a name too long for the system, a NUL byte
        raise CompileError(path, f"dataset {ref!r} is not a usable file name: {err}") from None
    if root != file and root not in file.parents:
        raise CompileError(path, f"dataset {ref!r} escapes the data root {data_root!r}")
    if not found:
        raise CompileError(path, f"dataset {ref!r} not found: no file {file}")
    try:
        table = _parsed(str(file), files.stamp(file))
    except (OSError, ValueError) as err:
        raise CompileError(path, f"dataset {ref!r} is not readable JSON: {err}") from None
    except RecursionError:  # C1: a table nested deeper than the parser recurses
        raise CompileError(path, f"dataset {ref!r} ({file}) nests deeper than the JSON reader "
                                 "recurses") from None
    if not isinstance(table, list) or not all(isinstance(r, dict) for r in table):
        raise CompileError(path, f"dataset {ref!r} is not a JSON array of row objects")
    picked = [i for i, r in enumerate(table) if not split or r.get("split") == split]
    if not picked:
        where = f"split {split!r} of " if split else ""
        raise CompileError(path, f"{where}dataset {ref!r} has no rows")
    rows = tuple(table[i] for i in picked)
    return Table(ref, rows, _example_ids(rows, path), tuple(picked), str(file))


def _example_ids(rows: tuple[dict, ...], path: tuple) -> tuple[str, ...]:
    ids = tuple(str(r["example_id"]) if r.get("example_id") is not None else str(i)
                for i, r in enumerate(rows))
    seen: set[str] = set()
    for i, example_id in enumerate(ids):
        if example_id in seen:
            raise CompileError(path, f"duplicate example_id {example_id!r} (row {i})")
        seen.add(example_id)
    return ids


@functools.lru_cache(maxsize=256)
def parse_field(field: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``counterfactual_inputs[0].a`` -> ``(("counterfactual_inputs", (0,)), ("a", ()))``;
    parsed once per field, not once per row."""
    parts = []
    for segment in field.split("."):
        match = _SEGMENT.match(segment)
        if not match:
            raise ValueError(f"malformed field path {field!r}")
        indices = tuple(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
        parts.append((match.group(1), indices))
    return tuple(parts)


def field_value(row: dict, field: str, path: tuple) -> Any:
    """Walk ``field`` into ``row``; a missing key or an index past the end is refused (C1)."""
    value: Any = row
    for key, indices in parse_field(field):
        if not isinstance(value, dict) or key not in value:
            raise CompileError(path, f"field {field!r}: no {key!r} in the row")
        value = value[key]
        for index in indices:
            if not isinstance(value, list):
                raise CompileError(path, f"field {field!r}: {key!r} is a "
                                         f"{type(value).__name__}, not a list to index")
            if index >= len(value):
                raise CompileError(path, f"field {field!r}: index {index} past the end")
            value = value[index]
    return value


def role_values(table: Table, field: str, path: tuple) -> tuple[Any, ...]:
    """Every row's value at ``field``: a string, or a list of chat messages (C1 otherwise)."""
    values = []
    for i, row in enumerate(table.rows):
        try:
            value = field_value(row, field, path)
        except CompileError as error:  # which row: a table has hundreds
            raise CompileError(path, f"row {i} (example_id {table.example_ids[i]!r}): "
                                     f"{error.message}") from None
        if not isinstance(value, str) and not is_chat(value):
            raise CompileError(path, f"row {i}: field {field!r} is not a string or chat messages")
        values.append(value)
    return tuple(values)


def is_chat(value: Any) -> bool:
    """A list of ``{role, content}`` messages."""
    return (isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in value))


def anchor_values(table: Table, field: str, variable: str, path: tuple) -> tuple[str | None, ...]:
    """Per-row value of ``variable`` (docs/format.md §4): the ``<F>_variables`` sibling, else the top column.

    A name found in neither place on any row is refused (C14) naming both places looked.
    """
    head, indices = parse_field(field)[0]
    sibling = f"{head}_variables"
    values, found = [], False
    for row in table.rows:
        value = _sibling_value(row, sibling, indices, variable)
        if value is None and variable in row:
            value = row[variable]
        found = found or value is not None or variable in row
        values.append(value if isinstance(value, str) else None)
    if not found:
        place = f"{sibling}{''.join(f'[{i}]' for i in indices)}.{variable}"
        raise CompileError(path, f"variable {variable!r} found neither at {place} "
                                 f"nor as a top-level column {variable!r}")
    return tuple(values)


def _sibling_value(row: dict, sibling: str, indices: list[int], variable: str) -> Any:
    value: Any = row.get(sibling)
    for index in indices:
        if not isinstance(value, list) or index >= len(value):
            return None
        value = value[index]
    return value.get(variable) if isinstance(value, dict) else None


def column_cells(table: Table, column: str, path: tuple) -> tuple[Any, ...]:
    """Every row's cell of ``column``; a column that no row has is refused (C17)."""
    if not any(column in row for row in table.rows):
        raise CompileError(path, f"no row of {table.ref!r} has a column {column!r}")
    return tuple(row.get(column) for row in table.rows)


def shared_rows(a: Table, b: Table) -> int:
    """How many rows two references of one file share (0 across different files)."""
    if a.file != b.file:
        return 0
    return len(set(a.source) & set(b.source))
