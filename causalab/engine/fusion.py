"""Fusion: which sweep points' intervened forwards share one trace, and how they share it.

Plain planning over plan data and the seam's windows; it never opens a trace (the walk does)
and never changes a number. Fused points run the same prompt rows padded to the same width,
stacked one copy per point; left padding, the mask and position ids make a row's
activations independent of the rows beside it, and each point's writes and reads act on its
own slice of rows only. Points fuse only where that is plainly so: every step is an
``Observe``, nothing decodes, every operand is computed inside the pass (a literal, a read,
none; never an output published by another step), and the points' passes have the same
rows, the same inputs and the same forwards. Anything else runs one point at a time.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.plan import Forward, Observe, Plan
from causalab.engine.forwards import batch_key, tap_ops
from causalab.engine.seam import Window

# Tokens one fused trace may hold when no batch size bounds it (rows × padded width).
_FUSED_TOKENS = 16384
_OPERANDS = ("literal", "read", "none")


def signature(point: Any) -> tuple | None:
    """What a point's passes must share with another's to be fused, or None when it cannot
    be: a step other than ``Observe``, a decode, an operand from outside the pass, or no
    intervened forward at all (un-intervened forwards are already shared per document)."""
    if not isinstance(point, Plan) or not point.children:
        return None
    shape, written = [], False
    for node in point.children:
        if not isinstance(node, Observe):
            return None
        pass_ = node.pass_
        forwards = []
        for forward in pass_.forwards:
            if forward.decode or any(w.operand.kind not in _OPERANDS for w in forward.writes):
                return None
            written = written or bool(forward.writes)
            forwards.append((forward.input, bool(forward.writes)))
        inputs = tuple(sorted((role, batch_key(batch)) for role, batch in pass_.inputs.items()))
        shape.append((pass_.rows, inputs, tuple(forwards)))
    return tuple(shape) if written else None


def _capacity(point: Plan, batch_size: int | None) -> int:
    """How many copies of the point's rows one trace may hold."""
    passes = [node.pass_ for node in point.children]
    rows = max(pass_.rows for pass_ in passes)
    if batch_size:
        return batch_size // max(rows, 1)
    tokens = max(pass_.rows * batch.tokens for pass_ in passes for batch in pass_.inputs.values())
    return _FUSED_TOKENS // max(tokens, 1)


def groups(points: list, batch_size: int | None = None) -> list[list]:
    """``points`` in order, cut into runs that share traces: consecutive points of one
    signature, as many as one trace holds. A point that cannot be fused is alone."""
    runs: list[tuple[tuple | None, list]] = []
    for point in points:
        key = signature(point)
        if (key is not None and runs and runs[-1][0] == key
                and len(runs[-1][1]) < _capacity(point, batch_size)):
            runs[-1][1].append(point)
        else:
            runs.append((key, [point]))
    return [members for _, members in runs]


def shifted(window: Window, start: int) -> Window:
    """``window`` moved to rows ``start …`` of a fused batch."""
    return Window(window.batch_rows + start, window.positions, window.width, window.counts)


def issue_order(forwards: list[Forward]) -> list[tuple[int, str, str]]:
    """Every fused point's taps as ``(point, kind, name)`` in one forward order.

    Address order first, then writes before reads at one order, then the point, then the
    point's own tap order: each point's taps keep the plan's order among themselves.
    """
    keyed = []
    for unit, forward in enumerate(forwards):
        ops = tap_ops(forward)
        for index, (kind, name) in enumerate(forward.taps):
            order = tuple(ops[(kind, name)].address.order)
            keyed.append(((order, kind != "write", unit, index), (unit, kind, name)))
    return [tap for _, tap in sorted(keyed, key=lambda item: item[0])]
