"""Live places: an address's tensor inside a running nnterp forward, fetched and put back.

Called only from inside the walk's trace, in forward order. ``REACH`` is keyed by the
vocabulary's accessor column (``vocab.COMPONENTS[c]["accessor"]``, and the extra accessors
of docs/format.md §5.4): each entry says how to fetch and store that tensor, through nnterp's
standardized accessors or the few submodule names nnterp does not standardize (the
attention out-projection, the MLP nonlinearity and down-projection, the norm in front of the
MLP, the sandwich norms). The address itself (component, layer, widths) comes from the plan.
Values are handed over in the seam's layouts: ``(batch, seq, d)`` at a module boundary,
``(batch, heads, seq, head_dim)`` inside attention, ``(batch, heads, q, keys)`` for a
pattern. It never gathers or writes a window; the seam does.

``attention_output`` and ``mlp_output`` are what the residual stream receives: on
sandwich-norm blocks (Gemma-2) the outputs of the norms behind each sublayer, so
``block_mid = block_input + attention_output`` and ``block_output = block_mid + mlp_output``
on every family.

``block_mid`` (the residual after attention) is a sum inside the block's forward, not a
module boundary, so no tracer place holds it. A write there is made of two exact halves: the
norm in front of the MLP is fed the written value, and the block's output is rebuilt as that
value plus ``mlp_output``, once that is computed (``Places.settle``).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from causalab.compile.plan import Address
from causalab.document import vocab
from causalab.errors import RunError

# In a trace, a value (nnsight proxy) and a module (envoy) have no type a signature can name.
Proxy = Envoy = Any

_OUT_PROJECTION = ("o_proj", "c_proj", "out_proj", "dense")
_ACTIVATION = ("act_fn", "act", "activation_fn", "activation")
_DOWN_PROJECTION = ("down_proj", "c_proj", "fc2", "dense_4h_to_h")
_PRE_MLP_NORM = ("post_attention_layernorm", "ln_2")
# Sandwich-norm blocks (Gemma-2/3, OLMo-2) normalise each sublayer's output before the
# residual adds it; there the attention's post-norm carries the name llama gives its pre-MLP norm.
_POST_MLP_NORM = "post_feedforward_layernorm"
_POST_ATTENTION_NORM = "post_attention_layernorm"
_SANDWICH_PRE_MLP_NORM = "pre_feedforward_layernorm"
_INTERIOR_ARGUMENT = {"attention_query": 1, "attention_key": 2}
# Where block_output sorts in forward order (docs/format.md §5.2): a block_mid write settles before it.
_BLOCK_OUTPUT_RANK = vocab.COMPONENTS["block_output"]["order"][1]


class Places:
    """One forward's access to its addresses; holds the few values several taps share.

    ``current[key]`` is an address's value as the latest write left it, so a read after a
    write at the same address sees the write without asking the tracer twice; ``original``
    is the value before the first write (f₀).
    """

    def __init__(self, model: Envoy, nested_layers: frozenset, head_rows: int | None = None):
        self.model = model
        self.nested_layers = nested_layers
        self.head_rows = head_rows
        self.current: dict = {}
        self.original: dict = {}
        self.written_logits: Proxy = None
        self._interface: dict = {}
        self._unsettled: set[int] = set()
        self._head: Proxy = None

    def get(self, address: Address) -> Proxy:
        key = (address.component, address.layer)
        if key not in self.current:
            self.current[key] = _fetch(self, address)
            self.original[key] = self.current[key]
        return self.current[key]

    def put(self, address: Address, value: Proxy) -> None:
        if address.read_only:
            raise RunError((address.component,), f"{address.component} cannot be written here")
        self.current[(address.component, address.layer)] = value
        if address.component == "logits":
            # Nothing downstream of the logits to store into: the written value is what a
            # decode step's next token is chosen from.
            self.written_logits = value
        _store(self, address, value)
        if address.component == "block_mid":
            self._unsettled.add(address.layer)

    def settle(self, order: tuple | None = None) -> None:
        """Finish every ``block_mid`` write whose block output comes at or before ``order``
        (all of them when None): the output becomes the written residual plus the MLP
        branch's contribution, so the stream after the block carries the write.

        Call it before each tap and once after the last: the block output must be set
        before the tracer moves past it.
        """
        for layer in sorted(self._unsettled):
            if order is not None and tuple(order) < (layer, _BLOCK_OUTPUT_RANK):
                continue
            self._unsettled.discard(layer)
            mid = self.current[("block_mid", layer)]
            output = _place("block_output", layer)
            value = mid + _mlp_branch(self, layer)
            # The settled output is what this forward's block leaves before any write there.
            self.original.setdefault(("block_output", layer), value)
            self.put(output, value)

    def head_output(self) -> Proxy:
        """The output head's value, asked of the tracer once for every tap computed from it.

        With ``head_rows`` the forward keeps the last column's logits alone
        (``logits_to_keep=1``): the head is fed those rows padded with zero rows to
        ``HEAD_ROWS``, and the value is cut back to ``(head_rows, 1, vocab)``.
        """
        if self._head is None:
            head = self.model.lm_head
            if self.head_rows is None:
                self._head = head.output
            else:
                _set_first_input(head, _padded(_first_input(head), HEAD_ROWS))
                self._head = head.output[:self.head_rows]
        return self._head

    def put_head(self, value: Proxy) -> None:
        """A write at the head's output: the logits are then computed from ``value``."""
        self.model.lm_head.output = value
        self._head = value

    def interface(self, layer: int) -> Proxy:
        """The ``attention_interface(`` call of block ``layer`` (docs/format.md §18).

        When the forward also taps a pattern at this layer, the call's own source is opened
        first: it has to be instrumented before the call starts, not once it is running.
        """
        if layer not in self._interface:
            call = self.model.attentions[layer].source.attention_interface_0
            if layer in self.nested_layers:
                call.source
            self._interface[layer] = call
        return self._interface[layer]


# The fewest rows a last-column head is computed over. On fewer rows the BLAS sums each
# logit in another order than it does over every column (measured up to 1e-4 at d=2048
# below 512 rows); from 512 rows on, each row's logits are the all-column head's, bit for bit.
HEAD_ROWS = 512


def _padded(value: Proxy, rows: int) -> Proxy:
    """``value`` with zero rows appended up to ``rows`` rows (unchanged when it has as many)."""
    import torch

    if value.shape[0] >= rows:
        return value
    return torch.cat([value, value.new_zeros((rows - value.shape[0], *value.shape[1:]))])


def _place(component: str, layer: int) -> Address:
    """A bare address the engine itself needs (no selection, no width), from its vocab row."""
    row = vocab.COMPONENTS[component]
    return Address(component=component, layer=layer, accessor=row["accessor"],
                   order=(layer, row["order"][1]), seq_axis=row["seq_axis"], width=None,
                   full_width=None)


def _mlp_branch(places: Places, layer: int) -> Proxy:
    """What block ``layer`` adds to its residual after the MLP, as the forward computed it."""
    return places.get(_place("mlp_output", layer))


def _children(envoy: Envoy) -> dict:
    return dict(envoy._module.named_children())


def _child(envoy: Envoy, names: tuple[str, ...], what: str, address: Address) -> Proxy:
    children = _children(envoy)
    for name in names:
        if name in children:
            return getattr(envoy, name)
    raise RunError((address.component,), f"no {what} module found among {sorted(children)}")


def _first_input(envoy: Envoy) -> Proxy:
    args, kwargs = envoy.inputs
    return args[0] if args else next(iter(kwargs.values()))


def _set_first_input(envoy: Envoy, value: Proxy) -> None:
    args, kwargs = envoy.inputs
    if args:
        envoy.inputs = ((value, *args[1:]), kwargs)
    else:
        first = next(iter(kwargs))
        envoy.inputs = ((), {**kwargs, first: value})


def _softcapped(model: Envoy, logits: Proxy) -> Proxy:
    import torch

    cap = getattr(model._model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


class Reach(NamedTuple):
    """``fetch(places, address) -> value`` and ``store(places, address, value)`` (None: read-only)."""

    fetch: Callable[[Places, Address], Proxy]
    store: Callable[[Places, Address, Proxy], None] | None


def _boundary(locate: Callable[[Places, Address], tuple[Envoy, str]]) -> Reach:
    """A tensor on a submodule's boundary: ``locate`` gives (envoy, "input"|"output")."""
    def fetch(places: Places, address: Address) -> Proxy:
        envoy, side = locate(places, address)
        return _first_input(envoy) if side == "input" else envoy.output

    def store(places: Places, address: Address, value: Proxy) -> None:
        envoy, side = locate(places, address)
        if side == "input":
            _set_first_input(envoy, value)
        else:
            envoy.output = value
    return Reach(fetch, store)


def _standard(accessor: str) -> Reach:
    """One of nnterp's per-layer standardized accessors (``layers_output[l]``)."""
    def fetch(places: Places, address: Address) -> Proxy:
        return getattr(places.model, accessor)[address.layer]

    def store(places: Places, address: Address, value: Proxy) -> None:
        getattr(places.model, accessor)[address.layer] = value
    return Reach(fetch, store)


def _input_of(stack: str) -> Reach:
    """The first input of a block's attention or MLP module (``attentions``/``mlps``)."""
    return _boundary(lambda places, address: (getattr(places.model, stack)[address.layer], "input"))


def _sublayer(accessor: str, post_norm: str) -> Reach:
    """A sublayer's output as the residual receives it: the post-norm's output on a
    sandwich-norm block, nnterp's standardized accessor elsewhere."""
    plain = _standard(accessor)

    def locate(places: Places, address: Address) -> Proxy:
        block = places.model.layers[address.layer]
        return getattr(block, post_norm) if _POST_MLP_NORM in _children(block) else None

    def fetch(places: Places, address: Address) -> Proxy:
        norm = locate(places, address)
        return plain.fetch(places, address) if norm is None else norm.output

    def store(places: Places, address: Address, value: Proxy) -> None:
        norm = locate(places, address)
        if norm is None:
            plain.store(places, address, value)
        else:
            norm.output = value
    return Reach(fetch, store)


def _pre_mlp(places: Places, address: Address) -> tuple[Envoy, str]:
    """(envoy, side) holding ``block_mid``: the input of the norm in front of the MLP, or of
    the MLP itself on a post-norm block that has none."""
    model = places.model
    block = model.layers[address.layer]
    if _POST_MLP_NORM not in _children(block):
        return _child(block, _PRE_MLP_NORM, "norm in front of the MLP", address), "input"
    if _SANDWICH_PRE_MLP_NORM in _children(block):
        return getattr(block, _SANDWICH_PRE_MLP_NORM), "input"
    return model.mlps[address.layer], "input"


def _z(places: Places, address: Address, value: Proxy = None) -> Proxy:
    """The kernel's return value, held by transformers as ``(batch, seq, heads, head_dim)``."""
    call = places.interface(address.layer)
    if value is None:
        z = call.output[0]
        return z.transpose(1, 2) if address.seq_axis == 2 else z.flatten(2)
    output = call.output
    z = output[0]
    value = value.transpose(1, 2) if address.seq_axis == 2 else value.reshape(z.shape)
    call.output = (value, *output[1:]) if isinstance(output, tuple) else value
    return None


def _interior(places: Places, address: Address, value: Proxy = None) -> Proxy:
    call = places.interface(address.layer)
    index = _INTERIOR_ARGUMENT[address.component]
    args, kwargs = call.inputs
    if value is None:
        return args[index]
    args = list(args)
    args[index] = value
    call.inputs = (tuple(args), kwargs)
    return None


def _scores(places: Places, address: Address, value: Proxy = None) -> Proxy:
    op = places.interface(address.layer).source.nn_functional_softmax_0
    if value is None:
        return op.input
    op.input = value
    return None


def _call(part: Callable) -> Reach:
    """A tensor inside the attention call: ``part(places, address[, value])`` does both."""
    return Reach(part, part)


def _probabilities() -> Reach:
    """nnterp's pattern accessor; the interface is opened first, in case its source is needed."""
    plain = _standard("attention_probabilities")

    def fetch(places: Places, address: Address) -> Proxy:
        places.interface(address.layer)
        return plain.fetch(places, address)
    return Reach(fetch, plain.store)


def _whole(name: str, side: str) -> Reach:
    """A whole-model module's input or output (``embed_tokens``, ``ln_final``, ``lm_head``)."""
    return _boundary(lambda places, address: (getattr(places.model, name), side))


def _inside(stack: str, names: tuple[str, ...], what: str, side: str) -> Reach:
    """A submodule nnterp does not standardize, found by its usual names inside a block."""
    return _boundary(lambda places, address: (
        _child(getattr(places.model, stack)[address.layer], names, what, address), side))


def _logits_fetch(places: Places, address: Address) -> Proxy:
    return _softcapped(places.model, places.head_output())


def _head_store(places: Places, address: Address, value: Proxy) -> None:
    places.put_head(value)


def _logits_store(places: Places, address: Address, value: Proxy) -> None:
    """Nothing downstream of the logits to store into; ``Places.put`` keeps the value."""


def _probabilities_of_next(places: Places, address: Address) -> Proxy:
    return _logits_fetch(places, address).softmax(-1)


# accessor (vocab.COMPONENTS / vocab.EXTRA_ACCESSORS) -> how it is reached.
REACH: dict[str, Reach] = {
    "embeddings_input": _whole("embed_tokens", "input"),
    "embeddings_output": _whole("embed_tokens", "output"),
    "layers_input": _standard("layers_input"),
    "attentions_norm_output": _input_of("attentions"),
    "attentions_input": _input_of("attentions"),
    "interior.query": _call(_interior),
    "interior.key": _call(_interior),
    "interior.scores": _call(_scores),
    "attention_probabilities": _probabilities(),
    "interior.z": _call(_z),
    "attentions_premix": _inside("attentions", _OUT_PROJECTION, "attention out-projection", "input"),
    "attentions_output": _sublayer("attentions_output", _POST_ATTENTION_NORM),
    "layers_mid": _boundary(_pre_mlp),
    "mlps_norm_output": _input_of("mlps"),
    "mlps_input": _input_of("mlps"),
    "mlps_activation": _inside("mlps", _ACTIVATION, "MLP nonlinearity", "output"),
    "mlps_neurons": _inside("mlps", _DOWN_PROJECTION, "MLP down-projection", "input"),
    "mlps_output": _sublayer("mlps_output", _POST_MLP_NORM),
    "layers_output": _standard("layers_output"),
    "ln_final_output": _whole("ln_final", "output"),
    "lm_head_output": Reach(lambda places, address: places.head_output(), _head_store),
    "logits": Reach(_logits_fetch, _logits_store),
    "next_token_probs": Reach(_probabilities_of_next, None),
}


def _reach(address: Address) -> Reach:
    reach = REACH.get(address.accessor)
    if reach is None:
        raise RunError((address.component,),
                       f"{address.component} ({address.accessor}) cannot be reached on this model")
    return reach


def _fetch(places: Places, address: Address) -> Proxy:
    return _reach(address).fetch(places, address)


def _store(places: Places, address: Address, value: Proxy) -> None:
    reach = _reach(address)
    if reach.store is None:
        raise RunError((address.component,), f"{address.component} cannot be written here")
    reach.store(places, address, value)


def project_to_vocabulary(model: Envoy, hidden: Proxy) -> Proxy:
    """``view: "logits"``: a gathered residual through the final norm, the head and any
    softcap, ``(…, d) -> (…, vocab)``. The raw modules are called, not their envoys, so the
    projection leaves the tracer's call counts (and later taps at those modules) alone."""
    normed = model.ln_final._module(hidden)
    return _softcapped(model, model.lm_head._module(normed))
