"""Prepared taps: each read or write of one trace with its window over the trace's rows.

Plain data made before a trace opens, from plan ops, resolved windows and the walk state's
featurizers and published outputs; the walk's ``_issue`` acts on them in forward order. It
never opens a trace and never touches a tensor of the model.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from causalab.compile.plan import Forward, Pass, WriteOp
from causalab.engine import windows as window_rules
from causalab.engine.forwards import tap_ops
from causalab.engine.seam import Window
from causalab.errors import RunError


class PreparedTap(NamedTuple):
    """One tap of a trace: the op, where it acts, and (writes) its featurizer and operand.

    ``out`` is the key its value lands under (the op's name, a fused point's ``(point,
    name)``, or a whole key); ``whole`` keeps the address's whole tensor instead of a gather.
    """

    kind: str
    op: Any
    window: Window
    featurizer: Any = None
    operand: Any = None
    out: Any = None
    whole: bool = False

    @property
    def key(self) -> Any:
        return self.op.name if self.out is None else self.out


def prepare(pass_: Pass, forward: Forward, state: Any, chunk: tuple, resolved: dict,
            values: dict, local: dict, taps: tuple, last: int | None = None) -> dict:
    """Per tap of ``taps``: a :class:`PreparedTap` over the rows ``chunk``.

    A generated-frame op lands on ``last``, the last index of its decode step's sequence.
    """
    ops = tap_ops(forward)
    prepared = {}
    for kind, name in taps:
        op = ops[(kind, name)]
        if op.pos.frame == "generated":
            window = Window.from_windows([(last,)] * len(chunk))
        else:
            windows, _ = resolved[(kind, name, forward.input)]
            window = window_rules.layout(windows, chunk, op.pos.ragged)
        if kind == "write":
            name_f = op.featurizer
            featurizer = state.featurizers.get(name_f) if name_f != "identity" else None
            operand = _operand(op, pass_, state, chunk, values, local, window)
            prepared[(kind, name)] = PreparedTap(kind, op, window, featurizer, operand)
        else:
            prepared[(kind, name)] = PreparedTap(kind, op, window)
    return prepared


def _operand(write: WriteOp, pass_: Pass, state: Any, chunk: tuple, values: dict,
             local: dict, window: Window) -> Any:
    operand = write.operand
    if operand.kind == "literal":
        return operand.value
    if operand.kind == "none":
        return None
    if operand.kind == "read":
        published = values[operand.name].slice_rows([local[r] for r in chunk])
        return published.value
    published = state.published.get(operand.name)
    where = ("interventions", pass_.intervention, "writes", write.name, "operand")
    if published is None:
        raise RunError(where, f"no published output {operand.name!r}")
    if published.reduce != "none":
        return published.value
    sliced = published.slice_rows(chunk)
    if sliced.counts is not None and tuple(sliced.counts) != tuple(window.counts):
        bad = [row for row, a, b in zip(chunk, sliced.counts, window.counts) if a != b]
        raise RunError(where, f"operand {operand.name!r} was read over a different number of "
                       f"positions on rows {bad}")
    return sliced.value
