"""Live places: an address's tensor inside a running nnterp forward, fetched and put back.

Called only from inside the walk's trace, in forward order. It knows nnterp's standardized
accessors and the few submodule names nnterp does not standardize (the attention
out-projection, the MLP nonlinearity and down-projection, the norm in front of the MLP); the
address itself (component, layer, widths) comes from the plan. Values are handed over in the
seam's layouts: ``(batch, seq, d)`` at a module boundary, ``(batch, heads, seq, head_dim)``
inside attention, ``(batch, heads, q, keys)`` for a pattern. It never gathers or writes a
window; the seam does.

``block_mid`` (the residual after attention) is a sum inside the block's forward, not a
module boundary, so no tracer place holds it. A write there is made of two exact halves: the
norm in front of the MLP is fed the written value, and the block's output is rebuilt as that
value plus ``mlp_output``, once that is computed (``Places.settle``).

``attention_output`` and ``mlp_output`` are what the residual stream receives: on
sandwich-norm blocks (Gemma-2) the outputs of the norms behind each sublayer, so
``block_mid = block_input + attention_output`` and ``block_output = block_mid + mlp_output``
on every family.
"""
from __future__ import annotations

from typing import Any

from causalab.compile.plan import Address
from causalab.errors import RunError

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
# Where block_output sorts in forward order (FORMAT §5.2): a block_mid write settles before it.
_BLOCK_OUTPUT_RANK = 60


class Places:
    """One forward's access to its addresses; holds the few values several taps share.

    ``current[key]`` is an address's value as the latest write left it, so a read after a
    write at the same address sees the write without asking the tracer twice; ``original``
    is the value before the first write (f₀).
    """

    def __init__(self, model: Any, nested_layers: frozenset):
        self.model = model
        self.nested_layers = nested_layers
        self.current: dict = {}
        self.original: dict = {}
        self.written_logits: Any = None
        self._interface: dict = {}
        self._unsettled: set[int] = set()

    def get(self, address: Address) -> Any:
        key = (address.component, address.layer)
        if key not in self.current:
            self.current[key] = _fetch(self, address)
            self.original[key] = self.current[key]
        return self.current[key]

    def put(self, address: Address, value: Any) -> None:
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
            output = _place("block_output", layer, "layers_output", _BLOCK_OUTPUT_RANK)
            value = mid + _mlp_branch(self, layer)
            # The settled output is what this forward's block leaves before any write there.
            self.original.setdefault(("block_output", layer), value)
            self.put(output, value)

    def interface(self, layer: int) -> Any:
        """The ``attention_interface(`` call of block ``layer`` (FORMAT §18.5).

        When the forward also taps a pattern at this layer, the call's own source is opened
        first: it has to be instrumented before the call starts, not once it is running.
        """
        if layer not in self._interface:
            call = self.model.attentions[layer].source.attention_interface_0
            if layer in self.nested_layers:
                call.source
            self._interface[layer] = call
        return self._interface[layer]


def _place(component: str, layer: int, accessor: str, rank: int) -> Address:
    """A bare address the engine itself needs (no selection, no width)."""
    return Address(component, layer, accessor, (layer, rank), 1, None, None)


def _mlp_branch(places: Places, layer: int) -> Any:
    """What block ``layer`` adds to its residual after the MLP, as the forward computed it."""
    return places.get(_place("mlp_output", layer, "mlps_output", 50))


def _sandwich(block: Any) -> bool:
    return _POST_MLP_NORM in dict(block._module.named_children())


def _branch_of(model: Any, address: Address) -> Any:
    """The envoy whose output the residual adds for ``attention_output``/``mlp_output`` on a
    sandwich-norm block (the post-norm), or None where that is the sublayer itself."""
    if address.component not in ("attention_output", "mlp_output"):
        return None
    block = model.layers[address.layer]
    if not _sandwich(block):
        return None
    name = _POST_ATTENTION_NORM if address.component == "attention_output" else _POST_MLP_NORM
    return getattr(block, name)


def _pre_mlp(model: Any, address: Address) -> tuple[Any, str]:
    """(envoy, side) holding ``block_mid``: the input of the norm in front of the MLP, or of
    the MLP itself on a post-norm block that has none."""
    block = model.layers[address.layer]
    if not _sandwich(block):
        return _child(block, _PRE_MLP_NORM, "norm in front of the MLP", address), "input"
    if _SANDWICH_PRE_MLP_NORM in dict(block._module.named_children()):
        return getattr(block, _SANDWICH_PRE_MLP_NORM), "input"
    return model.mlps[address.layer], "input"


def _child(envoy: Any, names: tuple[str, ...], what: str, address: Address) -> Any:
    children = dict(envoy._module.named_children())
    for name in names:
        if name in children:
            return getattr(envoy, name)
    raise RunError((address.component,), f"no {what} module found among {sorted(children)}")


def _first_input(envoy: Any) -> Any:
    args, kwargs = envoy.inputs
    return args[0] if args else next(iter(kwargs.values()))


def _set_first_input(envoy: Any, value: Any) -> None:
    args, kwargs = envoy.inputs
    if args:
        envoy.inputs = ((value, *args[1:]), kwargs)
    else:
        first = next(iter(kwargs))
        envoy.inputs = ((), {**kwargs, first: value})


def _softcapped(model: Any, logits: Any) -> Any:
    import torch

    cap = getattr(model._model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def _z(places: Places, address: Address, value: Any = None) -> Any:
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


def _interior(places: Places, address: Address, value: Any = None) -> Any:
    call = places.interface(address.layer)
    index = _INTERIOR_ARGUMENT[address.component]
    args, kwargs = call.inputs
    if value is None:
        return args[index]
    args = list(args)
    args[index] = value
    call.inputs = (tuple(args), kwargs)
    return None


def _scores(places: Places, address: Address, value: Any = None) -> Any:
    op = places.interface(address.layer).source.nn_functional_softmax_0
    if value is None:
        return op.input
    op.input = value
    return None


def _module_tensor(places: Places, address: Address) -> tuple[Any, str]:
    """(envoy, "input"|"output") for the components that sit on a submodule's boundary."""
    model, layer, component = places.model, address.layer, address.component
    if component == "embeddings":
        return model.embed_tokens, "output"
    if component == "input_ids":
        return model.embed_tokens, "input"
    if component == "attention_premix":
        return _child(model.attentions[layer], _OUT_PROJECTION, "attention out-projection", address), "input"
    if component == "mlp_activation":
        return _child(model.mlps[layer], _ACTIVATION, "MLP nonlinearity", address), "output"
    if component == "mlp_neuron_output":
        return _child(model.mlps[layer], _DOWN_PROJECTION, "MLP down-projection", address), "input"
    if component == "block_mid":
        return _pre_mlp(model, address)
    if component == "ln_final":
        return model.ln_final, "output"
    if component == "lm_head":
        return model.lm_head, "output"
    return None, ""


_LAYER_ACCESSORS = {
    "block_input": "layers_input",
    "block_output": "layers_output",
    "attention_input_norm": "attentions_input",
    "attentions_input": "attentions_input",
    "attention_output": "attentions_output",
    "mlp_input_norm": "mlps_input",
    "mlp_input": "mlps_input",
    "mlp_output": "mlps_output",
    "attention_probs": "attention_probabilities",
}
_INPUT_SIDE = ("attentions_input", "mlps_input")
_CALLS = {"attention_query": _interior, "attention_key": _interior, "attention_z": _z,
          "attention_scores": _scores}


def _fetch(places: Places, address: Address) -> Any:
    component, model = address.component, places.model
    if component in _CALLS:
        return _CALLS[component](places, address)
    if component == "attention_probs":
        places.interface(address.layer)
    branch = _branch_of(model, address)
    if branch is not None:
        return branch.output
    accessor = _LAYER_ACCESSORS.get(component)
    if accessor in _INPUT_SIDE:
        return _first_input(getattr(model, accessor.replace("_input", ""))[address.layer])
    if accessor is not None:
        return getattr(model, accessor)[address.layer]
    if component == "logits":
        return _softcapped(model, model.lm_head.output)
    if component == "next_token_probs":
        return _softcapped(model, model.lm_head.output).softmax(-1)
    envoy, side = _module_tensor(places, address)
    if envoy is None:
        raise RunError((component,), f"{component} ({address.accessor}) cannot be reached on this model")
    return _first_input(envoy) if side == "input" else envoy.output


def _store(places: Places, address: Address, value: Any) -> None:
    component, model = address.component, places.model
    if component in _CALLS:
        _CALLS[component](places, address, value)
        return
    branch = _branch_of(model, address)
    accessor = _LAYER_ACCESSORS.get(component)
    if branch is not None:
        branch.output = value
    elif accessor in _INPUT_SIDE:
        _set_first_input(getattr(model, accessor.replace("_input", ""))[address.layer], value)
    elif accessor is not None:
        getattr(model, accessor)[address.layer] = value
    elif component == "logits":
        return
    else:
        envoy, side = _module_tensor(places, address)
        if envoy is None:
            raise RunError((component,), f"{component} ({address.accessor}) cannot be reached on this model")
        if side == "input":
            _set_first_input(envoy, value)
        else:
            envoy.output = value


def project_to_vocabulary(model: Any, hidden: Any) -> Any:
    """``view: "logits"``: a gathered residual through the final norm, the head and any
    softcap, ``(…, d) -> (…, vocab)``. The raw modules are called, not their envoys, so the
    projection leaves the tracer's call counts (and later taps at those modules) alone."""
    normed = model.ln_final._module(hidden)
    return _softcapped(model, model.lm_head._module(normed))
