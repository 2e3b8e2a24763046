"""SAELens's ``cfg.json`` read as an `sae` featurizer's identity: normalised, then checked.

A SAELens directory says what it is, so it needs no causalab stamp: its architecture, its
widths and dtype (compared with the tensors' header), its hook (mapped to a causalab
component and layer and compared with the document's site) and the options the maths needs.
Both cfg formats are read: SAELens ≥ 6 (``architecture``, ``metadata.hook_name``) and the
older one (``activation_fn_str``, ``hook_point``, ``normalize_activations`` as a bool), the
way SAELens's own loader reads them. Needs no torch; every refusal (C8) is a CompileError at
the path the caller gives (``featurizers.<f>.file_path``) and names the cfg file it read.
"""
from __future__ import annotations

import re

from causalab.document.vocab import SAE_ARCHITECTURES, SAELENS_DEFAULTS, SAELENS_HOOKS
from causalab.errors import CompileError, Path

CONFIG = "cfg.json"
BLOCK = "the featurizer's saelens block"  # the source of a cfg-less file's config

# What the maths reads; everything else in cfg.json (training settings, dataset names) is
# description and is not compared.
OPTION_KEYS = ("architecture", "apply_b_dec_to_input", "k", "rescale_acts_by_decoder_norm")
# What a bare weights file's document block must say, because no cfg.json says it.
BARE_REQUIRED = ("architecture", "apply_b_dec_to_input", "normalize_activations")
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
_HOOK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_FORMAT_6 = re.compile(r"^(\d+)\.")
# The JSON type of each cfg field the loader reads, a nested one dotted; null reads as absent.
# Without this a list where a string belongs crashes the reader instead of being refused.
_FIELD_TYPES = {
    "architecture": str, "activation_fn": str, "activation_fn_str": str,
    "activation_fn_kwargs": dict, "activation_fn_kwargs.k": int,
    "metadata": dict, "metadata.hook_name": str, "metadata.sae_lens_version": (str, int, float),
    "sae_lens_version": (str, int, float), "hook_name": str, "hook_point": str,
    "hook_head_index": int, "hook_point_head_index": int, "apply_b_dec_to_input": bool,
    "rescale_acts_by_decoder_norm": bool, "normalize_activations": (str, bool),
    "reshape_activations": str, "k": int, "d_in": int, "d_sae": int, "dtype": str,
}
_JSON_TYPES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "an object", type(None): "null"}


def _field(config: dict, dotted: str):
    """The value at a dotted field, None where any part is absent or not an object."""
    value = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _check_types(config: dict, source: str, at: Path) -> None:
    """Refuse a cfg field of the wrong JSON type; a boolean is not an integer (docs/format.md §0)."""
    for dotted, wanted in _FIELD_TYPES.items():
        value = _field(config, dotted)
        kinds = wanted if isinstance(wanted, tuple) else (wanted,)
        if value is None or type(value) in kinds or (type(value) is int and float in kinds):
            continue
        expected = " or ".join(_JSON_TYPES[kind] for kind in kinds)
        raise CompileError(at, f"{source}: {dotted} must be {expected}, "
                               f"not {_JSON_TYPES.get(type(value), type(value).__name__)}")


def _is_pre_6(config: dict) -> bool:
    """SAELens's own rule: no ``sae_lens_version`` (top level or in metadata), or < 6."""
    version = config.get("sae_lens_version") or (config.get("metadata") or {}).get("sae_lens_version")
    match = _FORMAT_6.match(str(version or ""))
    return match is None or int(match.group(1)) < 6


def _from_pre_6(config: dict, at: Path, source: str) -> dict:
    """A pre-6.0 cfg in the 6.x shape, as SAELens's ``handle_pre_6_0_config`` reads it."""
    out = dict(config)
    renames = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
               "activation_fn_str": "activation_fn"}
    for old, new in renames.items():
        if old in out:
            out[new] = out.pop(old)
    activation = out.get("activation_fn") or "relu"
    out.setdefault("architecture", SAELENS_DEFAULTS["architecture"])
    out.setdefault("reshape_activations", reshape_of(out.get("hook_name")))
    if activation == "topk":
        k = (out.get("activation_fn_kwargs") or {}).get("k")
        if k is None:
            raise CompileError(at, f"{source}: activation_fn_str 'topk' without activation_fn_kwargs.k")
        out.update(architecture="topk", k=k)
    elif activation != "relu":
        raise CompileError(at, f"{source}: activation_fn_str {activation!r} is not implemented "
                               "(relu and topk are)")
    if out.get("finetuning_scaling_factor"):
        raise CompileError(at, f"{source}: finetuning_scaling_factor is not implemented")
    return out


def _normalisation(config: dict, at: Path, source: str) -> str:
    value = config.get("normalize_activations")
    if value in (None, False, "none"):
        return "none"
    if value is True:
        value = "expected_average_only_in"  # SAELens's reading of the old boolean
    raise CompileError(at, f"{source}: normalize_activations {value!r} is not implemented "
                           "(only 'none' is)")


def reshape_of(hook_name: str | None) -> str:
    """The ``reshape_activations`` a cfg without one means: ``hook_z`` on an attention_z hook."""
    return "hook_z" if "hook_z" in str(hook_name or "") else SAELENS_DEFAULTS["reshape_activations"]


def hook_site(hook_name: str) -> tuple[str, int] | None:
    """``"blocks.3.hook_resid_post"`` -> ``("block_output", 3)``; None for any other hook.

    >>> hook_site("blocks.1.attn.hook_z")
    ('attention_z', 1)
    """
    match = _HOOK.match(hook_name)
    if match is None or match.group(2) not in SAELENS_HOOKS:
        return None
    return SAELENS_HOOKS[match.group(2)], int(match.group(1))


def hook_name(component: str, layer: int) -> str:
    """The SAELens hook name of a component at a layer (the inverse of :func:`hook_site`)."""
    for hook, name in SAELENS_HOOKS.items():
        if name == component:
            return f"blocks.{layer}.{hook}"
    raise ValueError(f"{component} has no SAELens hook name; these do: "
                     f"{', '.join(sorted(SAELENS_HOOKS.values()))}")


def normalise(config: dict, at: Path, source: str = CONFIG) -> dict:
    """A cfg.json (either format) as ``{architecture, apply_b_dec_to_input, k?,
    rescale_acts_by_decoder_norm?, hook_name?, d_in?, d_sae?, dtype?, reshape_activations}``.
    ``source`` (the cfg file's path) is what a refusal names."""
    if not isinstance(config, dict):
        raise CompileError(at, f"{source} is not a JSON object")
    _check_types(config, source, at)
    if _is_pre_6(config):
        config = _from_pre_6(config, at, source)
    architecture = config.get("architecture", SAELENS_DEFAULTS["architecture"])
    if architecture not in SAE_ARCHITECTURES:
        raise CompileError(at, f"{source}: architecture {architecture!r} is not implemented; "
                               f"these are: {', '.join(SAE_ARCHITECTURES)}")
    _normalisation(config, at, source)
    if config.get("hook_head_index") is not None:
        raise CompileError(at, f"{source}: an SAE of one head (hook_head_index) is not implemented")
    out = {"architecture": architecture,
           "apply_b_dec_to_input": bool(config.get("apply_b_dec_to_input",
                                                   SAELENS_DEFAULTS["apply_b_dec_to_input"])),
           "reshape_activations": (config.get("reshape_activations")
                                   or SAELENS_DEFAULTS["reshape_activations"])}
    if architecture == "topk":
        if not isinstance(config.get("k"), int) or config["k"] <= 0:
            raise CompileError(at, f"{source}: a topk SAE needs a positive integer k")
        rescale = config.get("rescale_acts_by_decoder_norm",
                             SAELENS_DEFAULTS["rescale_acts_by_decoder_norm"])
        out.update(k=config["k"], rescale_acts_by_decoder_norm=bool(rescale))
    name = config.get("hook_name") or (config.get("metadata") or {}).get("hook_name")
    if name:
        out["hook_name"] = str(name)
    for key in ("d_in", "d_sae", "dtype"):
        if config.get(key) is not None:
            out[key] = config[key]
    return out


def _check_site(config: dict, stamp: dict, at: Path, source: str) -> None:
    """The SAE's hook against the document's site. A cfg file must say its hook; only the
    document's own block (a cfg-less file) may leave it out, the document being its site."""
    if "hook_name" not in config:
        if source == BLOCK:
            return
        raise CompileError(at, f"{source} has no hook_name (metadata.hook_name; hook_point before "
                               "SAELens 6), which is needed to check the SAE belongs at this site; "
                               "add it there or to the featurizer's saelens block")
    site = hook_site(config["hook_name"])
    if site is None:
        raise CompileError(at, f"hook_name {config['hook_name']!r} names no causalab site; "
                               f"known hooks: blocks.<L>.{{{', '.join(SAELENS_HOOKS)}}}")
    document = (stamp.get("component"), stamp.get("layer"))
    if (site[0], str(site[1])) != document:
        raise CompileError(at, f"hook_name: SAE reads {config['hook_name']} ({site[0]}[{site[1]}]), "
                               f"the document's site is {document[0]}[{document[1]}]")
    reshape = config.get("reshape_activations", SAELENS_DEFAULTS["reshape_activations"])
    if reshape not in ("none", "hook_z") or (reshape == "hook_z") != (site[0] == "attention_z"):
        raise CompileError(at, f"{source}: reshape_activations {reshape!r} does not fit {site[0]}")


def _check_tensors(config: dict, header: dict, at: Path, source: str) -> None:
    """Tensor names, widths, dtype and a topk's k against the architecture and the cfg."""
    row = SAE_ARCHITECTURES[config["architecture"]]
    names = set(header)
    missing = [n for n in row["required"] if n not in names]
    extra = sorted(names - set(row["tensors"]))
    if missing or extra:
        raise CompileError(at, f"a {config['architecture']} SAE holds {', '.join(row['tensors'])} "
                               f"(required: {', '.join(row['required'])}); found {', '.join(sorted(names))}")
    if len(header["W_enc"]["shape"]) != 2:
        raise CompileError(at, f"W_enc has shape {list(header['W_enc']['shape'])}; an SAE's has two "
                               "axes, (d_in, d_sae)")
    d_in, d_sae = header["W_enc"]["shape"]
    for key, value in (("d_in", d_in), ("d_sae", d_sae)):
        if key in config and config[key] != value:
            raise CompileError(at, f"{key}: {source} says {config[key]}, W_enc has {value}")
    if config.get("k", 0) > d_sae:
        raise CompileError(at, f"k: {source} says {config['k']}, more than the {d_sae} latents "
                               "(d_sae) of W_enc")
    if "dtype" in config:
        said = _DTYPES.get(str(config["dtype"]).removeprefix("torch."))
        found = sorted({entry["dtype"] for entry in header.values()})
        if said is None or found != [said]:
            raise CompileError(at, f"dtype: {source} says {config['dtype']}, tensors are {', '.join(found)}")


def check(config: dict, header: dict, stamp: dict, at: Path, source: str = CONFIG) -> dict:
    """Refuse a normalised cfg that does not fit its tensors or the document's site; return
    the options the featurizer is built with. ``source``: where the cfg came from."""
    _check_tensors(config, header, at, source)
    _check_site(config, stamp, at, source)
    return {key: config[key] for key in OPTION_KEYS if key in config}


def from_document(block: dict, at: Path, config_file: str = CONFIG) -> dict:
    """A document's ``saelens`` block standing in for a missing cfg.json (``config_file``, the
    path it would have): every field said."""
    missing = [key for key in BARE_REQUIRED if key not in block]
    if block.get("architecture") == "topk" and "k" not in block:
        missing.append("k")
    if missing:
        raise CompileError(at, f"no {config_file}: a SAELens weights file without one needs the "
                               f"document's saelens block to say {', '.join(missing)}")
    return normalise({**block, "sae_lens_version": "6"}, at, BLOCK)
