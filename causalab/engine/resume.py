"""Prefix resume (PLATFORM §7): where an intervened forward may start from a cached residual.

A forward whose every tap sits at block ``R`` or later computes blocks ``0 … R−1`` exactly
as the un-intervened forward on the same rows does, so its trace can skip them and hand
block ``R−1``'s cached output on instead (nnsight's ``skip``: bit-exact on the built-in
families). This module decides ``R`` from plan data alone; the residuals live in the
document cache and the walk's trace does the skipping.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.plan import Forward
from causalab.engine.forwards import tap_ops


def resume_layer(forward: Forward) -> int | None:
    """The first block a prompt forward's taps touch, when it has writes and that is past
    block 0 (whole-model places after the stack count as the layer count), else None."""
    if forward.decode or not forward.writes:
        return None
    first = min(op.address.order[0] for op in tap_ops(forward).values())
    return first if first >= 1 else None


def hidden_width(model: Any) -> int:
    """The residual width of the loaded model, for the resume budget."""
    config = model._model.config
    config = getattr(config, "text_config", None) or config
    return int(getattr(config, "hidden_size", None) or getattr(config, "n_embd"))
