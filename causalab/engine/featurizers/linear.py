"""The `linear` featurizer: an `sae` dictionary with the nonlinearity off.

f = (x − b_dec) W_enc + b_enc; decode, the error term and the exact round trip are the
sae ones. Never trainable; loaded only.
"""
from __future__ import annotations

from torch import Tensor

from causalab.engine.featurizers.sae import SAE


class Linear(SAE):
    """An affine dictionary: SAELens tensor names, no ReLU."""

    kind = "linear"

    @classmethod
    def from_bundle(cls, tensors: dict[str, Tensor], options: dict) -> "Linear":
        """The affine part of any SAELens dictionary: its W_enc, W_dec and biases."""
        names = ("W_enc", "W_dec", "b_enc", "b_dec")
        return cls(**{name: tensors[name] for name in names if name in tensors}, **options)

    def encode(self, x: Tensor) -> Tensor:
        return self.pre(x)
