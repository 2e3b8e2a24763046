"""The `sae` featurizer: a sparse-autoencoder dictionary, with the error term carried.

Tensor names and orientations are SAELens's: ``W_enc`` (d, d_sae), ``W_dec`` (d_sae, d),
``b_enc`` (d_sae,), ``b_dec`` (d,). A missing ``W_dec`` means tied weights (``W_encᵀ``);
missing biases are zeros. Never trainable. Loaded only; knows nothing of bundle files.
"""
from __future__ import annotations

import torch
from torch import Tensor


class SAE:
    """f = ReLU((x − b_dec) W_enc + b_enc); decode(f) = f W_dec + b_dec; err = x − decode(f).

    ``inverse(f′, err, x)`` is decode(f′) + err, evaluated as x + (f′ − f) W_dec with f
    re-encoded from x. The two are equal in exact arithmetic (the biases cancel), but only
    the second returns x to the bit when f′ = f: (x − r) + r need not round back to x,
    while x + 0 always does. ``err`` is still returned for callers that inspect it.
    """

    kind = "sae"
    _relu = True

    def __init__(self, W_enc: Tensor, W_dec: Tensor | None = None, b_enc: Tensor | None = None,
                 b_dec: Tensor | None = None, apply_b_dec_to_input: bool = True):
        d, k = W_enc.shape
        self.W_enc = W_enc.detach().float()
        self.W_dec = None if W_dec is None else W_dec.detach().float()
        self.b_enc = torch.zeros(k) if b_enc is None else b_enc.detach().float()
        self.b_dec = torch.zeros(d) if b_dec is None else b_dec.detach().float()
        self.apply_b_dec_to_input = apply_b_dec_to_input
        self.training = False

    @property
    def decoder(self) -> Tensor:
        """W_dec (d_sae, d), or W_encᵀ when tied."""
        return self.W_enc.T if self.W_dec is None else self.W_dec

    def encode(self, x: Tensor) -> Tensor:
        """x (..., d) float32 -> f (..., d_sae)."""
        centred = x - self.b_dec.to(x.device) if self.apply_b_dec_to_input else x
        pre = centred @ self.W_enc.to(x.device) + self.b_enc.to(x.device)
        return torch.relu(pre) if self._relu else pre

    def decode(self, f: Tensor) -> Tensor:
        """f (..., d_sae) -> (..., d)."""
        return f @ self.decoder.to(f.device) + self.b_dec.to(f.device)

    def featurize(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (..., d) -> (f (..., d_sae), err = x − decode(f) (..., d)), float32."""
        with torch.autocast(x.device.type, enabled=False):
            x32 = x.float()
            f = self.encode(x32)
            return f, x32 - self.decode(f)

    def inverse(self, f: Tensor, err: Tensor, x: Tensor) -> Tensor:
        """(f′ (..., d_sae), err, x (..., d)) -> decode(f′) + err (..., d) in x's dtype."""
        with torch.autocast(x.device.type, enabled=False):
            x32 = x.float()
            delta = f.to(device=x.device, dtype=torch.float32) - self.encode(x32)
            return (x32 + delta @ self.decoder.to(x.device)).to(x.dtype)

    def parameters(self) -> list[Tensor]:
        return []

    def tensors(self) -> dict[str, Tensor]:
        out = {"W_enc": self.W_enc, "b_enc": self.b_enc, "b_dec": self.b_dec}
        if self.W_dec is not None:
            out["W_dec"] = self.W_dec
        return out

    def to(self, device):
        for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device))
        return self
