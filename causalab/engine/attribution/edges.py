"""Edge attribution (EAP-IG, Hanna et al. 2024) and the faithfulness of its circuits.

The graph is the residual decomposition of a pre-norm decoder: **senders** are the embeddings,
every head's output (its ``o_proj`` input slice through its columns of ``o_proj``, as the head
sweep's ``attention_premix`` units are) and every MLP's output; **receivers** are each layer's
attention input, its MLP input and the logits (the final norm's input). A receiver's input is
the sum of the outputs of the senders before it, so an edge ``u → v`` is one term of that sum.
This is the coarse receiver set MIB also scores (one receiver per attention block rather than
one per head's query, key and value): an edge into ``L3.attention`` moves all its heads.

**Score.** ``s(u → v) = Σ_pos (u_cf − u_base) · ḡ_v``, ``ḡ_v`` the gradient of the metric with
respect to ``v``'s input alone (a zero leaf added where only ``v`` reads it: the input of ``v``'s
norm), averaged over ``steps`` forwards whose embeddings lie ``k/steps`` of the way from the
base's to the counterfactual's (``k = 0 … steps−1``; ``steps: 1`` is EAP, the node step's
``ig`` convention). Per row; tables hold the mean over rows.

**Faithfulness.** A circuit is the top-``k`` edges by ``|score|``; every other edge is patched
from the counterfactual: in the base forward, each receiver's input gets, for each edge into it
outside the circuit, ``u_cf − u_now`` added (``u_now`` the sender's output in this same patched
forward, as Hanna et al.'s and MIB's evaluation take it). With no edge kept the forward is the
counterfactual's, with every edge kept it is the base's, so the normalised score
``(m(circuit) − m(cf)) / (m(base) − m(cf))`` (row means) runs from 0 to 1; its area is the
trapezoid over ``k / |edges|``.

Works on the Llama-like layout (``input_layernorm`` before attention, ``post_attention_layernorm``
before the MLP, no post-norms): Gemma's post-norms make a head's output a non-additive term.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

from causalab.lazy import torch


Metric = Callable[["torch.Tensor"], "torch.Tensor"]  # last-position logits (rows, vocab) -> (rows,)


@dataclasses.dataclass(frozen=True)
class Graph:
    """Sender and receiver labels (head-sweep style: ``L3H1``) and which edges exist."""

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    mask: torch.Tensor  # (senders, receivers) bool: the sender runs before the receiver

    def edges(self) -> list[tuple[int, int]]:
        return [tuple(e) for e in self.mask.nonzero().tolist()]


def _layout(model) -> tuple:
    """``(embed, layers, final norm, heads, head_dim)``, refused off the Llama-like layout."""
    inner = model.model
    layer = inner.layers[0]
    if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")) or \
            hasattr(layer, "pre_feedforward_layernorm"):
        raise ValueError(f"{type(model).__name__}: edge attribution needs a pre-norm layout "
                         "with no post-norms (input_layernorm, post_attention_layernorm)")
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return inner.embed_tokens, inner.layers, inner.norm, config.num_attention_heads, head_dim


def graph(model) -> Graph:
    """The model's senders, receivers and edges."""
    _, layers, _, heads, _ = _layout(model)
    return graph_of(len(layers), heads)


def graph_of(layers: int, heads: int) -> Graph:
    """The graph of a Llama-like model of ``layers`` blocks of ``heads`` heads (its config's
    shape alone: ``explain --traces`` counts the edges with no weights)."""
    senders, order = ["embeddings"], [(-1, 0)]
    for l in range(layers):
        senders += [f"L{l}H{h}" for h in range(heads)] + [f"L{l}MLP"]
        order += [(l, 0)] * heads + [(l, 1)]
    receivers, places = [], []
    for l in range(layers):
        receivers += [f"L{l}.attention", f"L{l}.mlp"]
        places += [(l, 0), (l, 1)]
    receivers.append("logits")
    places.append((layers, 0))
    mask = torch.tensor([[s < r for r in places] for s in order])
    return Graph(tuple(senders), tuple(receivers), mask)


@contextlib.contextmanager
def _hooked(model, out: dict, embeddings: torch.Tensor | None, shift: Callable):
    """Hooks for one forward: sender outputs into ``out['senders']`` as ``(rows, seq, d)``
    tensors in sender order; the embeddings replaced by ``embeddings`` when given; each
    receiver's input (its norm's input) passed through ``shift(index, input, senders)``."""
    embed, layers, final, heads, head_dim = _layout(model)
    senders, handles = out.setdefault("senders", []), []

    def on_embed(module, args, output):
        value = output if embeddings is None else embeddings
        senders.append(value)
        return value

    def on_heads(layer):
        def hook(module, args):
            z = args[0].unflatten(-1, (heads, head_dim))
            w = module.weight.unflatten(1, (heads, head_dim))  # (d, heads, head_dim)
            senders.extend(torch.einsum("bshk,dhk->hbsd", z, w).unbind(0))
        return hook

    def on_receiver(index):
        def hook(module, args):
            return (shift(index, args[0], senders),) + tuple(args[1:])
        return hook

    handles.append(embed.register_forward_hook(on_embed))
    for l, layer in enumerate(layers):
        handles.append(layer.input_layernorm.register_forward_pre_hook(on_receiver(2 * l)))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(on_heads(l)))
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(
            on_receiver(2 * l + 1)))
        handles.append(layer.mlp.register_forward_hook(
            lambda module, args, output: senders.append(output)))
    handles.append(final.register_forward_pre_hook(on_receiver(2 * len(layers))))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _forward(model, batch: dict, metric: Metric, embeddings=None, shift=None) -> tuple:
    """``(metric per row, sender outputs)`` of one hooked forward."""
    out: dict = {}
    with _hooked(model, out, embeddings, shift or (lambda i, x, s: x)):
        logits = model(**batch).logits[:, -1]
    return metric(logits), out["senders"]


def scores(model, base: dict, counterfactual: dict, metric: Metric, steps: int = 1) -> torch.Tensor:
    """``(rows, senders, receivers)`` EAP-IG edge scores (zero where no edge); ``base`` and
    ``counterfactual`` tokenizer batches of equal shape and mask."""
    found = graph(model)
    with torch.no_grad():
        _, cf = _forward(model, counterfactual, metric)
        _, at_base = _forward(model, base, metric)
    delta = torch.stack([c - b for c, b in zip(cf, at_base)])  # (senders, rows, seq, d)
    grads = None
    for k in range(steps):
        embeddings = at_base[0] + (k / steps) * (cf[0] - at_base[0])
        leaves = [torch.zeros_like(embeddings, requires_grad=True)
                  for _ in found.receivers]
        values, _ = _forward(model, base, metric, embeddings,
                             lambda i, x, s: x + leaves[i])
        step = torch.autograd.grad(values.sum(), leaves)
        grads = step if grads is None else [g + h for g, h in zip(grads, step)]
    mean = torch.stack(grads) / steps  # (receivers, rows, seq, d)
    every = torch.einsum("ubsd,vbsd->buv", delta.float(), mean.float())
    return every * found.mask


def patched(model, base: dict, counterfactual: dict | list, metric: Metric,
            outside: torch.Tensor) -> torch.Tensor:
    """The metric per row with every edge in ``outside`` ``(senders, receivers)`` patched from
    the counterfactual: each receiver's input gets ``Σ_u (u_cf − u_now)`` over those edges.
    ``counterfactual``: its batch, or its sender outputs already taken."""
    with torch.no_grad():
        cf = counterfactual
        if isinstance(cf, dict):
            cf = _forward(model, counterfactual, metric)[1]

        def shift(index, x, now):
            senders = outside[:, index].nonzero().flatten().tolist()
            if not senders:
                return x
            return x + (torch.stack([cf[u] for u in senders]).sum(0)
                        - torch.stack([now[u] for u in senders]).sum(0))
        values, _ = _forward(model, base, metric, shift=shift)
    return values


@dataclasses.dataclass(frozen=True)
class Curve:
    """Faithfulness against circuit size: ``ks``, the metric's row mean at each, the
    normalised score at each and the area under it over ``k / |edges|``."""

    ks: tuple[int, ...]
    metric: tuple[float, ...]
    faithfulness: tuple[float, ...]
    base: float
    counterfactual: float
    area: float


def circuit(mean_scores: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """The top-``k`` edges by ``|score|`` as a ``(senders, receivers)`` bool mask."""
    flat = torch.where(mask, mean_scores.abs(), torch.full_like(mean_scores, -1.0)).flatten()
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[flat.argsort(descending=True, stable=True)[:k]] = True
    return keep.view_as(mask) & mask


def faithfulness(model, windows: list[tuple[dict, dict, Metric]], mean_scores: torch.Tensor,
                 ks: list[int]) -> Curve:
    """The curve over ``ks`` for the circuits ``mean_scores`` (senders, receivers) ranks;
    ``windows``: ``(base, counterfactual, metric)`` per window of rows, row means over all."""
    mask = graph(model).mask
    total = int(mask.sum())
    outside = [mask & ~circuit(mean_scores, mask, k) for k in ks]
    found: list[list[torch.Tensor]] = [[] for _ in range(len(ks) + 2)]
    with torch.no_grad():
        for base, cf, metric in windows:
            found[0].append(_forward(model, base, metric)[0])
            values, senders = _forward(model, cf, metric)
            found[1].append(values)
            for j, edges_out in enumerate(outside):
                found[j + 2].append(patched(model, base, senders, metric, edges_out))
    m_base, m_cf, *values = [float(torch.cat(each).mean()) for each in found]
    normal = [(v - m_cf) / (m_base - m_cf) for v in values]
    x = [k / total for k in ks]
    area = sum((x[i + 1] - x[i]) * (normal[i + 1] + normal[i]) / 2 for i in range(len(x) - 1))
    return Curve(tuple(ks), tuple(values), tuple(normal), m_base, m_cf, area)
