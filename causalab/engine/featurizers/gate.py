"""The `gate` featurizer: a learned mask over the site's units (the DBM featurizer).

``weight`` θ (d,) starts at 0. While ``training`` (set by the fit loop around updates) the
mask is soft, σ(θ / T); otherwise it is hard, θ > 0, so an unfitted or loaded gate writes
nothing until a fit turns units on. ``T`` is 1 unless a fit anneals it. Features are the
activation itself. Knows nothing of objectives or schedules.
"""
from __future__ import annotations

import torch
from torch import Tensor

from causalab.engine.featurizers.weighted import WeightedFeaturizer


class Gate(WeightedFeaturizer):
    """inverse(f′, err, x) = m ⊙ f′ + (1 − m) ⊙ x over the last axis (d units)."""

    kind = "gate"

    def __init__(self, weight: Tensor):
        super().__init__(weight)
        self.T = 1.0

    @classmethod
    def start(cls, d: int) -> "Gate":
        """θ = 0: the soft mask starts at ½ per unit, the hard mask all off."""
        return cls(torch.zeros(d, dtype=torch.float32))

    def soft_mask(self) -> Tensor:
        """σ(θ / T), (d,), differentiable in θ."""
        return torch.sigmoid(self.weight.float() / self.T)

    def hard_mask(self) -> Tensor:
        """θ > 0, (d,) bool."""
        return self.weight > 0

    def featurize(self, x: Tensor) -> tuple[Tensor, None]:
        """x (..., d) -> (x in float32, None)."""
        return x.float(), None

    def inverse(self, f: Tensor, err: None, x: Tensor) -> Tensor:
        """(f′ (..., d), err, x (..., d)) -> the masked blend (..., d) in x's dtype.

        The hard mask selects with ``where`` rather than multiplying, so an all-on gate is
        patching and an all-off gate is no write, each to the bit (and NaN-safe).
        """
        with torch.autocast(x.device.type, enabled=False):
            x32 = x.float()
            f32 = f.to(device=x.device, dtype=torch.float32)
            if self.training:
                m = self.soft_mask().to(x.device)
                out = m * f32 + (1 - m) * x32
            else:
                out = torch.where(self.hard_mask().to(x.device), f32, x32)
            return out.to(x.dtype)

    def mask_mean(self) -> Tensor:
        """Mean of the soft mask: the ``<gate>.mask`` objective term (L1 pressure)."""
        return self.soft_mask().mean()

    def kept(self) -> float:
        """Fraction of units the hard mask keeps."""
        return float(self.hard_mask().float().mean())
