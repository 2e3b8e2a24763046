"""A fit's forward at the last position alone (docs/platform.md §7): one position over kept keys.

A forward whose every tap sits at the prompt's last column changes nothing at an earlier
position (attention is causal), so the keys and values an un-intervened forward leaves for
columns ``0 … T−2`` are the ones the intervened forward computes there. A fit's update and
its eval then run the last column alone: the blocks before their entry served from the kept
prefix's last column, the rest one position over the kept keys and values, forward and
backward. The numbers are the whole forward's up to float rounding (one position sums in
another order), which is why only fits and ``verify``'s exact checks take this path (the
latter every unit stacked in one trace, ``planner._last_columns``): a patching table stays
byte-identical to the unresumed forward. This module says from plan data where that may
happen and keeps the tensors; the planner decides, the walk runs the traces.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

from causalab.compile.plan import Forward
from causalab.engine.forwards import tap_ops
from causalab.engine.resume import map_tensors
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from nnterp import StandardizedTransformer
    from transformers import DynamicCache

    from causalab.engine.cache import Kept
    from causalab.engine.seam import Window


def at_last_column(forward: Forward) -> bool:
    """Whether an intervened prompt forward taps only the prompt's last token, at places
    with one value per position (no attention interior, no per-key axis)."""
    if forward.decode or not forward.writes:
        return False
    for _, op in tap_ops(forward):
        pos, address = op.pos, op.address
        if (pos.frame != "prompt" or pos.dynamic or pos.index != -1 or pos.span is not None
                or pos.last is not None or pos.all or address.seq_axis != 1 or address.key_axis):
            return False
    return True


class Keys(NamedTuple):
    """Per layer, the un-intervened keys and values of columns ``0 … T−2`` over every row of
    a prompt batch, ``(rows, kv heads, T−1, head dim)``."""

    layers: list

    def cache(self, chunk: tuple, model: StandardizedTransformer,
              copies: int = 1) -> DynamicCache:
        """A fresh KV cache holding the rows ``chunk``, stacked ``copies`` times as a fused
        trace stacks its points (the trace appends the last column)."""
        index = torch.tensor(tuple(chunk) * copies, dtype=torch.long)
        cache = kv_cache(model)
        for layer, (keys, values) in enumerate(self.layers):
            where = index.to(keys.device)
            cache.update(keys.index_select(0, where), values.index_select(0, where), layer)
        return cache

    @classmethod
    def joined(cls, caches: list) -> "Keys | None":
        """The layers of each window's filled cache, windows concatenated along rows; None
        when a layer kept no keys (a cache of another kind: such a model runs whole)."""
        layers = []
        for parts in zip(*(cache.layers for cache in caches)):
            if any(getattr(part, "keys", None) is None for part in parts):
                return None
            layers.append((torch.cat([p.keys for p in parts], 0),
                           torch.cat([p.values for p in parts], 0)))
        return cls(layers)


def all_last(positions, width: int) -> bool:
    """Whether every position of ``positions`` (any iterable of ints) is the last of
    ``width`` columns (true of none at all)."""
    return all(position == width - 1 for position in positions)


def moved(window: Window) -> Window:
    """A tap's window moved onto a trace of the last column alone (its column 0)."""
    return dataclasses.replace(window, positions=torch.zeros_like(window.positions))


def last_of(value: Kept) -> Kept:
    """A kept module output cut to its last column."""
    return map_tensors(value, lambda tensor: tensor[:, -1:])


def kv_cache(model: StandardizedTransformer) -> DynamicCache:
    """An empty KV cache laid out for the loaded model's layers (sliding ones included)."""
    from transformers import DynamicCache

    return DynamicCache(config=model._model.config)
