"""The state shared by featurizers whose whole parameter set is one ``weight`` tensor.

``subspace`` (W, trainable), ``gate`` (θ, trainable) and ``pca`` (Q, never trained) keep one
tensor under the bundle key ``weight``; moving it, exporting it and listing it for the
optimizer are the same for all three. The maths of each kind stays in its own module.
"""
from __future__ import annotations

from torch import Tensor


class WeightedFeaturizer:
    """One ``weight`` tensor, a ``training`` flag, and the bookkeeping around them."""

    trainable = True

    def __init__(self, weight: Tensor):
        # A fixed weight is kept row-major: a basis harvested in this run (often a transposed
        # view) and the same one read back from its file then multiply alike on every BLAS.
        self.weight = weight if self.trainable else weight.detach().contiguous()
        self.training = False

    def parameters(self) -> list[Tensor]:
        """What a fit's optimizer steps: the weight, unless this kind is never trained."""
        return [self.weight] if self.trainable else []

    def tensors(self) -> dict[str, Tensor]:
        """What a bundle stores."""
        return {"weight": self.weight.detach()}

    def to(self, device) -> "WeightedFeaturizer":
        """Move the weight, keeping whether it takes gradients."""
        grad = self.weight.requires_grad
        self.weight = self.weight.detach().to(device).requires_grad_(grad)
        return self
