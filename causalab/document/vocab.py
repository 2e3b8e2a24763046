"""The closed vocabularies of the document format: every table, once, as a dict literal.

The schema builds its ``Literal``s from these keys, the reference rules read them, the
engine's tables are tested against them and ``causalab vocab`` prints them. Nothing here
knows a checkpoint: widths are the *names* of config facts (``hidden_size``), resolved by
the compiler. No torch, no pydantic, no import-time work beyond the literals.
"""
from __future__ import annotations

MAX_POINTS = 1000
MAX_UPDATES = 200_000  # optimizer updates of one fit (epochs × batches); the plan lists each

ORIGINAL = "original"  # the un-intervened model; a model of this name cannot be declared
IDENTITY = "identity"  # the implicit featurizer; never declared
FEATURIZERS_NODE = "featurizers"  # the compiler's node ahead of the steps; no step may take it

DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
DTYPE_LARGEST = {"fp32": 3.4028234663852886e38, "bf16": 3.3895313892515355e38, "fp16": 65504.0}
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
STEP_KINDS = ("observe", "fit", "weights", "attribute")
VIEWS = ("raw", "logits")
TOKEN_FORMS = ("space_prefixed",)
PARAMETRIZATIONS = ("cayley",)
OPTIMIZERS = ("adamw",)
EARLY_STOP_MODES = ("max", "min")

# docs/format.md §5.2. order: forward-order sort key (layer, n): -1 before the stack, "layer" for
# the addressed layer, "L" (the layer count) after it. accessor: how the engine reaches the
# tensor, a key of causalab.engine.sites.REACH (nnterp's standardized name where it has one;
# "interior.<part>" for a tensor inside the attention call). width: the config attribute
# naming the feature width; q_width = qk_head_dim x query heads, k_width = qk_head_dim x kv
# heads, z_width = head_dim x query heads; None where the last axis is not features (ids,
# the key axis).
COMPONENTS = {
    "input_ids": {"order": (-1, -2), "accessor": "embeddings_input", "per_head": False,
                  "key_axis": False, "read_only": True, "whole_model": True,
                  "residual": False, "width": None, "seq_axis": 1, "eager_only": False},
    "embeddings": {"order": (-1, -1), "accessor": "embeddings_output", "per_head": False,
                   "key_axis": False, "read_only": False, "whole_model": True,
                   "residual": True, "width": "hidden_size", "seq_axis": 1,
                   "eager_only": False},
    "block_input": {"order": ("layer", 0), "accessor": "layers_input", "per_head": False,
                    "key_axis": False, "read_only": False, "whole_model": False,
                    "residual": True, "width": "hidden_size", "seq_axis": 1,
                    "eager_only": False},
    "attention_input_norm": {"order": ("layer", 5), "accessor": "attentions_norm_output",
                             "per_head": False, "key_axis": False, "read_only": False,
                             "whole_model": False, "residual": False,
                             "width": "hidden_size", "seq_axis": 1, "eager_only": False},
    "attention_query": {"order": ("layer", 11), "accessor": "interior.query", "per_head": True,
                        "key_axis": False, "read_only": False, "whole_model": False,
                        "residual": False, "width": "q_width", "seq_axis": 2,
                        "eager_only": False},
    "attention_key": {"order": ("layer", 12), "accessor": "interior.key", "per_head": True,
                      "key_axis": False, "read_only": False, "whole_model": False,
                      "residual": False, "width": "k_width", "seq_axis": 2,
                      "eager_only": False},
    "attention_scores": {"order": ("layer", 15), "accessor": "interior.scores", "per_head": True,
                         "key_axis": True, "read_only": False, "whole_model": False,
                         "residual": False, "width": None, "seq_axis": 2,
                         "eager_only": True},
    "attention_probs": {"order": ("layer", 20), "accessor": "attention_probabilities",
                        "per_head": True, "key_axis": True, "read_only": False,
                        "whole_model": False, "residual": False, "width": None,
                        "seq_axis": 2, "eager_only": True},
    "attention_z": {"order": ("layer", 22), "accessor": "interior.z", "per_head": True,
                    "key_axis": False, "read_only": False, "whole_model": False,
                    "residual": False, "width": "z_width", "seq_axis": 2,
                    "eager_only": False},
    "attention_premix": {"order": ("layer", 25), "accessor": "attentions_premix",
                         "per_head": True, "key_axis": False, "read_only": False,
                         "whole_model": False, "residual": False, "width": "z_width",
                         "seq_axis": 1, "eager_only": False},
    "attention_output": {"order": ("layer", 30), "accessor": "attentions_output",
                         "per_head": False, "key_axis": False, "read_only": False,
                         "whole_model": False, "residual": False, "width": "hidden_size",
                         "seq_axis": 1, "eager_only": False},
    "block_mid": {"order": ("layer", 33), "accessor": "layers_mid", "per_head": False,
                  "key_axis": False, "read_only": False, "whole_model": False,
                  "residual": False, "width": "hidden_size", "seq_axis": 1,
                  "eager_only": False},
    "mlp_input_norm": {"order": ("layer", 36), "accessor": "mlps_norm_output",
                       "per_head": False, "key_axis": False, "read_only": False,
                       "whole_model": False, "residual": False, "width": "hidden_size",
                       "seq_axis": 1, "eager_only": False},
    "mlp_input": {"order": ("layer", 40), "accessor": "mlps_input", "per_head": False,
                  "key_axis": False, "read_only": False, "whole_model": False,
                  "residual": False, "width": "hidden_size", "seq_axis": 1,
                  "eager_only": False},
    "mlp_activation": {"order": ("layer", 44), "accessor": "mlps_activation", "per_head": False,
                       "key_axis": False, "read_only": False, "whole_model": False,
                       "residual": False, "width": "intermediate_size", "seq_axis": 1,
                       "eager_only": False},
    "mlp_neuron_output": {"order": ("layer", 47), "accessor": "mlps_neurons", "per_head": False,
                          "key_axis": False, "read_only": False, "whole_model": False,
                          "residual": False, "width": "intermediate_size", "seq_axis": 1,
                          "eager_only": False},
    "mlp_output": {"order": ("layer", 50), "accessor": "mlps_output", "per_head": False,
                   "key_axis": False, "read_only": False, "whole_model": False,
                   "residual": False, "width": "hidden_size", "seq_axis": 1,
                   "eager_only": False},
    "block_output": {"order": ("layer", 60), "accessor": "layers_output", "per_head": False,
                     "key_axis": False, "read_only": False, "whole_model": False,
                     "residual": True, "width": "hidden_size", "seq_axis": 1,
                     "eager_only": False},
    "ln_final": {"order": ("L", 1000), "accessor": "ln_final_output", "per_head": False,
                 "key_axis": False, "read_only": False, "whole_model": True,
                 "residual": True, "width": "hidden_size", "seq_axis": 1,
                 "eager_only": False},
    "lm_head": {"order": ("L", 1001), "accessor": "lm_head_output", "per_head": False,
                "key_axis": False, "read_only": False, "whole_model": True,
                "residual": False, "width": "vocab_size", "seq_axis": 1,
                "eager_only": False},
    "logits": {"order": ("L", 1002), "accessor": "logits", "per_head": False,
               "key_axis": False, "read_only": False, "whole_model": True,
               "residual": False, "width": "vocab_size", "seq_axis": 1,
               "eager_only": False},
}

# docs/format.md §5.4: places outside the components that nnterp exposes on every family, without
# width or heads; order and accessor as in COMPONENTS. read_only: a derived value.
EXTRA_ACCESSORS = {
    "attentions_input": {"order": ("layer", 6), "accessor": "attentions_input", "read_only": False},
    "next_token_probs": {"order": ("L", 1003), "accessor": "next_token_probs", "read_only": True},
}


def is_interior(row: dict) -> bool:
    """True for a tensor inside the attention call (sequence axis 2, reached by its call)."""
    return row["accessor"].startswith("interior.")


# Components whose value is vocabulary-shaped without a logits view (a metric's `of`).
VOCABULARY_COMPONENTS = ("lm_head", "logits")

# Places computed from the output head (a position per logit the model keeps): every
# component or accessor ordered after the final norm.
FROM_LOGITS = frozenset(
    name for name, row in {**COMPONENTS, **EXTRA_ACCESSORS}.items()
    if row["order"][0] == "L" and row["order"][1] > COMPONENTS["ln_final"]["order"][1])

# docs/format.md §7.4. class: absolute writes replace, additive compose, bounding clip, restoring
# measures against f0. A param with "required": False and no default is an open bound.
MECHANISMS = {
    "swap": {"class": "absolute", "operand": "required", "params": {},
             "formula": "operand"},
    "add_scaled": {"class": "additive", "operand": "required",
                   "params": {"scale": {"type": "number", "required": False, "default": 1.0}},
                   "formula": "f + scale*operand"},
    "lerp": {"class": "absolute", "operand": "required",
             "params": {"t": {"type": "number", "required": True, "default": None}},
             "formula": "(1 - t)*f + t*operand"},
    "gaussian": {"class": "additive", "operand": "forbidden",
                 "params": {"seed": {"type": "int", "required": True, "default": None},
                            "scale": {"type": "number", "required": False, "default": 1.0}},
                 "formula": "f + scale*N(0, 1)"},
    "clamp": {"class": "bounding", "operand": "forbidden",
              "params": {"lo": {"type": "number", "required": False, "default": None},
                         "hi": {"type": "number", "required": False, "default": None}},
              "at_least_one": ("lo", "hi"), "ordered": ("lo", "hi"),
              "formula": "min(max(f, lo), hi)"},
    "renormalize": {"class": "restoring", "operand": "forbidden", "params": {},
                    "formula": "f * |f0| / |f|"},
}

# docs/format.md §8. k / file_path: "required", "forbidden" or "optional". seedable: a `seed` may
# be authored (never on a loaded featurizer, whatever the kind). identity is implicit.
# parametrization: what a bundle's stamp says its tensors are (docs/format.md §8.3): subspace
# takes the document's `parametrization` (one of PARAMETRIZATIONS); pca a stored orthonormal
# basis; gate logits θ (σ(θ/T) while fitting, θ > 0 after); sae/linear SAELens's tensors.
FEATURIZER_KINDS = {
    "identity": {"declarable": False, "k": "forbidden", "file_path": "forbidden",
                 "trainable": False, "seedable": False, "exportable": False,
                 "tensors": (), "parametrization": "none"},
    "subspace": {"declarable": True, "k": "required", "file_path": "optional",
                 "trainable": True, "seedable": True, "exportable": True,
                 "tensors": ("weight",), "parametrization": "cayley"},
    "pca": {"declarable": True, "k": "required", "file_path": "required",
            "trainable": False, "seedable": False, "exportable": True,
            "tensors": ("weight",), "parametrization": "basis"},
    "gate": {"declarable": True, "k": "forbidden", "file_path": "optional",
             "trainable": True, "seedable": False, "exportable": True,
             "tensors": ("weight",), "parametrization": "sigmoid_logits"},
    "sae": {"declarable": True, "k": "optional", "file_path": "required",
            "trainable": False, "seedable": False, "exportable": False,
            "tensors": ("W_enc", "W_dec", "b_enc", "b_dec"), "parametrization": "saelens"},
    "linear": {"declarable": True, "k": "optional", "file_path": "required",
               "trainable": False, "seedable": False, "exportable": False,
               "tensors": ("W_enc", "W_dec", "b_enc", "b_dec"), "parametrization": "saelens"},
}


def parametrization_of(kind: str, declared: str | None = None) -> str:
    """What a ``kind`` bundle's stamp names as its parametrization: the document's
    ``parametrization`` for a subspace, the kind's own otherwise.

    >>> parametrization_of("gate", "cayley")
    'sigmoid_logits'
    """
    if kind == "subspace" and declared is not None:
        return declared
    return FEATURIZER_KINDS[kind]["parametrization"]


# docs/format.md §8.2: the SAELens architectures an `sae` featurizer runs, keyed by cfg.json's
# `architecture`. tensors: what sae_weights.safetensors may hold (required ones first);
# config: the cfg.json keys beyond the common ones that the architecture reads.
SAE_ARCHITECTURES = {
    "standard": {"tensors": ("W_enc", "W_dec", "b_enc", "b_dec"), "required": ("W_enc",),
                 "config": (), "formula": "f = ReLU((x - b_dec) W_enc + b_enc)"},
    "topk": {"tensors": ("W_enc", "W_dec", "b_enc", "b_dec"), "required": ("W_enc", "W_dec"),
             "config": ("k", "rescale_acts_by_decoder_norm"),
             "formula": "f = ReLU(the k largest of (x - b_dec) W_enc + b_enc), others 0"},
    "jumprelu": {"tensors": ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"),
                 "required": ("W_enc", "W_dec", "threshold"), "config": (),
                 "formula": "f = ReLU(pre) * (pre > threshold), pre = (x - b_dec) W_enc + b_enc"},
    "gated": {"tensors": ("W_enc", "W_dec", "b_dec", "b_gate", "b_mag", "r_mag"),
              "required": ("W_enc", "W_dec", "b_gate", "b_mag", "r_mag"), "config": (),
              "formula": "f = ((x - b_dec) W_enc + b_gate > 0) * ReLU((x - b_dec) (W_enc exp(r_mag)) + b_mag)"},
}

# What a SAELens cfg.json (and a cfg-less file's saelens block) means by leaving a field out, as
# SAELens's own loader reads it; every causalab reader and writer of a cfg takes it from here.
# reshape_activations is "hook_z" on an attention_z hook (SAELENS_HOOKS) and this otherwise.
SAELENS_DEFAULTS = {
    "architecture": "standard",
    "apply_b_dec_to_input": True,
    "normalize_activations": "none",
    "rescale_acts_by_decoder_norm": False,
    "reshape_activations": "none",
}

# SAELens (TransformerLens) hook names -> the component they read: `blocks.<L>.<hook>`.
SAELENS_HOOKS = {
    "hook_resid_pre": "block_input",
    "hook_resid_mid": "block_mid",
    "hook_resid_post": "block_output",
    "hook_attn_out": "attention_output",
    "hook_mlp_out": "mlp_output",
    "attn.hook_z": "attention_z",
}

# docs/format.md §7.8: the COLUMNS table. Column fields name data columns, in compute order.
# differentiable: an attribute step (docs/format.md §9.7) may take its gradient (not match: a step).
# docs/format.md §3: the controls a model can be replaced by, and the seed each is drawn with
# (random_init: transformers' initialisation of the checkpoint's config under this seed).
MODEL_CONTROLS = {"random_init": {"seed": 0}}

# gap_floor: the least |m(base) - m(cf)| an edge step's faithfulness ratio divides by, in the
# kind's unit (docs/format.md §9.7, "Circuit scores"): 0.1 logit or nat is a 10 % odds or
# likelihood ratio; a probability or a fraction moves by 0.01.
METRIC_KINDS = {
    "match": {"columns": ("expected",), "unit": "fraction", "estimand_version": "match/v1",
              "differentiable": False, "gap_floor": 0.01},
    "logit_diff": {"columns": ("a", "b"), "unit": "logit",
                   "estimand_version": "logit_diff/v1", "differentiable": True,
                   "gap_floor": 0.1},
    "cross_entropy": {"columns": ("target",), "unit": "nat",
                      "estimand_version": "cross_entropy/v1", "differentiable": True,
                      "gap_floor": 0.1},
    "token_logit": {"columns": ("token",), "unit": "logit",
                    "estimand_version": "token_logit/v1", "differentiable": True,
                    "gap_floor": 0.1},
    "token_prob": {"columns": ("token",), "unit": "probability",
                   "estimand_version": "token_prob/v1", "differentiable": True,
                   "gap_floor": 0.01},
    # (LD(of) - LD(base_of)) / mean(LD(counterfactual_of) - LD(base_of)), LD = logit[a] -
    # logit[b]: how far a patch moves the logit difference across the model's own clean gap
    # (0: not at all, 1: as far as the counterfactual prompt does). ``reads``: the reads of
    # the unpatched model it also scores, named by these fields, before its columns.
    "interchange": {"columns": ("a", "b"), "reads": ("base_of", "counterfactual_of"),
                    "unit": "fraction of the clean gap", "estimand_version": "interchange/v1",
                    "differentiable": False, "gap_floor": 0.01},
}

# docs/format.md §9.7: how an attribute step cuts its site set into units. coordinate: the
# table's coordinate naming the unit (the label a sweep of that field would give); needs: what
# the site's component must have ("heads": a per-head component, or attention_output, whose
# heads are its premix slices; "width": a feature axis).
ATTRIBUTION_UNITS = {
    "site": {"coordinate": None, "needs": None},
    "head": {"coordinate": "heads", "needs": "heads"},
    "feature": {"coordinate": "units", "needs": "width"},
}
ATTRIBUTION_LAYERS_ALL = "all"
# Table rows (units x rows) one attribute step may write: beyond it a table is gigabytes.
MAX_ATTRIBUTION_ROWS = 2_000_000

# docs/format.md §6.1. Exactly one cut; scope and frame are optional.
POSITION_FORMS = {
    "cuts": {"index": "int", "span": "tuple[int, int]", "last": "int", "all": "bool"},
    "scope": {"variable": "str", "segment": "str"},
    "frames": ("prompt", "generated"),
    "segments": ("eos", "system", "user", "assistant"),
    "generated_only_segments": ("eos",),
    "sugar": 'a bare integer is {"index": i}; -1 is the last token',
}

# docs/format.md §9.3.
REDUCE_MODES = {
    "none": {"needs_k": False, "shape": "as gathered"},
    "mean": {"needs_k": False, "shape": "mean over axis 0"},
    "pca": {"needs_k": True, "shape": "(d, k) orthonormal basis"},
    "sae": {"needs_k": True, "shape": "a ReLU dictionary trained on the (-1, d) vectors: "
                                      "W_enc (d, k), W_dec (k, d), b_enc (k), b_dec (d)"},
}

# docs/format.md §8.1: a featurizer's file_path "steps:<step>/<value>" loads what an earlier step of
# the same point published: a reduced output (the featurizer kind each reduce mode loads as)
# or a weights step's entry (loaded as the kind of the featurizer it exported).
STEP_SOURCES = {
    "prefix": "steps:",
    "reduce": {"pca": "pca", "sae": "sae"},
    "weights": ("subspace", "gate", "pca"),
}

# docs/format.md §9.4: result names the run produces itself; no metric, output or read may take one.
RESERVED_RESULTS = {
    "exact": ("train/loss", "train/eval"),
    "suffixes": (".generated", ".mask"),
}

SPECIAL_NAMES = {"model": ORIGINAL, "featurizer": IDENTITY, "step": FEATURIZERS_NODE}


def is_reserved_result(name: str) -> bool:
    """True for ``train/loss``, ``train/eval``, ``*.generated`` and ``*.mask``."""
    return name in RESERVED_RESULTS["exact"] or name.endswith(RESERVED_RESULTS["suffixes"])


def declarable_featurizer_kinds() -> tuple[str, ...]:
    """The kinds a document may declare (every kind but the implicit ``identity``)."""
    return tuple(k for k, row in FEATURIZER_KINDS.items() if row["declarable"])


def _component_line(name: str, row: dict) -> str:
    where = "interior" if is_interior(row) else f"nnterp {row['accessor']}"
    flags = [flag for flag, on in (("[heads]", row["per_head"]), ("[eager]", row["eager_only"]),
                                   ("[read-only]", row["read_only"]),
                                   ("[whole-model]", row["whole_model"]),
                                   ("[residual]", row["residual"])) if on]
    width = f"width={row['width']}" if row["width"] else "width=--"
    return f"  {name:<22} {where:<32} {width:<24} {' '.join(flags)}".rstrip()


def render_vocab() -> str:
    """The text ``causalab vocab`` prints: every closed vocabulary, no model needed.

    >>> render_vocab().splitlines()[0]
    'components:'
    """
    metric_line = ", ".join(f"{k}({', '.join(r['columns'])})" for k, r in METRIC_KINDS.items())
    units_line = ", ".join(f"{k}={r['unit']} {r['estimand_version']}"
                           for k, r in METRIC_KINDS.items())
    floors_line = ", ".join(f"{k}={r['gap_floor']:g} {r['unit']}" for k, r in METRIC_KINDS.items())
    cuts = ", ".join(f"{k}={v}" for k, v in POSITION_FORMS["cuts"].items())
    segments = ", ".join(repr(s) for s in POSITION_FORMS["segments"])
    frames = ", ".join(repr(f) for f in POSITION_FORMS["frames"])
    kinds = ", ".join(sorted(declarable_featurizer_kinds()))
    lines = ["components:"]
    lines += [_component_line(name, row) for name, row in COMPONENTS.items()]
    lines += [
        f"mechanisms:       {', '.join(sorted(MECHANISMS))}",
        f"featurizer kinds: {kinds} (plus '{IDENTITY}', never declared)",
        f"sae architectures: {', '.join(SAE_ARCHITECTURES)} (cfg.json's architecture)",
        f"saelens hooks:    " + ", ".join(f"blocks.L.{h}={c}" for h, c in SAELENS_HOOKS.items()),
        f"metric kinds:     {metric_line}",
        f"units:            {units_line}",
        f"gap floors:       {floors_line} (an edge step's faithfulness below it is flagged)",
        f"position forms:   exactly one cut: {cuts}",
        f"                  scope: variable=str, segment=str ({segments}, or 'role[i]')",
        f"                  frame: Literal[{frames}]; {POSITION_FORMS['sugar']}",
        f"reduce modes:     {', '.join(REDUCE_MODES)}",
        f"attribution:      units {', '.join(ATTRIBUTION_UNITS)}; differentiable metrics "
        f"{', '.join(k for k, r in METRIC_KINDS.items() if r['differentiable'])}",
        f"step sources:     file_path \"{STEP_SOURCES['prefix']}<step>/<value>\": a reduce "
        f"{' or '.join(STEP_SOURCES['reduce'])} output, or a weights entry",
    ]
    return "\n".join(lines)


def _component_payload(row: dict) -> dict:
    interior = is_interior(row)
    return {
        "accessor": None if interior else row["accessor"],
        "interior": interior,
        "layered": not row["whole_model"],
        "seq_axis": row["seq_axis"],
        "width": row["width"],
        "read_only": row["read_only"],
        "heads": row["per_head"],
        "key_axis": row["key_axis"],
        "residual": row["residual"],
        "needs": ["attn_implementation=eager"] if row["eager_only"] else [],
    }


def vocab_payload() -> dict:
    """The extra keys of ``causalab vocab --json`` (docs/format.md §15), as plain JSON data."""
    return {
        "metric_kinds": {k: list(r["columns"]) for k, r in METRIC_KINDS.items()},
        "units": {k: {"unit": r["unit"], "estimand_version": r["estimand_version"]}
                  for k, r in METRIC_KINDS.items()},
        "components": {name: _component_payload(row) for name, row in COMPONENTS.items()},
        "mechanisms": {name: {"class": r["class"], "operand": r["operand"],
                              "params": {p: dict(spec) for p, spec in r["params"].items()}}
                       for name, r in MECHANISMS.items()},
        "featurizer_kinds": {k: {key: (list(v) if isinstance(v, tuple) else v)
                                 for key, v in r.items()}
                             for k, r in FEATURIZER_KINDS.items()},
        "position_forms": {"cuts": dict(POSITION_FORMS["cuts"]),
                           "scope": dict(POSITION_FORMS["scope"]),
                           "frames": list(POSITION_FORMS["frames"]),
                           "segments": list(POSITION_FORMS["segments"])},
        "reduce_modes": list(REDUCE_MODES),
        "sae_architectures": {k: {key: (list(v) if isinstance(v, tuple) else v)
                                  for key, v in r.items()}
                              for k, r in SAE_ARCHITECTURES.items()},
        "saelens_hooks": dict(SAELENS_HOOKS), "max_points": MAX_POINTS,
        "gap_floors": {k: r["gap_floor"] for k, r in METRIC_KINDS.items()},
    }
