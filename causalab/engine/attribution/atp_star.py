"""AtP*'s two corrections to attribution patching (Kramár et al. 2024, section 3.1).

**QK fix.** A patched query or key moves its head's attention pattern through a softmax,
which a gradient linearises badly where the pattern saturates. Instead the pattern is
recomputed exactly, ``A' = softmax(s + Δs)`` with ``Δs = scaling · Δq·kᵀ`` (a patched query)
or ``scaling · q·Δkᵀ`` (a patched key), ``s`` the base scores as the softmax receives them
(mask included), and the estimate is linear only from the pattern on:
``Σ (A' − A) · ∂metric/∂A``. The pattern feeds the head's output linearly (``z = A·V``), so
this is the linearisation from the attention output onwards.

**GradDrop.** Cancellation between paths can hide a unit's effect from the summed gradient.
For each layer ``l`` a backward pass runs with the gradient through layer ``l``'s attention
and MLP outputs zeroed (``gate``), giving ``ĉ_l(u)``; the paper's combination, kept as the
table's ``graddrop``, is ``(1/(L−1)) Σ_l |ĉ_l(u)|`` per row.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from causalab.compile.plan import Attribute
from causalab.engine.trace_jobs import JobTap, SiteOp
from causalab.engine.seam import Window
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from nnterp import StandardizedTransformer

QUERY = "attention_query"


def taps(node: Attribute) -> list[JobTap]:
    """The corrections' taps on a base forward: the QK fix's partner and scores read whole
    and its pattern shifted (its gradient taken); GradDrop's gates."""
    kinds = (("partners", "read", "partner"), ("scores", "read", "scores"),
             ("patterns", "shift", "pattern"), ("gates", "gate", "gate"))
    return [JobTap(kind, SiteOp(node.name, address, i, role=role), whole=True)
            for field, kind, role in kinds for i, address in enumerate(getattr(node, field))]


def gate(value: torch.Tensor, dropped: list, layer: int) -> torch.Tensor:
    """Identity forward; backward zeroes the gradient when ``dropped[0]`` is ``layer``."""
    return _gate().apply(value, dropped, layer)


@functools.lru_cache(maxsize=1)
def _gate() -> type:
    """The autograd function of :func:`gate`, made at its first use (its base class is
    torch's, which the engine imports only when it runs)."""

    class Gate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value: torch.Tensor, dropped: list, layer: int) -> torch.Tensor:
            ctx.dropped, ctx.layer = dropped, layer
            return value.view_as(value)

        @staticmethod
        def backward(ctx, grad: torch.Tensor):
            keep = ctx.dropped[0] != ctx.layer
            return (grad if keep else torch.zeros_like(grad)), None, None

    return Gate


def combined(per_layer: torch.Tensor) -> torch.Tensor:
    """``(L, rows, units)`` GradDrop estimates as AtP* combines them: ``Σ_l |ĉ_l| / (L−1)``."""
    layers = per_layer.shape[0]
    return per_layer.abs().sum(0) / max(layers - 1, 1)


def scaling(model: StandardizedTransformer, layer: int) -> float:
    """The attention's score scale at ``layer``, as the module applies it."""
    return float(model.attentions[layer]._module.scaling)


def _placed(cf: torch.Tensor, base: torch.Tensor, at_cf: Window,
            at_base: Window) -> torch.Tensor:
    """``(B, H, S, d)`` zero but at the window's positions: the counterfactual minus the base."""
    delta = torch.zeros_like(base)
    cf_rows, base_rows = at_cf.batch_rows.to(cf.device), at_base.batch_rows.to(cf.device)
    moved = cf[cf_rows, :, at_cf.positions.to(cf.device)] - base[
        base_rows, :, at_base.positions.to(cf.device)]
    delta[base_rows, :, at_base.positions.to(cf.device)] = moved
    return delta


def _repeat(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """Key-value heads repeated to the query heads they serve (grouped-query attention)."""
    return kv.repeat_interleave(heads // kv.shape[1], dim=1)


def qk_effects(component: str, tensors: dict, at_cf: Window, at_base: Window,
               scale: float) -> torch.Tensor:
    """``(rows, units)``: per head the QK-fixed estimate of patching its query (or key) at
    the window. ``tensors``: the site whole on both runs (``cf``, ``base``), the partner,
    the scores, and the metric's gradient at the pattern (``grad``), all ``(B, H, …)``."""
    cf, base = tensors["cf"].double(), tensors["base"].double()
    partner, scores = tensors["partner"].double(), tensors["scores"].double()
    heads = scores.shape[1]
    delta = _placed(cf, base, at_cf, at_base)
    if component == QUERY:
        shift = torch.einsum("bhqd,bhkd->bhqk", delta, _repeat(partner, heads))
    else:
        shift = torch.einsum("bhqd,bhkd->bhqk", partner, _repeat(delta, heads))
    moved = (scores + scale * shift).softmax(-1) - scores.softmax(-1)
    per_head = (moved * tensors["grad"].double()).sum((-1, -2))
    groups = heads // base.shape[1]
    return per_head.reshape(per_head.shape[0], base.shape[1], groups).sum(-1)
