"""Addresses: the one file that knows model anatomy (component × layer → place, width, availability).

It reads the checkpoint's config and nothing else: no weights, no module tree, no tokenizer.
Order, accessor and sequence axis come from the vocabulary's COMPONENTS table; this file adds
what only the config knows: layer and head counts, widths and which blocks lack a component.

    >>> from transformers import LlamaConfig
    >>> cfg = LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=4,
    ...                   num_key_value_heads=2, intermediate_size=64, vocab_size=100)
    >>> resolve_address("attention_key", 1, None, None, cfg, None, ("sites", "k")).width
    8
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from causalab.compile.plan import Address
from causalab.document import vocab
from causalab.errors import CompileError

EAGER_ONLY_MESSAGE = 'needs eager attention: set "attn_implementation": "eager" in model'
EXTRA_ACCESSORS = vocab.EXTRA_ACCESSORS
_MLP_WIDE = ("mlp_activation", "mlp_neuron_output")
_ATTENTION = ("attention_input_norm", "attention_query", "attention_key", "attention_scores",
              "attention_probs", "attention_z", "attention_premix", "attention_output")


@dataclass(frozen=True)
class Facts:
    """What the config says about the places the components name."""

    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    parallel: bool
    post_norm: bool
    moe_layers: frozenset
    linear_layers: frozenset


def _attr(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def facts(config: Any) -> Facts:
    """Counts and widths from a llama/gpt2/gemma2/qwen2-style config (or any close relative)."""
    config = getattr(config, "text_config", None) or config
    layers = _attr(config, "num_hidden_layers", "n_layer")
    hidden = _attr(config, "hidden_size", "n_embd")
    q_heads = _attr(config, "num_attention_heads", "n_head")
    kv_heads = _attr(config, "num_key_value_heads", default=q_heads)
    head_dim = _attr(config, "head_dim", default=hidden // q_heads)
    intermediate = _attr(config, "n_inner") if config.model_type == "gpt2" else None
    if config.model_type == "gpt2":
        intermediate = intermediate or 4 * hidden
    else:
        intermediate = _attr(config, "intermediate_size", "n_inner", "ffn_dim")
    types = list(_attr(config, "layer_types", default=()) or ())
    return Facts(
        layers=layers, hidden=hidden, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
        intermediate=intermediate, vocab=config.vocab_size,
        parallel=bool(_attr(config, "use_parallel_residual", "parallel_attn", default=False))
        or config.model_type in ("gptj", "phi", "falcon"),
        post_norm=config.model_type in ("olmo2",),
        moe_layers=frozenset(_moe_layers(config, layers)),
        linear_layers=frozenset(i for i, t in enumerate(types) if "linear" in str(t)),
    )


def _moe_layers(config: Any, layers: int) -> list[int]:
    experts = _attr(config, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    if not experts:
        return []
    first_dense = _attr(config, "first_k_dense_replace", default=0)
    dense = set(_attr(config, "mlp_only_layers", default=()) or ())
    step = _attr(config, "decoder_sparse_step", default=1) or 1
    return [i for i in range(first_dense, layers) if i not in dense and (i + 1) % step == 0]


def _row(component: str) -> dict:
    return vocab.COMPONENTS[component]


def _layered(component: str) -> bool:
    if component in EXTRA_ACCESSORS:
        return EXTRA_ACCESSORS[component]["order"][0] == "layer"
    return not _row(component)["whole_model"]


def _widths(f: Facts) -> dict[str, int]:
    """The vocabulary's width names (``q_width``, ``hidden_size``…) as numbers for this config."""
    return {"hidden_size": f.hidden, "q_width": f.q_heads * f.head_dim,
            "k_width": f.kv_heads * f.head_dim, "z_width": f.q_heads * f.head_dim,
            "intermediate_size": f.intermediate, "vocab_size": f.vocab}


def component_width(component: str, f: Facts) -> int | None:
    """The full feature width at a component (before heads/units slicing)."""
    name = _row(component)["width"]
    return _widths(f)[name] if name else None


def head_count(component: str, f: Facts) -> int | None:
    """Heads the address holds: kv heads for keys, query heads for the other per-head ones."""
    if not _row(component)["per_head"]:
        return None
    return f.kv_heads if _row(component)["width"] == "k_width" else f.q_heads


def unavailable(component: str, layer: int | None, f: Facts,
                attn_implementation: str | None) -> str | None:
    """Why this checkpoint lacks the component at ``layer`` (C4), else None."""
    if _row(component)["eager_only"] and attn_implementation != "eager":
        return EAGER_ONLY_MESSAGE
    if component in _MLP_WIDE and layer in f.moe_layers:
        return f"layer {layer} is a mixture-of-experts layer"
    if component in ("block_mid", "mlp_input_norm") and f.parallel:
        return "parallel attention/MLP blocks have no such place"
    if component in ("attention_input_norm", "mlp_input_norm") and f.post_norm:
        return "post-norm blocks have no such place"
    if component in _ATTENTION and layer in f.linear_layers:
        return f"layer {layer} is a linear-attention layer"
    return None


def _order(component: str, layer: int | None, f: Facts) -> tuple[int, int]:
    """The sort key ``(layer, n)``: whole-model places sort at -1 or at the layer count."""
    where, n = (EXTRA_ACCESSORS.get(component) or _row(component))["order"]
    if where == "layer":
        return (layer, n)
    return (f.layers, n) if where == "L" else (where, n)


def _check_layer(component: str, layer: int | None, f: Facts, path: tuple) -> None:
    if _layered(component) and (layer is None or not 0 <= layer < f.layers):
        raise CompileError(path + ("layers",),
                           f"layer {layer} is out of range: the model has {f.layers} layers")


def _selection(component: str, width: int | None, heads, units, f: Facts,
               path: tuple) -> tuple[int | None, int | None, int | None]:
    """(sliced width, groups, per_group) for a heads/units selection (C5 past the end)."""
    if heads:
        count = head_count(component, f) or 0
        bad = [h for h in heads if not 0 <= h < count]
        if bad:
            raise CompileError(path + ("heads",), f"head {bad[0]} of a {count}-head tensor")
        per = (width // count) if width else None
        return (len(heads) * per if per else None), count, per
    if units:
        if width is None:
            raise CompileError(path + ("units",), f"{component} has no width to take units from")
        bad = [u for u in units if not 0 <= u < width]
        if bad:
            raise CompileError(path + ("units",), f"unit {bad[0]} of a {width}-wide tensor")
        return len(units), width, 1
    return width, None, None


def _nearest(component: str) -> str:
    """``"; did you mean block_output?"`` for a near miss; the whole list is ``causalab vocab``."""
    import difflib

    close = difflib.get_close_matches(component, list(vocab.COMPONENTS), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{hint} ({len(vocab.COMPONENTS)} components: causalab vocab lists them)"


def resolve_address(component: str, layer: int | None, heads, units, config: Any,
                    attn_implementation: str | None, path: tuple) -> Address:
    """The site's address; refusals C2–C5 at ``path`` (the site's path, ``("sites", t)``)."""
    f = facts(config)
    if component not in vocab.COMPONENTS and component not in EXTRA_ACCESSORS:
        raise CompileError(path + ("component",), f"unknown component {component!r}"
                                                  f"{_nearest(component)}")
    _check_layer(component, layer, f, path)
    if component in EXTRA_ACCESSORS:
        extra = EXTRA_ACCESSORS[component]
        return Address(component=component, layer=layer, accessor=extra["accessor"],
                       order=_order(component, layer, f), seq_axis=1, width=None, full_width=None,
                       read_only=extra["read_only"])
    why = unavailable(component, layer, f, attn_implementation)
    if why:
        raise CompileError(path + ("component",), f"{component} is unavailable here: {why}")
    row = _row(component)
    full = component_width(component, f)
    heads = tuple(heads) if heads else None
    units = tuple(units) if units else None
    width, groups, per = _selection(component, full, heads, units, f, path)
    return Address(
        component=component, layer=layer if _layered(component) else None,
        accessor=row["accessor"], order=_order(component, layer, f),
        seq_axis=row["seq_axis"], width=width, full_width=full, heads=heads, units=units,
        groups=groups, per_group=per, interior=vocab.is_interior(row),
        key_axis=row["key_axis"], read_only=row["read_only"],
    )


def component_table(config: Any, attn_implementation: str | None) -> dict:
    """Every component at layer 0: ``{name: {resolves, width, op, why}}`` for ``causalab model``."""
    f = facts(config)
    table = {}
    for component in vocab.COMPONENTS:
        layer = 0 if _layered(component) else None
        why = unavailable(component, layer, f, attn_implementation)
        table[component] = {
            "resolves": why is None,
            "width": component_width(component, f) if why is None else None,
            "op": _row(component)["accessor"],
            "why": why or "",
        }
    return table


def layer_count(config: Any) -> int:
    return facts(config).layers
