"""The `linear` featurizer: an `sae` dictionary with the nonlinearity off.

f = (x − b_dec) W_enc + b_enc; decode, the error term and the exact round trip are the
sae ones. Never trainable; loaded only.
"""
from __future__ import annotations

from causalab.engine.featurizers.sae import SAE


class Linear(SAE):
    """An affine dictionary: SAELens tensor names, no ReLU."""

    kind = "linear"
    _relu = False
