"""The `pca` featurizer: a stored orthonormal basis, the untrained twin of `subspace`.

``weight`` (d, k) IS the basis Q (what ``reduce: "pca"`` writes); featurize and inverse are
the subspace ones. Never trainable: ``parameters()`` is empty. Always loaded from a bundle.
"""
from __future__ import annotations

from torch import Tensor

from causalab.engine.featurizers.subspace import project, unproject


class PCA:
    """Projection onto a stored orthonormal basis ``weight`` (d, k)."""

    kind = "pca"

    def __init__(self, weight: Tensor):
        self.weight = weight.detach()
        self.training = False

    @property
    def basis(self) -> Tensor:
        return self.weight

    def featurize(self, x: Tensor) -> tuple[Tensor, None]:
        """x (..., d) -> (Qᵀx (..., k), None)."""
        return project(x, self.weight), None

    def inverse(self, f: Tensor, err: None, x: Tensor) -> Tensor:
        """(f′ (..., k), err, x (..., d)) -> Q f′ + (x − Q Qᵀ x) (..., d)."""
        return unproject(f, x, self.weight)

    def parameters(self) -> list[Tensor]:
        return []

    def tensors(self) -> dict[str, Tensor]:
        return {"weight": self.weight}

    def to(self, device) -> "PCA":
        self.weight = self.weight.to(device)
        return self
