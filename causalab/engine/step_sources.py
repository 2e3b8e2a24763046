"""Featurizers loaded from an earlier step of the same point (``file_path: "steps:<step>/<value>"``).

A ``reduce: "pca"`` basis, a ``reduce: "sae"`` dictionary or a weights step's entry becomes a
live featurizer the moment its step has run, after the identity and shape checks a bundle
file gets (compile/bundles/checks.py), so harvest-then-apply is one document. Reads only the walk
state's published values; never opens a trace or a file.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.bundles import checks as bundle_checks
from causalab.compile.bundles.checks import document_stamp, step_source
from causalab.compile.plan import Observe
from causalab.engine.state import WalkState
from causalab.errors import CompileError, RunError
from causalab.files import TENSOR_KEY


def _stamp(node: Any, value: str, state: WalkState) -> dict[str, str]:
    """What the producing step stamps on ``value``, as its saved bundle would carry."""
    from causalab.engine.steps import output_stamp

    if isinstance(node, Observe):
        return output_stamp(node, value, state.published[value], state)
    return document_stamp(state.specs[value])


def _tensors(published: Any) -> dict:
    value = published.value
    return dict(value) if isinstance(value, dict) else {TENSOR_KEY: value}


def build_from_step(node: Any, state: WalkState) -> None:
    """Build every featurizer whose ``file_path`` names ``node``'s step from what it published."""
    from causalab.engine.featurizers import FEATURIZERS

    for name, spec in state.specs.items():
        source = step_source(spec.file_path)
        if source is None or source[0] != getattr(node, "name", None) or name in state.featurizers:
            continue
        at = ("featurizers", name, "file_path")
        if source[1] not in state.published:
            raise RunError(at, f"step {source[0]!r} published no {source[1]!r}")
        tensors = _tensors(state.published[source[1]])
        shapes = {key: tuple(tensor.shape) for key, tensor in tensors.items()}
        try:  # a published value is always stamped: the identity and shape checks apply
            bundle_checks.check_identity(_stamp(node, source[1], state), document_stamp(spec), at)
            bundle_checks.check_shapes(spec.kind, shapes, spec.d, spec.k, at)
        except CompileError as error:
            raise RunError(error.path, error.message) from None
        tensors = {key: tensor.detach().float().clone() for key, tensor in tensors.items()}
        cls = FEATURIZERS[spec.kind]
        featurizer = cls(**tensors) if spec.kind in ("sae", "linear") else cls(tensors[TENSOR_KEY])
        featurizer.to(tensors[next(iter(tensors))].device)
        for parameter in featurizer.parameters():
            parameter.requires_grad_(spec.trained_by is not None)
        state.featurizers[name] = featurizer
