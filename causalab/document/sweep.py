"""Sweep lowering (docs/format.md §10): one raw document with ``{"sweep": …}`` wrappers -> points.

Runs on the raw JSON, before any schema check, and knows nothing of what the swept values
mean. Each point is an ordinary document; nothing after this module knows a sweep happened.
The point count is computed from the axis lengths before a single point is built.

>>> [p.label for p in lower({"model": {}, "sites": {"t": {"layers": {"sweep": [[0], [1]]}}}})]
['layers=0', 'layers=1']
"""
from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from causalab.document.names import sanitised_label, unreadable_name, unsafe_segment
from causalab.document.vocab import MAX_POINTS
from causalab.errors import DocumentError, Path, shorten

WRAPPER_KEYS = frozenset({"sweep", "as"})
UNSWEEPABLE = ("model", "header")


@dataclass(frozen=True)
class Point:
    """One lowered document. ``label`` is ``""`` and ``coordinates`` empty when unswept."""

    label: str
    coordinates: dict = field(default_factory=dict)
    document: dict = field(default_factory=dict)
    # (wrapper path, where this point's value sits below it): ("sweep", i) or ("sweep", "range").
    origins: tuple = ()


def authored_path(point: Point, path: Path) -> Path:
    """A point's JSON path as the author wrote it: through the wrapper it was lowered from.

    >>> p = lower({"sites": {"t": {"heads": {"sweep": [[0], [1, 1]]}}}})[1]
    >>> authored_path(p, ("sites", "t", "heads", 1))
    ('sites', 't', 'heads', 'sweep', 1, 1)
    """
    for wrapper, below in point.origins:
        if tuple(path[:len(wrapper)]) == wrapper:
            return wrapper + below + tuple(path[len(wrapper):])
    return tuple(path)


@dataclass
class _Axis:
    name: str
    named: bool
    length: int
    wrappers: list[tuple[Path, Any]]  # (path, values: a list or a range)


def is_wrapper(value: Any) -> bool:
    """An object whose keys are a subset of {"sweep", "as"} and that contains "sweep"."""
    return isinstance(value, dict) and "sweep" in value and set(value) <= WRAPPER_KEYS


def refuse_near_wrappers(node: Any, path: Path = ()) -> None:
    """V6: an object with a wrapper's ``sweep`` (values or a range) beside keys no wrapper has
    is no wrapper (docs/format.md §10) and lowers as data, but its author meant one: refused here
    rather than as the field's wrong type. (A name-keyed map with a member called ``sweep``
    holds an object there, never values or a range.)"""
    if isinstance(node, list):
        for index, value in enumerate(node):
            refuse_near_wrappers(value, path + (index,))
    if not isinstance(node, dict):
        return
    spec = node.get("sweep")
    if (isinstance(spec, list) or (isinstance(spec, dict) and set(spec) == {"range"})) \
            and not set(node) <= WRAPPER_KEYS:
        extra = ", ".join(sorted(map(str, set(node) - WRAPPER_KEYS)))
        raise DocumentError(path, f'a sweep holds only "sweep" and "as"; found {extra}')
    for key, value in node.items():
        refuse_near_wrappers(value, path + (key,))


def find_wrappers(node: Any, path: Path = ()) -> Iterator[tuple[Path, dict]]:
    """Every wrapper in reading order (object keys as written, list items in order)."""
    if is_wrapper(node):
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from find_wrappers(value, path + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from find_wrappers(value, path + (index,))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _values(path: Path, wrapper: dict) -> list | range:
    spec = wrapper["sweep"]
    if "as" in wrapper and not (isinstance(wrapper["as"], str) and wrapper["as"]):
        raise DocumentError(path, '"as" names an axis and must be a non-empty string')
    if "as" in wrapper:
        name = wrapper["as"]
        why = unreadable_name(name) or unsafe_segment(name)
        if why is not None:
            raise DocumentError(path + ("as",), f"axis name {name!r} {why}: an axis names a "
                                "point's coordinate, an MLflow param, so it is printable and "
                                "one safe path segment")
    if isinstance(spec, list):
        values = spec
    elif isinstance(spec, dict) and set(spec) == {"range"}:
        bounds = spec["range"]
        if not (isinstance(bounds, list) and len(bounds) in (2, 3) and all(map(_is_int, bounds))):
            raise DocumentError(path, "range takes [start, stop] or [start, stop, step], "
                                f"all integers; got {json.dumps(bounds)}")
        if len(bounds) == 3 and bounds[2] == 0:
            raise DocumentError(path, "range step must not be 0")
        values = range(*bounds)
        try:
            len(values)
        except OverflowError:
            raise DocumentError(path, f"range {json.dumps(bounds)} has more values than "
                                f"MAX_POINTS = {MAX_POINTS}") from None
    else:
        raise DocumentError(path, 'a sweep is {"sweep": [values…]} or '
                            '{"sweep": {"range": [start, stop, step?]}}, optionally with '
                            f'"as": <axis name>; got {json.dumps(spec)[:80]}')
    if len(values) == 0:
        raise DocumentError(path, "empty sweep: it would give no point at all")
    for index, value in enumerate(values if isinstance(values, list) else ()):
        for inner, _ in find_wrappers(value, path + ("sweep", index)):
            raise DocumentError(inner, "a sweep's values hold no sweep of their own; sweep "
                                "each field where it sits (named axes sweep them together)")
    return values


def _label_name(path: Path) -> str:
    """The nearest string key above the wrapper: objective.1.0 -> objective."""
    for part in reversed(path):
        if isinstance(part, str):
            return part
    raise DocumentError(path, "a sweep must sit under a key")


def _axes(raw: dict) -> list[_Axis]:
    axes: list[_Axis] = []
    named: dict[str, _Axis] = {}
    for path, wrapper in find_wrappers(raw):
        if not path or path[0] in UNSWEEPABLE:
            raise DocumentError(path, f"{path[0] if path else 'the document'} defines what is "
                                "run and cannot be swept")
        values = _values(path, wrapper)
        name = wrapper.get("as")
        if name is None:
            axes.append(_Axis(_label_name(path), False, len(values), [(path, values)]))
            continue
        if name not in named:
            named[name] = _Axis(name, True, len(values), [])
            axes.append(named[name])
        axis = named[name]
        if len(values) != axis.length:
            first = ".".join(map(str, axis.wrappers[0][0]))
            raise DocumentError(path, f'axis "{name}" has {axis.length} values at {first} '
                                f"but {len(values)} here at {'.'.join(map(str, path))}")
        axis.wrappers.append((path, values))
    return axes


def shown(value: Any) -> str:
    """A swept value as a point's label prints it: a string as is, a one-element list as its
    element, anything else as compact JSON (``units=[0,1,2,3]``)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _place(document: dict, path: Path, value: Any) -> None:
    node = document
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = copy.deepcopy(value)


def lower(raw: dict) -> list[Point]:
    """The points of a raw document, in Cartesian order (first-appearing axis outermost).

    An unswept document is one point with label ``""``. Refusals (V6) carry the wrapper's
    path.
    """
    if not isinstance(raw, dict):
        raise DocumentError((), "a document is one JSON object")
    axes = _axes(raw)
    if not axes:
        return [Point(label="", coordinates={}, document=copy.deepcopy(raw))]
    count = math.prod(axis.length for axis in axes)
    if count > MAX_POINTS:
        raise DocumentError(axes[0].wrappers[0][0], f"the sweep has {count} points, more than "
                            f"MAX_POINTS = {MAX_POINTS} "
                            f"({' x '.join(str(a.length) for a in axes)})")
    points = []
    for combo in itertools.product(*(range(axis.length) for axis in axes)):
        document = copy.deepcopy(raw)
        parts, coordinates, origins = [], {}, []
        for axis, i in zip(axes, combo):
            for path, values in axis.wrappers:
                _place(document, path, values[i])
                origins.append((path, ("sweep", "range" if isinstance(values, range) else i)))
            for name, value, shown in _axis_parts(axis, i):
                coordinates[name] = copy.deepcopy(value)
                parts.append(f"{name}={shown}")
        label = sanitised_label(",".join(parts))
        why = unsafe_segment(label)
        if why is not None:
            raise DocumentError(axes[0].wrappers[0][0],
                                f"the point label {shorten(label, 32)!r} {why}: it names the "
                                f"point's folder; {_hint(axes)}sweep shorter values")
        points.append(Point(label=label, coordinates=coordinates, document=document,
                            origins=tuple(origins)))
    distinct = len({p.label for p in points})
    if distinct != len(points):
        hint = _hint(axes).removesuffix(" and ")
        raise DocumentError(axes[0].wrappers[0][0], f"sweep labels collide: {len(points)} "
                            f"points but {distinct} distinct labels"
                            + (f"; {hint}" if hint else ""))
    return points


def _axis_parts(axis: _Axis, i: int) -> list[tuple[str, Any, str]]:
    """``(name, coordinate, shown)`` for one axis of a point's label: the axis and its value,
    or, for wrappers tied with "as" whose values differ, each wrapper's key and value
    (``layers=23,heads=3``); wrappers under one key give ``pair=(23,3)``."""
    first = axis.wrappers[0][1]
    if all(list(values) == list(first) for _, values in axis.wrappers[1:]):
        return [(axis.name, first[i], shown(first[i]))]
    keys = [_label_name(path) for path, _ in axis.wrappers]
    if len(set(keys)) == len(keys):
        return [(key, values[i], shown(values[i]))
                for key, (_, values) in zip(keys, axis.wrappers)]
    each = [values[i] for _, values in axis.wrappers]
    return [(axis.name, each, "(" + ",".join(map(shown, each)) + ")")]


def _hint(axes: list[_Axis]) -> str:
    """'name the axes with "as" and ' where some axis is unnamed, else nothing."""
    return 'name the axes with "as" and ' if any(not axis.named for axis in axes) else ""
