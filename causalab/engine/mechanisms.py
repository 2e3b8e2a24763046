"""Mechanisms: what a write does to the feature value, one function per name in one table.

Each is ``fn(f, operand, *, f0, **params) -> f'`` on tensors whose last axis is the feature
axis (``(rows, w, k)`` or ``(total, k)``). They know nothing of sites, featurizers or
positions; the seam hands them the value already featurized and restricted to ``features``,
and an operand already on f's device. Parameter names are checked by the document room;
here a wrong name is a ``TypeError``.
"""
from __future__ import annotations

from typing import TypeAlias

from causalab.lazy import torch



# A write's operand: a read or a featurizer's value (a tensor), or a literal number.
Operand: TypeAlias = "torch.Tensor | float | None"

def _like(operand: Operand, f: torch.Tensor) -> torch.Tensor:
    """The operand as a tensor of f's shape: a number is broadcast, a tensor expanded."""
    if isinstance(operand, (int, float)):
        return f.new_full(f.shape, float(operand))
    return torch.broadcast_to(operand.to(device=f.device, dtype=f.dtype), f.shape)


def swap(f: torch.Tensor, operand: Operand, *, f0: torch.Tensor | None = None) -> torch.Tensor:
    """``operand`` in place of f.

    >>> swap(torch.ones(2, 3), 0.0).tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """
    return _like(operand, f)


def add_scaled(f: torch.Tensor, operand: Operand, *, f0: torch.Tensor | None = None,
               scale: float = 1.0) -> torch.Tensor:
    """``f + scale · operand``."""
    return f + scale * _like(operand, f)


def lerp(f: torch.Tensor, operand: Operand, *, f0: torch.Tensor | None = None,
         t: float) -> torch.Tensor:
    """``(1 − t) · f + t · operand``: ``t = 1`` is a swap and ``t = 0`` leaves f as it was."""
    return (1.0 - t) * f + t * _like(operand, f)


def gaussian(f: torch.Tensor, operand: Operand = None, *, f0: torch.Tensor | None = None,
             seed: float, scale: float = 1.0) -> torch.Tensor:
    """``f + scale · ε`` with ε ~ N(0, 1) of f's shape, drawn on a CPU generator from ``seed``
    and then moved, so one seed is one noise tensor on every device."""
    generator = torch.Generator("cpu").manual_seed(int(seed))
    noise = torch.randn(f.shape, generator=generator).to(f.device, f.dtype)
    return f + scale * noise


def clamp(f: torch.Tensor, operand: Operand = None, *, f0: torch.Tensor | None = None,
          lo: float | None = None, hi: float | None = None) -> torch.Tensor:
    """``min(max(f, lo), hi)``; an omitted bound is open."""
    if lo is not None and hi is not None and lo == hi:
        # A closed interval is a constant; filling keeps it bit-identical to swapping it in
        # (max(−0.0, 0.0) may keep the sign bit, and NaN would survive a comparison).
        return f.new_full(f.shape, float(lo))
    return torch.clamp(f, min=lo, max=hi)


def renormalize(f: torch.Tensor, operand: Operand = None, *, f0: torch.Tensor | None = None
                ) -> torch.Tensor:
    """``f · ‖f0‖ / ‖f‖``, norms over the feature axis per position; f0 is the value before
    any write of this forward. A zero f stays zero."""
    if f0 is None:
        raise TypeError("renormalize needs f0, the pre-write feature value")
    target = torch.linalg.vector_norm(f0.to(f.dtype), dim=-1, keepdim=True)
    current = torch.linalg.vector_norm(f, dim=-1, keepdim=True)
    # Dividing a zero vector by 1 keeps it zero without an inf in either direction of autograd.
    safe = torch.where(current > 0, current, torch.ones_like(current))
    return f * (target / safe)


MECHANISMS = {
    "swap": swap,
    "add_scaled": add_scaled,
    "lerp": lerp,
    "gaussian": gaussian,
    "clamp": clamp,
    "renormalize": renormalize,
}

# Mechanisms that measure against the pre-write value f0; only for these does the seam
# featurize the untouched activation a second time.
NEEDS_F0 = frozenset({"renormalize"})
