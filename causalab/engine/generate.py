"""Generation bookkeeping (docs/format.md §11): which taps act at which decode step, and the generated frame.

A decoding forward is N traced steps over one growing KV cache: step 0 is the prefill over
the whole prompt, step k > 0 runs the one token generated at step k − 1. This module decides,
from plan data alone, what each step issues and how stacked per-step reads are cut once the
continuation is known; it never opens a trace (the walk does) and never tokenizes. Every
generated-frame op acts on the last index of its step's sequence axis, the position whose
logits choose that step's token. The stop token is held off by never stopping, not by
masking it: each step takes the argmax of the logits the step's writes left, so a stop token
can be generated and the frame is cut after it, while the batch stays rectangular.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from causalab.compile.plan import Forward, Pass, PositionSpec
from causalab.engine.forwards import tap_ops
from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from nnterp import StandardizedTransformer

# The walk's per-forward results carry the generated ids under this name; a read name never
# holds "@" (names are identifiers), so it cannot collide.
GENERATED = "@generated"


def fixed_step(spec: PositionSpec) -> int | None:
    """The one decode step an un-scoped ``{"frame": "generated", "index": k ≥ 0}`` names."""
    if spec.frame != "generated" or spec.variable or spec.segment:
        return None
    return spec.index if spec.index is not None and spec.index >= 0 else None


def acts_at(spec: PositionSpec, step: int, *, write: bool) -> bool:
    """Whether an op with position ``spec`` is issued at decode ``step``.

    Prompt-frame ops act at the prefill only; a fixed generated step at that step; a
    generated ``all`` write at every step; any other generated read (a cut of the finished
    continuation) at every step, to be stacked and cut afterwards.
    """
    if spec.frame != "generated":
        return step == 0
    k = fixed_step(spec)
    if k is not None:
        return step == k
    if write and not spec.all:
        raise RunError(("pos",), "a generated-frame write names a step or all steps")
    return True


def step_taps(forward: Forward, step: int) -> tuple[tuple[str, Any], ...]:
    """The forward's taps issued at ``step`` as ``(kind, op)``, in the forward's own order."""
    return tuple((kind, op) for kind, op in tap_ops(forward)
                 if acts_at(op.pos, step, write=kind == "write"))


def names(pass_: Pass, forward: Forward) -> tuple[str, ...]:
    """The result names of a forward's generated ids: ``<model>.<input>.generated`` always,
    and ``<model>.generated`` when that model decodes one input in this pass."""
    inputs = {f.input for f in pass_.forwards if f.model == forward.model and f.decode}
    qualified = f"{forward.model}.{forward.input}.generated"
    return (f"{forward.model}.generated", qualified) if len(inputs) == 1 else (qualified,)


def eos_ids(model: StandardizedTransformer) -> tuple[int, ...]:
    """Every stop-token id the checkpoint declares (generation config, config, tokenizer)."""
    found: list[int] = []
    sources = (getattr(model._model, "generation_config", None), model._model.config,
               model.tokenizer)
    for source in sources:
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for token in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(token, int) and token not in found:
                found.append(token)
    return tuple(found)


def stack(steps: Sequence[torch.Tensor], where: tuple) -> torch.Tensor:
    """Per-step ``(rows, 1, width)`` values as one ``(rows, decode, width)`` tensor."""
    widths = {tuple(value.shape[2:]) for value in steps}
    if len(widths) != 1:
        raise RunError(where, "this component changes width from one decode step to the next "
                              "(its key axis grows), so its steps cannot be stacked; name a step")
    return torch.cat(list(steps), 1)


def cut(stacked: torch.Tensor, windows: Sequence[Sequence[int]], ragged: bool) -> torch.Tensor:
    """The kept steps of a ``(rows, decode, width)`` stack: ``(rows, w, width)`` when every
    row kept w steps and the read is not ragged, else flat ``(total, width)``."""
    rows = torch.tensor([i for i, window in enumerate(windows) for _ in window], dtype=torch.long,
                        device=stacked.device)
    steps = torch.tensor([s for window in windows for s in window], dtype=torch.long,
                         device=stacked.device)
    flat = stacked[rows, steps]
    counts = {len(window) for window in windows}
    if ragged or len(counts) != 1 or 0 in counts:
        return flat
    return flat.reshape(len(windows), counts.pop(), *flat.shape[1:])
