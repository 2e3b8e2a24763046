"""Featurizer kinds, one module each, and the one table that maps a kind to its class.

Every featurizer has ``kind``, ``training`` (a plain bool, False unless a fit sets it),
``featurize(x) -> (f, err)``, ``inverse(f′, err, x) -> x′`` (last axis is the feature axis:
x (..., d), f (..., k)), ``parameters()`` (trainable tensors), ``tensors()`` (what a bundle
stores) and ``to(device)``. Featurizer arithmetic runs in float32 with autocast off, on the
activation's device. This package builds featurizers from plan specs; it never opens a
trace and never decides when a featurizer trains.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from causalab.engine.bundle_files import Resolver, load_bundle
from causalab.engine.featurizers.gate import Gate
from causalab.engine.featurizers.identity import Identity
from causalab.engine.featurizers.linear import Linear
from causalab.engine.featurizers.pca import PCA
from causalab.engine.featurizers.sae import SAE, write_saelens_dir
from causalab.engine.featurizers.subspace import Subspace, cayley_basis

if TYPE_CHECKING:  # the plan types only annotate; importing them pulls in the compiler
    from causalab.compile.plan import FeaturizerSpec

FEATURIZERS = {
    "identity": Identity,
    "subspace": Subspace,
    "pca": PCA,
    "gate": Gate,
    "sae": SAE,
    "linear": Linear,
}

__all__ = ["FEATURIZERS", "build_featurizer", "cayley_basis", "write_saelens_dir",
           "Identity", "Subspace", "PCA", "Gate", "SAE", "Linear"]


def _from_bundle(spec: FeaturizerSpec, resolver: Resolver | None):
    tensors, options = load_bundle(spec, resolver=resolver)
    cls = FEATURIZERS[spec.kind]
    if spec.kind in ("sae", "linear"):
        return cls.from_bundle(tensors, options)
    return cls(tensors["weight"].float())


def _fresh(spec: FeaturizerSpec):
    if spec.kind == "subspace":
        return Subspace.draw(spec.d, spec.k, spec.seed)
    if spec.kind == "gate":
        return Gate.start(spec.d)
    if spec.kind == "identity":
        return Identity()
    raise ValueError(f"featurizer kind {spec.kind!r} is always loaded from a bundle")


def build_featurizer(spec: FeaturizerSpec, device, dtype: torch.dtype = torch.float32, *,
                     resolver: Resolver | None = None):
    """The live featurizer for ``spec`` on ``device``: loaded from ``spec.file_path`` (stamp
    checked, CompileError at ``featurizers.<name>.file_path``) or drawn fresh from
    ``spec.seed``. Parameters of a featurizer some fit trains are leaf tensors with
    ``requires_grad``; ``resolver`` maps a tracking URI in ``file_path`` to a local path.
    """
    featurizer = _from_bundle(spec, resolver) if spec.file_path else _fresh(spec)
    for name, value in vars(featurizer).items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            setattr(featurizer, name, value.to(dtype))
    featurizer.to(device)
    for parameter in featurizer.parameters():
        parameter.requires_grad_(spec.trained_by is not None)
    return featurizer
