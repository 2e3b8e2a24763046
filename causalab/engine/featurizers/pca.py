"""The `pca` featurizer: a stored orthonormal basis, the untrained twin of `subspace`.

``weight`` (d, k) IS the basis Q (what ``reduce: "pca"`` writes); featurize and inverse are
the subspace ones. Never trainable: ``parameters()`` is empty. Always loaded from a bundle.
"""
from __future__ import annotations

from torch import Tensor

from causalab.engine.featurizers.subspace import project, unproject
from causalab.engine.featurizers.weighted import WeightedFeaturizer


class PCA(WeightedFeaturizer):
    """Projection onto a stored orthonormal basis ``weight`` (d, k)."""

    kind = "pca"
    trainable = False

    @property
    def basis(self) -> Tensor:
        return self.weight

    def featurize(self, x: Tensor) -> tuple[Tensor, None]:
        """x (..., d) -> (Qᵀx (..., k), None)."""
        return project(x, self.weight), None

    def inverse(self, f: Tensor, err: None, x: Tensor) -> Tensor:
        """(f′ (..., k), err, x (..., d)) -> Q f′ + (x − Q Qᵀ x) (..., d)."""
        return unproject(f, x, self.weight)
