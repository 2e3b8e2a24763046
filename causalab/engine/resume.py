"""Prefix resume (docs/platform.md §7): where an intervened forward may start from a cached residual.

A forward whose every tap sits at block ``R`` or later (or at block ``R−1``'s output)
computes blocks ``0 … R−1`` exactly
as the un-intervened forward on the same rows does, so its trace can skip them and hand
block ``R−1``'s cached output on instead (nnsight's ``skip``: bit-exact on the built-in
families). This module decides ``R`` from plan data alone; the residuals live in the
document cache and the walk's trace does the skipping.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.plan import Forward
from causalab.document import vocab
from causalab.engine.forwards import tap_ops


# A tap at a block's output needs nothing of that block computed: the skipped block's output
# is the kept residual, and the tap reads or writes it there (bit-exact, like any skip).
_BLOCK_OUTPUT = vocab.COMPONENTS["block_output"]["accessor"]


def _first_block(address: Any) -> int:
    layer = address.order[0]
    return layer + 1 if address.accessor == _BLOCK_OUTPUT else layer


def resume_layer(forward: Forward) -> int | None:
    """The first block a prompt forward must compute, when it has writes and that is past
    block 0 (whole-model places after the stack count as the layer count), else None."""
    if forward.decode or not forward.writes:
        return None
    first = min(_first_block(op.address) for op in tap_ops(forward).values())
    return first if first >= 1 else None


def hidden_width(model: Any) -> int:
    """The residual width of the loaded model, for the resume budget."""
    config = model._model.config
    config = getattr(config, "text_config", None) or config
    return int(getattr(config, "hidden_size", None) or getattr(config, "n_embd"))
