"""Edge attribution (EAP-IG, Hanna et al. 2024) and the faithfulness of its circuits.

The graph is the residual decomposition of a decoder: **senders** are the embeddings (the
residual stream entering block 0, Gemma's ``√hidden`` scale included), every head's output and
every MLP's output; **receivers** (``heads``, the default, as Hanna et al. and MIB) are every
query head's query input ``L3H1.q``, every key/value head's key and value inputs ``L3KV0.k``,
``L3KV0.v`` (per key/value head under grouped-query attention; ``KVg`` is head ``g`` without
it), each layer's MLP input and the logits. A head's input is its own copy of the residual
stream entering the block, read through ``input_layernorm`` and that head's rows of
``q_proj`` (``k_proj``, ``v_proj``): the projections' outputs are rebuilt head by head
(``_qkv_hooks``), so patching ``u → L3H1.q`` moves head 1's query alone; Gemma-3's per-head
``q_norm``/``k_norm`` run after, inside the model. MLP and logits receivers are the inputs of
the pre-MLP norm and the final norm. ``blocks`` keeps one receiver per attention block
(``L3.attention``: ``input_layernorm``'s input, all its heads at once; MIB's coarse set), at
``heads + 2 · kv_heads`` times less gradient memory. A receiver's input is the sum of the
outputs of the senders before it, so an edge ``u → v`` is one term of that sum.

**Senders on the two layouts.** Pre-norm (Llama, Qwen2: ``input_layernorm`` before attention,
``post_attention_layernorm`` before the MLP): a head's output is its ``o_proj`` input slice
through its columns of ``o_proj`` (``a_h = W_h z_h``, as the head sweep's ``attention_premix``
units are), an MLP's is the MLP's output. Sandwich (Gemma-2, Gemma-3: ``input_layernorm`` and
``pre_feedforward_layernorm`` before the sublayers, ``post_attention_layernorm`` and
``post_feedforward_layernorm`` on their outputs, before the residual add): the attention adds
``N(A) = A · γ / rms(A)`` to the stream, ``A = Σ_h a_h``, and head ``h``'s output is its share
``u_h = a_h · γ / rms(A)``, the norm's scale ``γ / rms(A)`` (``rms`` with the norm's ``eps``)
taken from the forward the head runs in; an MLP's output is ``post_feedforward_layernorm``'s.
In every forward a layer's heads sum to exactly what its attention adds to the stream, so a
receiver's input is still the sum of the senders before it. Each sender's value is read in the
run it belongs to: ``u_cf`` in the counterfactual's forward (its scale), ``u_base`` in the
base's, ``u_now`` in the patched forward itself (the scale of the patched run). The shared
scale couples a layer's heads: a head's share depends on its siblings through ``rms(A)``, a
coupling inside the sender layer (no edge joins two heads of one layer), not a term of any
receiver's sum; a patch into ``L3.attention`` moves all of ``L3``'s heads and their scale.

**Score.** ``s(u → v) = Σ_pos (u_cf − u_base) · ḡ_v``, ``ḡ_v`` the gradient of the metric with
respect to ``v``'s input alone (a zero leaf added where only ``v`` reads it: the input of ``v``'s
norm), averaged over ``steps`` forwards whose embeddings lie ``k/steps`` of the way from the
base's to the counterfactual's (``k = 0 … steps−1``; ``steps: 1`` is EAP, the node step's
``ig`` convention). Per row; tables hold the mean over rows. It is the first-order estimate of
**exact edge patching**: the base forward with ``u_cf − u_base`` added to ``v``'s input alone
(every other receiver, ``u``'s own later receivers included, reads the base's sum), the
metric's change. On both layouts the two agree on what ``u_cf`` and ``u_base`` are: the
gradient never passes through a sender's definition, only through ``v``'s input.

**Faithfulness.** A circuit is the top-``k`` edges by ``|score|``; every other edge is patched
from the counterfactual: in the base forward, each receiver's input gets, for each edge into it
outside the circuit, ``u_cf − u_now`` added (``u_now`` the sender's output in this same patched
forward, as Hanna et al.'s and MIB's evaluation take it; on the sandwich layout with that
forward's post-norm scale). With no edge kept the forward is the counterfactual's, with every
edge kept it is the base's (on both layouts the senders sum to the stream in every forward), so
the normalised score ``(m(circuit) − m(cf)) / (m(base) − m(cf))`` (row means) runs from 0 to 1;
its area is the trapezoid over ``k / |edges|``.

**GPT-2's layout** (``transformer.h``; ``ln_1``, a fused ``c_attn``, ``c_proj``, ``ln_2``,
``mlp``, ``ln_f``; ``Conv1D`` weights stored ``(in, out)``): the embeddings are the stream
entering block 0 (``wte + wpe``), a head's output is its slice of ``c_proj``'s input through its
rows of the weight, without the bias: ``c_proj``'s bias is the same in every forward, a constant
of the stream no sender owns, so every difference of sender outputs is unchanged and the curve's
ends stay exact. Per-head receivers rebuild ``c_attn``'s output slice by slice (query heads, key
heads, value heads) from ``ln_1`` of each slice's own copy (``_fused_qkv_hooks``).

Other layouts are refused (OLMo-2's post-norms with no input norms, cross-attention blocks, an
``o_proj`` with a bias on the Llama-style layouts, which no head owns). The final logit softcap
and attention softcaps, sliding windows and the attention implementation need nothing: the
forwards are the model's own. MIB's circuit scores over these curves: ``mib``.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Callable

from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from torch import nn

Metric = Callable[["torch.Tensor"], "torch.Tensor"]  # last-position logits (rows, vocab) -> (rows,)
# Sandwich blocks: the norms in front of and behind each sublayer.
_SANDWICH = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm")


@dataclasses.dataclass(frozen=True)
class Graph:
    """Sender and receiver labels (head-sweep style: ``L3H1``) and which edges exist."""

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    mask: torch.Tensor  # (senders, receivers) bool: the sender runs before the receiver

    def edges(self) -> list[tuple[int, int]]:
        return [tuple(e) for e in self.mask.nonzero().tolist()]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one model's senders and receivers are read: its blocks, its final norm, its head
    shape and its kind: ``pre_norm`` (Llama, Qwen2), ``sandwich`` (Gemma-2, Gemma-3: post-norms
    on the sublayer outputs) or ``gpt2`` (``transformer.h``: LayerNorms ``ln_1``, ``ln_2``, one
    fused ``c_attn`` for queries, keys and values, ``Conv1D`` projections)."""

    layers: nn.ModuleList
    final: nn.Module
    heads: int
    head_dim: int
    kind: str
    kv_heads: int

    @property
    def sandwich(self) -> bool:
        return self.kind == "sandwich"

    def attention_norm(self, layer: nn.Module) -> nn.Module:
        """The norm whose input is ``layer``'s attention receivers' stream."""
        return layer.ln_1 if self.kind == "gpt2" else layer.input_layernorm

    def pre_mlp(self, layer: nn.Module) -> nn.Module:
        """The norm whose input is ``layer``'s MLP receiver."""
        names = {"gpt2": "ln_2", "sandwich": "pre_feedforward_layernorm"}
        return getattr(layer, names.get(self.kind, "post_attention_layernorm"))

    def mlp_output(self, layer: nn.Module) -> nn.Module:
        """The module whose output is ``layer``'s MLP sender."""
        return layer.post_feedforward_layernorm if self.sandwich else layer.mlp

    def out_projection(self, layer: nn.Module) -> nn.Module:
        """The projection whose input holds ``layer``'s heads side by side."""
        return layer.attn.c_proj if self.kind == "gpt2" else layer.self_attn.o_proj

    def out_weight(self, module: nn.Module) -> torch.Tensor:
        """``out_projection``'s weight as ``(hidden, heads · head_dim)`` (``Conv1D`` stores
        it transposed)."""
        return module.weight.T if self.kind == "gpt2" else module.weight


def _gpt2_layout(model, transformer) -> Layout:
    """GPT-2's blocks at ``transformer.h``: each head's share of ``c_proj`` is a sender, its
    bias a constant of the stream (the same in every forward)."""
    name, blocks = type(model).__name__, transformer.h
    children = {child for child, _ in blocks[0].named_children()}
    if not {"ln_1", "attn", "ln_2", "mlp"} <= children or not hasattr(transformer, "ln_f") \
            or not hasattr(blocks[0].attn, "c_attn"):
        raise ValueError(f"{name}: edge attribution on transformer.h needs GPT-2's blocks "
                         "(ln_1, attn.c_attn, attn.c_proj, ln_2, mlp) and a final ln_f")
    if getattr(model.config, "add_cross_attention", False):
        raise ValueError(f"{name}: cross-attention blocks are no decoder's edges")
    config = model.config
    heads = config.num_attention_heads
    return Layout(blocks, transformer.ln_f, heads, config.hidden_size // heads, "gpt2", heads)


def _layout(model) -> Layout:
    """The model's layout, refused off the pre-norm, sandwich and GPT-2 layouts (module
    docstring)."""
    name, inner = type(model).__name__, getattr(model, "model", None)
    transformer = getattr(model, "transformer", None)
    if inner is None and transformer is not None and hasattr(transformer, "h"):
        return _gpt2_layout(model, transformer)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "norm"):
        raise ValueError(f"{name}: edge attribution needs decoder blocks at model.layers and a "
                         "final norm at model.norm (or GPT-2's at transformer.h)")
    children = {child for child, _ in layers[0].named_children()}
    sandwich = set(_SANDWICH) <= children
    pre_norm = {"input_layernorm", "post_attention_layernorm"} <= children and not \
        children & {"pre_feedforward_layernorm", "post_feedforward_layernorm"}
    if not (sandwich or pre_norm):
        raise ValueError(f"{name}: edge attribution needs a pre-norm layout (input_layernorm, "
                         f"post_attention_layernorm) or a sandwich one ({', '.join(_SANDWICH)})")
    if getattr(layers[0].self_attn.o_proj, "bias", None) is not None:
        raise ValueError(f"{name}: o_proj has a bias, which no head's output owns")
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return Layout(layers, inner.norm, heads, head_dim, "sandwich" if sandwich else "pre_norm",
                  kv_heads)


def graph(model, receivers: str = "heads") -> Graph:
    """The model's senders, receivers and edges."""
    found = _layout(model)
    return graph_of(len(found.layers), found.heads, found.kv_heads, receivers)


def _attention_receivers(l: int, heads: int, kv_heads: int, receivers: str) -> list[str]:
    """Layer ``l``'s attention receivers in index order: each query head's query input, each
    key/value head's key input, then its value input (``heads``), or the block's (``blocks``)."""
    if receivers == "blocks":
        return [f"L{l}.attention"]
    if receivers != "heads":
        raise ValueError(f"receivers: heads or blocks, got {receivers!r}")
    return ([f"L{l}H{h}.q" for h in range(heads)] + [f"L{l}KV{g}.k" for g in range(kv_heads)]
            + [f"L{l}KV{g}.v" for g in range(kv_heads)])


def graph_of(layers: int, heads: int, kv_heads: int | None = None,
             receivers: str = "heads") -> Graph:
    """The graph of a model of ``layers`` blocks of ``heads`` query heads sharing ``kv_heads``
    key/value heads (default ``heads``) (its config's shape alone: ``explain --traces`` counts
    the edges with no weights); one graph for both layouts."""
    senders, order = ["embeddings"], [(-1, 0)]
    for l in range(layers):
        senders += [f"L{l}H{h}" for h in range(heads)] + [f"L{l}MLP"]
        order += [(l, 0)] * heads + [(l, 1)]
    names, places = [], []
    for l in range(layers):
        attention = _attention_receivers(l, heads, kv_heads or heads, receivers)
        names += attention + [f"L{l}.mlp"]
        places += [(l, 0)] * len(attention) + [(l, 1)]
    receivers = names
    receivers.append("logits")
    places.append((layers, 0))
    mask = torch.tensor([[s < r for r in places] for s in order])
    return Graph(tuple(senders), tuple(receivers), mask)


def _gain(norm: nn.Module) -> tuple[torch.Tensor, float]:
    """An RMSNorm's ``(γ, eps)`` with ``N(x) = x · γ / sqrt(mean(x²) + eps)``, ``γ`` read off
    ``N(1)`` (Gemma's ``1 + weight`` and Llama's ``weight`` alike), in float32."""
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    if eps is None:
        raise ValueError(f"{type(norm).__name__}: a post-norm with no eps is no RMSNorm")
    with torch.no_grad():
        ones = torch.ones(norm.weight.shape[-1], device=norm.weight.device)
        return norm(ones).float() * (1.0 + eps) ** 0.5, float(eps)


def _head_hooks(found: Layout, l: int, senders: list) -> list:
    """Layer ``l``'s head senders: ``W_h z_h`` per head (pre-norm), or each one's share of the
    post-norm's output with this forward's scale (sandwich)."""
    layer, heads, head_dim = found.layers[l], found.heads, found.head_dim
    pending: list = []

    def on_heads(module, args):
        z = args[0].unflatten(-1, (heads, head_dim))
        w = found.out_weight(module).unflatten(1, (heads, head_dim))  # (d, heads, head_dim)
        each = torch.einsum("bshk,dhk->hbsd", z, w)
        if found.sandwich:
            pending[:] = [each]
        else:
            senders.extend(each.unbind(0))

    handles = [found.out_projection(layer).register_forward_pre_hook(on_heads)]
    if found.sandwich:
        gain, eps = _gain(layer.post_attention_layernorm)

        def on_post_norm(module, args, output):
            mixed = args[0].float()  # Σ_h a_h, what the norm reads
            scale = gain * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + eps)
            senders.extend((pending.pop() * scale).to(output.dtype).unbind(0))
        handles.append(layer.post_attention_layernorm.register_forward_hook(on_post_norm))
    return handles


def _stream_hook(senders: list, embeddings: torch.Tensor | None) -> Callable:
    """Block 0's input (the embeddings as the residual stream holds them) as the first
    sender, replaced by ``embeddings`` when given."""
    def hook(module, args, kwargs):
        value = args[0] if args else kwargs["hidden_states"]
        value = value if embeddings is None else embeddings
        senders.append(value)
        if args:
            return (value,) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": value}
    return hook


def _qkv_hooks(found: Layout, l: int, first: int, shift: Callable, senders: list) -> list:
    """Layer ``l``'s per-head receivers (``heads``): ``q_proj``'s output rebuilt head by head,
    head ``h``'s query rows applied to ``input_layernorm(shift(first + h, x))``, ``x`` the
    stream entering the block; ``k_proj``'s and ``v_proj``'s likewise per key/value head, their
    receivers after the queries'. The norms behind the projections (Gemma-3's ``q_norm``,
    ``k_norm``) act per head on what this returns."""
    layer, stream = found.layers[l], {}
    norm = layer.input_layernorm

    def on_norm(module, args):
        stream["x"] = args[0]

    def rebuilt(start: int, count: int):
        def hook(module, args, output):
            x = stream["x"]
            inputs = torch.stack([shift(start + i, x, senders) for i in range(count)])
            normed = norm.forward(inputs)  # the module's forward: no hook runs twice
            weight = module.weight.unflatten(0, (count, -1))  # (count, head_dim, d)
            each = torch.einsum("cbsd,ckd->bsck", normed, weight)
            if module.bias is not None:
                each = each + module.bias.unflatten(0, (count, -1))
            return each.flatten(-2).to(output.dtype)
        return hook

    attention, heads, kv = layer.self_attn, found.heads, found.kv_heads
    return [norm.register_forward_pre_hook(on_norm),
            attention.q_proj.register_forward_hook(rebuilt(first, heads)),
            attention.k_proj.register_forward_hook(rebuilt(first + heads, kv)),
            attention.v_proj.register_forward_hook(rebuilt(first + heads + kv, kv))]


def _fused_qkv_hooks(found: Layout, l: int, first: int, shift: Callable, senders: list) -> list:
    """GPT-2's per-head receivers: ``c_attn``'s output (queries, keys, values side by side,
    each ``heads`` slices of ``head_dim`` columns) rebuilt slice by slice, slice ``c`` from
    ``ln_1(shift(first + c, x))`` through its columns of the ``Conv1D`` weight and bias: query
    heads, then key heads, then value heads, the receivers' own order."""
    layer, stream = found.layers[l], {}
    norm, count = layer.ln_1, 3 * found.heads

    def on_norm(module, args):
        stream["x"] = args[0]

    def rebuilt(module, args, output):
        x = stream["x"]
        inputs = torch.stack([shift(first + c, x, senders) for c in range(count)])
        normed = norm.forward(inputs)  # the module's forward: no hook runs twice
        weight = module.weight.T.unflatten(0, (count, -1))  # (count, head_dim, d)
        each = torch.einsum("cbsd,ckd->bsck", normed, weight) + module.bias.unflatten(0, (count, -1))
        return each.flatten(-2).to(output.dtype)

    return [norm.register_forward_pre_hook(on_norm),
            layer.attn.c_attn.register_forward_hook(rebuilt)]


@contextlib.contextmanager
def _hooked(model, out: dict, embeddings: torch.Tensor | None, shift: Callable,
            receivers: str = "heads"):
    """Hooks for one forward: sender outputs into ``out['senders']`` as ``(rows, seq, d)``
    tensors in sender order; the embeddings replaced by ``embeddings`` when given; each
    receiver's input (its norm's input; per head under ``heads``) passed through
    ``shift(index, input, senders)``."""
    found = _layout(model)
    senders = out.setdefault("senders", [])
    width = len(_attention_receivers(0, found.heads, found.kv_heads, receivers))

    def on_receiver(index):
        def hook(module, args):
            return (shift(index, args[0], senders),) + tuple(args[1:])
        return hook

    def on_mlp(module, args, output):
        senders.append(output)

    handles = [found.layers[0].register_forward_pre_hook(_stream_hook(senders, embeddings),
                                                         with_kwargs=True)]
    for l, layer in enumerate(found.layers):
        first = (width + 1) * l
        if receivers == "blocks":
            handles.append(found.attention_norm(layer).register_forward_pre_hook(
                on_receiver(first)))
        else:
            per_head = _fused_qkv_hooks if found.kind == "gpt2" else _qkv_hooks
            handles += per_head(found, l, first, shift, senders)
        handles += _head_hooks(found, l, senders)
        handles.append(found.pre_mlp(layer).register_forward_pre_hook(on_receiver(first + width)))
        handles.append(found.mlp_output(layer).register_forward_hook(on_mlp))
    handles.append(found.final.register_forward_pre_hook(
        on_receiver((width + 1) * len(found.layers))))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _forward(model, batch: dict, metric: Metric, embeddings=None, shift=None,
             receivers: str = "heads") -> tuple:
    """``(metric per row, sender outputs)`` of one hooked forward (logits at the last
    position alone: the metric reads no other)."""
    out: dict = {}
    with _hooked(model, out, embeddings, shift or (lambda i, x, s: x), receivers):
        logits = model(**batch, logits_to_keep=1).logits[:, -1]
    return metric(logits), out["senders"]


def scores(model, base: dict, counterfactual: dict, metric: Metric, steps: int = 1,
           receivers: str = "heads") -> torch.Tensor:
    """``(rows, senders, receivers)`` EAP-IG edge scores (zero where no edge); ``base`` and
    ``counterfactual`` tokenizer batches of equal shape and mask; ``receivers``: ``heads``
    (each head's query, key and value input) or ``blocks`` (each attention block's input)."""
    return scored(model, base, counterfactual, metric, steps, receivers)[0]


def scored(model, base: dict, counterfactual: dict, metric: Metric, steps: int = 1,
           receivers: str = "heads") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``scores`` with the metric per row of the base's and the counterfactual's own
    forwards (the two the scores are taken from)."""
    found = graph(model, receivers)
    with torch.no_grad():
        m_cf, cf = _forward(model, counterfactual, metric)
        m_base, at_base = _forward(model, base, metric)
    delta = torch.stack([c - b for c, b in zip(cf, at_base)])  # (senders, rows, seq, d)
    grads = None
    for k in range(steps):
        embeddings = at_base[0] + (k / steps) * (cf[0] - at_base[0])
        leaves = [torch.zeros_like(embeddings, requires_grad=True)
                  for _ in found.receivers]
        values, _ = _forward(model, base, metric, embeddings,
                             lambda i, x, s: x + leaves[i], receivers)
        step = torch.autograd.grad(values.sum(), leaves)
        grads = step if grads is None else [g + h for g, h in zip(grads, step)]
    mean = torch.stack(grads) / steps  # (receivers, rows, seq, d)
    every = torch.einsum("ubsd,vbsd->buv", delta.float(), mean.float())
    return every * found.mask, m_base, m_cf


def patched(model, base: dict, counterfactual: dict | list, metric: Metric,
            outside: torch.Tensor, receivers: str = "heads") -> torch.Tensor:
    """The metric per row with every edge in ``outside`` ``(senders, receivers)`` patched from
    the counterfactual: each receiver's input gets ``Σ_u (u_cf − u_now)`` over those edges.
    ``counterfactual``: its batch, or its sender outputs already taken."""
    with torch.no_grad():
        cf = counterfactual
        if isinstance(cf, dict):
            cf = _forward(model, counterfactual, metric, receivers=receivers)[1]

        def shift(index, x, now):
            senders = outside[:, index].nonzero().flatten().tolist()
            if not senders:
                return x
            return x + (torch.stack([cf[u] for u in senders]).sum(0)
                        - torch.stack([now[u] for u in senders]).sum(0))
        values, _ = _forward(model, base, metric, shift=shift, receivers=receivers)
    return values


@dataclasses.dataclass(frozen=True)
class Curve:
    """Faithfulness against circuit size: ``ks``, the metric's row mean at each, the
    normalised score at each and the area under it over ``k / |edges|`` (None throughout
    where the two ends agree: nothing to normalise by); ``gap_se``: the standard error of
    the per-row gap ``m(base) − m(cf)`` (None with one row)."""

    ks: tuple[int, ...]
    metric: tuple[float, ...]
    faithfulness: tuple[float | None, ...]
    base: float
    counterfactual: float
    area: float | None
    gap_se: float | None = None


@dataclasses.dataclass(frozen=True)
class Ends:
    """One evaluation's two ends per row (all windows in order) and each circuit's row mean."""

    base: torch.Tensor
    counterfactual: torch.Tensor
    values: tuple[float, ...]

    def normalised(self, values) -> list[float | None]:
        m_base, m_cf = float(self.base.mean()), float(self.counterfactual.mean())
        if m_base == m_cf:
            return [None] * len(values)
        return [(v - m_cf) / (m_base - m_cf) for v in values]

    def gap_se(self) -> float | None:
        gap = (self.base - self.counterfactual).double()
        return float(gap.std() / len(gap) ** 0.5) if len(gap) > 1 else None


def circuit(mean_scores: torch.Tensor, mask: torch.Tensor, k: int,
            signed: bool = False) -> torch.Tensor:
    """The top-``k`` edges by ``|score|`` (``signed``: by score, largest first) as a
    ``(senders, receivers)`` bool mask."""
    key = mean_scores if signed else mean_scores.abs()
    flat = torch.where(mask, key, torch.full_like(mean_scores, -torch.inf)).flatten()
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[flat.argsort(descending=True, stable=True)[:k]] = True
    return keep.view_as(mask) & mask


def evaluate(model, windows: list[tuple[dict, dict, Metric]], outside: list[torch.Tensor],
             receivers: str = "heads") -> Ends:
    """Per window the base's forward, the counterfactual's and one patched base forward per
    mask of ``outside`` (the edges patched from the counterfactual): the two ends per row and
    each circuit's row mean over all windows."""
    found: list[list[torch.Tensor]] = [[] for _ in range(len(outside) + 2)]
    with torch.no_grad():
        for base, cf, metric in windows:
            found[0].append(_forward(model, base, metric, receivers=receivers)[0])
            values, senders = _forward(model, cf, metric, receivers=receivers)
            found[1].append(values)
            for j, edges_out in enumerate(outside):
                found[j + 2].append(patched(model, base, senders, metric, edges_out,
                                            receivers))
    m_base, m_cf, *values = [torch.cat(each) for each in found]
    return Ends(m_base, m_cf, tuple(float(v.mean()) for v in values))


def curve_of(ends: Ends, ks: list[int], values: list[float], total: int) -> Curve:
    """The curve of circuits of sizes ``ks`` whose metric row means are ``values``."""
    normal = ends.normalised(values)
    x = [k / total for k in ks]
    area = None if None in normal else sum(
        (x[i + 1] - x[i]) * (normal[i + 1] + normal[i]) / 2 for i in range(len(x) - 1))
    return Curve(tuple(ks), tuple(values), tuple(normal), float(ends.base.mean()),
                 float(ends.counterfactual.mean()), area, ends.gap_se())


def faithfulness(model, windows: list[tuple[dict, dict, Metric]], mean_scores: torch.Tensor,
                 ks: list[int], receivers: str = "heads") -> Curve:
    """The curve over ``ks`` for the circuits ``mean_scores`` (senders, receivers) ranks;
    ``windows``: ``(base, counterfactual, metric)`` per window of rows, row means over all."""
    mask = graph(model, receivers).mask
    ends = evaluate(model, windows, [mask & ~circuit(mean_scores, mask, k) for k in ks],
                    receivers)
    return curve_of(ends, ks, list(ends.values), int(mask.sum()))
