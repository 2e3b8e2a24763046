"""The `subspace` featurizer: a trainable rank-k rotation (DAS), Cayley-parametrized.

Trains the free parameter W (d, k). The basis Q (d, k) is rebuilt from W on every access
through the Cayley map, so an optimizer step is seen at the next use and Q is orthonormal
for any W. A bundle stores both: W under ``weight`` (what loads back) and Q under
``basis``, the matrix other tools (a hook, pyvene's rotation) use as it is: x @ Q = f. The Cayley solve uses the Woodbury identity and never forms a
d×d matrix. Arithmetic runs in float32 with autocast off, on the activation's device.
Knows nothing of sites, bundles or fits.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from causalab.engine.featurizers.weighted import WeightedFeaturizer
from causalab.files import BASIS_KEY, TENSOR_KEY


def cayley_basis(weight: Tensor) -> Tensor:
    """Q = (I − A)⁻¹ (I + A) E for A = W Eᵀ − E Wᵀ, E = the first k columns of I_d.

    A has rank ≤ 2k: A = U Vᵀ with U = [W, −E], V = [E, W] (both d × 2k). Woodbury gives
    (I − U Vᵀ)⁻¹ = I + U (I₂ₖ − Vᵀ U)⁻¹ Vᵀ, so with B = (I + A) E,
    Q = B + U · solve(I₂ₖ − Vᵀ U, Vᵀ B): a 2k × 2k solve and O(d·k²) products.
    I₂ₖ − Vᵀ U is invertible because its determinant equals det(I − A) ≠ 0 (A is skew).

    >>> w = torch.randn(16, 3) / 4
    >>> q = cayley_basis(w)
    >>> bool(torch.allclose(q.T @ q, torch.eye(3), atol=1e-5))
    True
    """
    with torch.autocast(weight.device.type, enabled=False):
        w = weight.float()
        k = w.shape[1]
        eye = torch.eye(k, dtype=w.dtype, device=w.device)
        top = w[:k]  # Eᵀ W, (k, k)
        # B = (I + A) E = E + W − E (Eᵀ W)ᵀ: W plus, in the first k rows, I − topᵀ.
        basis_in = torch.cat([top + eye - top.T, w[k:]], dim=0)
        inner = torch.cat([
            torch.cat([eye - top, eye], dim=1),
            torch.cat([-(w.T @ w), eye + top.T], dim=1),
        ], dim=0)
        v_b = torch.cat([basis_in[:k], w.T @ basis_in], dim=0)  # Vᵀ B, (2k, k)
        coef = torch.linalg.solve(inner, v_b)  # (2k, k)
        # U · coef = W coef[:k] − E coef[k:]
        correction = w @ coef[:k]
        correction = torch.cat([correction[:k] - coef[k:], correction[k:]], dim=0)
        return basis_in + correction


def project(x: Tensor, basis: Tensor) -> Tensor:
    """f = Qᵀx per position: x (..., d) -> f (..., k), in float32 on x's device."""
    with torch.autocast(x.device.type, enabled=False):
        return x.float() @ basis.to(x.device)


def unproject(f: Tensor, x: Tensor, basis: Tensor) -> Tensor:
    """x′ = Q f′ + (x − Q Qᵀ x), computed as x + Q (f′ − Qᵀ x).

    The two are equal; the second changes x only inside span(Q), so f′ = Qᵀx returns x
    to the bit and the complement moves only by rounding of a zero-free product.
    x (..., d), f (..., k) -> (..., d) in x's dtype.
    """
    with torch.autocast(x.device.type, enabled=False):
        q = basis.to(x.device)
        x32 = x.float()
        delta = f.to(device=x.device, dtype=torch.float32) - x32 @ q
        return (x32 + delta @ q.T).to(x.dtype)


class Subspace(WeightedFeaturizer):
    """A rank-k rotation whose basis is the Cayley map of the trainable ``weight`` (d, k)."""

    kind = "subspace"

    @classmethod
    def draw(cls, d: int, k: int, seed: int) -> "Subspace":
        """A reproducible start: a normal (d, k) draw from ``seed``, scaled by 1/√d.

        Unscaled, A's singular values grow like √d and the Cayley map saturates near −I,
        where gradients no longer move it.
        """
        generator = torch.Generator().manual_seed(seed)
        weight = torch.randn(d, k, generator=generator, dtype=torch.float32) / math.sqrt(d)
        return cls(weight)

    @property
    def basis(self) -> Tensor:
        """Q (d, k), recomputed from ``weight`` on every access."""
        return cayley_basis(self.weight)

    def tensors(self) -> dict[str, Tensor]:
        """What a bundle stores: ``weight`` W and its orthonormal ``basis`` Q, both (d, k)."""
        return {TENSOR_KEY: self.weight.detach(), BASIS_KEY: cayley_basis(self.weight.detach())}

    def featurize(self, x: Tensor) -> tuple[Tensor, None]:
        """x (..., d) -> (Qᵀx (..., k), None): nothing is lost that inverse needs besides x."""
        return project(x, self.basis), None

    def inverse(self, f: Tensor, err: None, x: Tensor) -> Tensor:
        """(f′ (..., k), err, x (..., d)) -> Q f′ + (x − Q Qᵀ x) (..., d)."""
        return unproject(f, x, self.basis)


def export_basis(bundle: str, out: str, named: str | None = None) -> str:
    """Write a subspace bundle's basis Q alone: safetensors ``{"basis": (d, k)}``, x @ Q = f.

    Q is the bundle's own ``basis`` when it has one, else the Cayley map of its ``weight``
    (bundles written before the basis was stored). The stamp is kept as metadata. This is
    the matrix a hook (x + Q (f′ − Qᵀx)) or pyvene's low-rank rotation takes as it is.
    ``named``: what a refusal calls the bundle (a download's URI), else its path.
    """
    from safetensors import safe_open

    from causalab.engine import record
    from causalab.errors import UsageError

    with safe_open(bundle, framework="pt", device="cpu") as handle:
        metadata = dict(handle.metadata() or {})
        names = set(handle.keys())
        if TENSOR_KEY not in names or not names <= {TENSOR_KEY, BASIS_KEY} or \
                metadata.get("kind", "subspace") != "subspace":
            raise UsageError(("--basis",), f"{named or bundle} is not a subspace bundle "
                                           f"(holds {', '.join(sorted(names))})")
        basis = handle.get_tensor(BASIS_KEY) if BASIS_KEY in names else \
            cayley_basis(handle.get_tensor(TENSOR_KEY).float().clone())
    plain = {BASIS_KEY: basis.float().contiguous()}
    return record.write_safetensors(out, plain, metadata)
