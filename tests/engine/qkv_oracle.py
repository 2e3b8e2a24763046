"""Per-head receivers patched by hand (the edge tests' oracle), from the models' formulas.

Receiver ``L{l}H{h}.q`` is the residual stream as layer ``l``'s query head ``h`` reads it; here
its patched value ``x + add(now)`` (``x`` the stream entering the block, caught at
``input_layernorm``'s input) goes through the RMSNorm written out (``x · g / sqrt(mean(x²) +
eps)``, ``g`` the norm's gain) and head ``h``'s rows of ``q_proj`` by ``F.linear``, and replaces
that head's slice of ``q_proj``'s output; ``L{l}KV{g}.k`` and ``.v`` likewise key/value head
``g``'s slice of ``k_proj`` and ``v_proj``. MLP and logits receivers are their norms' inputs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _normed(norm, x, gain):
    eps = getattr(norm, "variance_epsilon", None) or norm.eps
    return x * gain(norm) / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def handles(model, adds: dict, now: dict, gain, pre_mlp: str) -> list:
    """Hooks adding ``adds[receiver](now)`` to each named receiver's input, per head for
    ``.q``/``.k``/``.v`` receivers; ``gain(norm)`` the norm's multiplier."""
    config, found = model.config, []
    dim = config.head_dim
    for l, layer in enumerate(model.model.layers):
        stream = {}
        found.append(layer.input_layernorm.register_forward_pre_hook(
            lambda m, a, stream=stream: stream.__setitem__("x", a[0])))

        def slices(kind, count, stream=stream, l=l, layer=layer):
            def hook(module, args, output):
                out = output.clone()
                for i in range(count):
                    name = f"L{l}H{i}.q" if kind == "q" else f"L{l}KV{i}.{kind}"
                    if name in adds:
                        x = _normed(layer.input_layernorm, stream["x"] + adds[name](now), gain)
                        rows = slice(i * dim, (i + 1) * dim)
                        out[..., rows] = F.linear(x, module.weight[rows])
                return out
            return hook
        attention = layer.self_attn
        kv = config.num_key_value_heads
        found += [attention.q_proj.register_forward_hook(slices("q", config.num_attention_heads)),
                  attention.k_proj.register_forward_hook(slices("k", kv)),
                  attention.v_proj.register_forward_hook(slices("v", kv))]
        if f"L{l}.mlp" in adds:
            found.append(getattr(layer, pre_mlp).register_forward_pre_hook(
                lambda m, a, add=adds[f"L{l}.mlp"]: (a[0] + add(now),)))
    if "logits" in adds:
        found.append(model.model.norm.register_forward_pre_hook(
            lambda m, a: (a[0] + adds["logits"](now),)))
    return found


def rank(values: torch.Tensor) -> torch.Tensor:
    return values.argsort().argsort().double()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = rank(a), rank(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))
