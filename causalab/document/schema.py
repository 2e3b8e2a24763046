"""The document format as strict, closed pydantic models (docs/format.md §2–§9).

A ``Document`` is one point: sweeps are lowered before it is built (``sweep.py``). The
models check what one node can say about itself; names that refer to other nodes are
checked by ``references.py``, and anything needing a config, tokenizer or rows by
``causalab.compile``. Pydantic's errors become ``DocumentError`` at one boundary
(``check.py``). Imports pydantic and the vocabulary tables only.
"""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator

from causalab.document.interventions import (METRIC_MODELS, Intervention, InterventionModel,
                                             Metric, Operand, Read, Ref, Write)
from causalab.document.names import is_uri, runs_uri_parts, shell_form
from causalab.document.nodes import Name, Node, Number, refuse
from causalab.document.positions import Pos, Position, Scope, as_position
from causalab.document.steps import (Anneal, Attribute, EarlyStop, Eval, Fit, Observe, Optimizer,
                                     Output, Save, Step, VerifyBound, Weights,
                                     step_interventions)
from causalab.document.vocab import (ATTN_IMPLEMENTATIONS, COMPONENTS, DTYPES,
                                     FEATURIZER_KINDS, FEATURIZERS_NODE, MODEL_CONTROLS,
                                     PARAMETRIZATIONS,
                                     SAE_ARCHITECTURES, SAELENS_DEFAULTS,
                                     declarable_featurizer_kinds)

__all__ = [
    "Anneal", "Attribute", "Document", "EarlyStop", "Eval", "Featurizer", "Fit", "Header", "Intervention",
    "InterventionModel", "METRIC_MODELS", "Metric", "ModelSpec", "Number", "Observe",
    "Operand", "Optimizer", "Output", "Pos", "Position", "Read", "Ref", "Role", "Save",
    "Scope", "Site", "Step", "VerifyBound", "Weights", "Write", "as_position", "step_interventions",
]

Indices = Annotated[list[StrictInt], Field(strict=True)]


class Header(Node):
    """Authoring metadata; excluded from the digest."""

    description: StrictStr = ""


class ModelSpec(Node):
    """The checkpoint: a hub id, local directory or built-in key, pinned by revision."""

    key: Annotated[StrictStr, Field(min_length=1)]
    revision: Annotated[StrictStr, Field(min_length=1)]  # "" would pin nothing
    dtype: Literal[tuple(DTYPES)]
    attn_implementation: Literal[ATTN_IMPLEMENTATIONS] | None = None
    # A control a reviewer asks for: the same architecture with its weights re-initialised
    # (transformers' own initialisation, seeded 0) in place of the checkpoint's.
    control: Literal[tuple(MODEL_CONTROLS)] | None = None


# A role's field: keys joined by ".", each followed by any number of "[index]".
FIELD_PATH = re.compile(r"[^\[\].]+(\[\d+\])*(\.[^\[\].]+(\[\d+\])*)*")


class Role(Node):
    """Where a prompt role's text sits in a row: ``input``, ``a[0]``, ``a.b``; with
    ``generation_prompt``, its chat rows end where the assistant's answer starts (the
    template's generation prompt), so ``pos: -1`` is the token before the answer's first."""

    field: StrictStr
    generation_prompt: StrictBool = False

    @model_validator(mode="after")
    def _field_path(self) -> "Role":
        if not FIELD_PATH.fullmatch(self.field):
            raise refuse(f"{self.field!r} is not a field path: keys joined by '.', each with "
                         "optional [index] parts, e.g. counterfactual_inputs[0] or a.b", "field")
        return self


class Site(Node):
    """A named place in the model: a component, one layer, and a heads or units slice."""

    component: StrictStr
    layers: Indices | None = None
    heads: Indices | None = None
    units: Indices | None = None

    @model_validator(mode="after")
    def _selection(self) -> "Site":
        row = COMPONENTS.get(self.component)
        if self.layers is not None and len(self.layers) != 1:
            raise refuse(f"layers takes exactly one layer, got {len(self.layers)}; sweep "
                         "the element to visit several", "layers")
        if row is not None and row["whole_model"] and self.layers is not None:
            raise refuse(f"{self.component} is whole-model and takes no layers", "layers")
        if row is not None and not row["whole_model"] and self.layers is None:
            raise refuse(f"{self.component} is per-layer: give layers: [l]", "layers")
        if self.heads is not None and self.units is not None:
            raise refuse("heads and units slice the same axis: give one", "units")
        for name in ("heads", "units"):
            _check_selection(self, name, row)
        return self


def _check_selection(site: Site, name: str, row: dict | None) -> None:
    chosen = getattr(site, name)
    if chosen is None:
        return
    if not chosen:
        raise refuse(f"{name} must be non-empty (omit it to take the whole width)", name)
    if len(set(chosen)) != len(chosen):
        raise refuse(f"{name} must be distinct, got {chosen}", name)
    if name == "heads" and (row is None or not row["per_head"]):
        per_head = [c for c, r in COMPONENTS.items() if r["per_head"]]
        raise refuse(f"{site.component} has no heads; heads go on {', '.join(per_head)}", name)
    if name == "units" and row is not None and row["width"] is None:
        raise refuse(f"{site.component} has no feature width to take units of", name)


class SaelensConfig(Node):
    """The cfg.json fields of a SAELens weights file that came without one (docs/format.md §8.2)."""

    architecture: Literal[tuple(SAE_ARCHITECTURES)]
    apply_b_dec_to_input: StrictBool
    normalize_activations: Literal["none"]
    k: Annotated[StrictInt, Field(gt=0)] | None = None
    rescale_acts_by_decoder_norm: StrictBool = SAELENS_DEFAULTS["rescale_acts_by_decoder_norm"]
    hook_name: StrictStr | None = None

    @model_validator(mode="after")
    def _topk_has_k(self) -> "SaelensConfig":
        if (self.architecture == "topk") != (self.k is not None):
            raise refuse("k (the active-latent count) is given exactly when architecture is topk", "k")
        return self


class Featurizer(Node):
    """A named parameter set a write acts in (docs/format.md §8.1); ``d`` is never authored."""

    kind: Literal[declarable_featurizer_kinds()]
    k: Annotated[StrictInt, Field(gt=0)] | None = None
    parametrization: Literal[PARAMETRIZATIONS] = "cayley"
    seed: StrictInt | None = None
    file_path: StrictStr | None = None
    trust_unstamped: StrictBool = False
    saelens: SaelensConfig | None = None
    # The bundle was fitted on this control of the model (its stamp says so), and that is
    # wanted: without it, a twin's bundle is refused where the document's own model is meant.
    control: Literal[tuple(MODEL_CONTROLS)] | None = None

    @model_validator(mode="after")
    def _field_combination(self) -> "Featurizer":
        row = FEATURIZER_KINDS[self.kind]
        if self.control is not None and self.file_path is None:
            raise refuse("control says what a loaded bundle was fitted on: give file_path",
                         "control")
        if self.saelens is not None and self.kind not in ("sae", "linear"):
            raise refuse(f"{self.kind} takes no saelens block", "saelens")
        if row["k"] == "required" and self.k is None:
            raise refuse(f"{self.kind} needs k")
        if row["k"] == "forbidden" and self.k is not None:
            raise refuse(f"{self.kind} takes no k")
        if row["file_path"] == "required" and self.file_path is None:
            raise refuse(f"{self.kind} is always loaded: give file_path")
        if self.seed is not None and not row["seedable"]:
            raise refuse(f"{self.kind} takes no seed")
        if self.seed is not None and self.file_path is not None:
            raise refuse("a loaded featurizer takes no seed")
        shell = None if self.file_path is None else shell_form(self.file_path)
        if shell is not None:
            raise refuse(f"{self.file_path!r} {shell}: nothing expands it, so it would be read "
                         "as written; give the path itself", "file_path")
        if self.file_path is not None and is_uri(self.file_path):
            try:
                runs_uri_parts(self.file_path)
            except ValueError as error:
                raise refuse(str(error), "file_path") from None
        return self

    @property
    def loaded(self) -> bool:
        return self.file_path is not None


class Document(Node):
    """One point of the plan-shaped format: the whole experiment, nothing about the run."""

    header: Header = Header()
    model: ModelSpec
    roles: dict[Name, Role]
    sites: dict[Name, Site]
    featurizers: dict[Name, Featurizer] = {}
    interventions: dict[Name, Intervention] = {}
    steps: Annotated[dict[Name, Step], Field(min_length=1)]

    @model_validator(mode="after")
    def _reserved_step(self) -> "Document":
        # Every name is one safe path segment already (``Name``): step and intervention names
        # become directories under --out, a list step's entries too.
        if FEATURIZERS_NODE in self.steps:
            raise refuse(f'"{FEATURIZERS_NODE}" is the compiler\'s node ahead of the steps; '
                         "rename this step", "steps", FEATURIZERS_NODE)
        return self
