"""The `identity` featurizer: features are the activation; a write through it is patching.

Implicit and never declared; holds no tensors and trains nothing.
"""
from __future__ import annotations

from torch import Tensor


class Identity:
    """featurize(x) = (x, None); inverse(f′, err, x) = f′."""

    kind = "identity"

    def __init__(self):
        self.training = False

    def featurize(self, x: Tensor) -> tuple[Tensor, None]:
        return x, None

    def inverse(self, f: Tensor, err: None, x: Tensor) -> Tensor:
        return f

    def parameters(self) -> list[Tensor]:
        return []

    def tensors(self) -> dict[str, Tensor]:
        return {}

    def to(self, device) -> "Identity":
        return self
