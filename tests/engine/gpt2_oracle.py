"""GPT-2's senders and receivers patched by hand (the GPT-2 edge tests' oracle), from its formulas.

The embeddings are ``wte(ids) + wpe(positions)``; a head's output is its slice of
``c_proj``'s input times its rows of ``c_proj``'s weight (``Conv1D``: ``x @ W``), no bias (the
bias is the same in every forward: a constant of the stream); an MLP's output is ``mlp``'s. A
head's query (key, value) receiver is the stream entering its block plus the patch, through
``F.layer_norm`` with ``ln_1``'s weight, bias and eps, then its columns of ``c_attn``'s weight
and bias, written into that head's slice of ``c_attn``'s output; an attention block's, an
MLP's and the logits' receivers are the inputs of ``ln_1``, ``ln_2`` and ``ln_f``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def senders(model) -> tuple[dict, list]:
    """Each sender's output by label, read with the oracle's own hooks."""
    found, handles = {}, []
    config, stack = model.config, model.transformer
    heads, dim = config.n_head, config.n_embd // config.n_head
    parts = {}
    handles.append(stack.wte.register_forward_hook(lambda m, a, o: parts.__setitem__("wte", o)))

    def on_positions(module, args, output):
        found["embeddings"] = parts["wte"] + output
    handles.append(stack.wpe.register_forward_hook(on_positions))
    for l, block in enumerate(stack.h):
        def grab(module, args, l=l):
            for h in range(heads):
                rows = slice(h * dim, (h + 1) * dim)
                found[f"L{l}H{h}"] = args[0][..., rows] @ module.weight[rows, :]
        handles.append(block.attn.c_proj.register_forward_pre_hook(grab))
        handles.append(block.mlp.register_forward_hook(
            lambda m, a, o, l=l: found.__setitem__(f"L{l}MLP", o)))
    return found, handles


def receiver_hooks(model, adds: dict, now: dict) -> list:
    """Hooks adding ``adds[receiver](now)`` to each named receiver's input."""
    config, found = model.config, []
    d, dim = config.n_embd, config.n_embd // config.n_head
    for l, block in enumerate(model.transformer.h):
        stream = {}

        def on_ln_1(module, args, l=l, stream=stream):
            stream["x"] = args[0]
            if f"L{l}.attention" in adds:
                return (args[0] + adds[f"L{l}.attention"](now),)
        found.append(block.ln_1.register_forward_pre_hook(on_ln_1))

        def on_c_attn(module, args, output, l=l, block=block, stream=stream):
            out = output.clone()
            for kind, offset in (("q", 0), ("k", d), ("v", 2 * d)):
                for h in range(config.n_head):
                    name = f"L{l}H{h}.q" if kind == "q" else f"L{l}KV{h}.{kind}"
                    if name in adds:
                        ln = block.ln_1
                        x = F.layer_norm(stream["x"] + adds[name](now), (d,), ln.weight,
                                         ln.bias, ln.eps)
                        cols = slice(offset + h * dim, offset + (h + 1) * dim)
                        out[..., cols] = x @ module.weight[:, cols] + module.bias[cols]
            return out
        found.append(block.attn.c_attn.register_forward_hook(on_c_attn))
        if f"L{l}.mlp" in adds:
            found.append(block.ln_2.register_forward_pre_hook(
                lambda m, a, add=adds[f"L{l}.mlp"]: (a[0] + add(now),)))
    if "logits" in adds:
        found.append(model.transformer.ln_f.register_forward_pre_hook(
            lambda m, a: (a[0] + adds["logits"](now),)))
    return found


def run(model, batch, metric, adds: dict) -> torch.Tensor:
    now, handles = senders(model)
    handles += receiver_hooks(model, adds, now)
    try:
        with torch.no_grad():
            return metric(model(**batch).logits[:, -1])
    finally:
        for handle in handles:
            handle.remove()


def outputs(model, batch) -> dict:
    found, handles = senders(model)
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return found
