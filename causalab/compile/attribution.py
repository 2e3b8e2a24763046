"""Attribute steps as plan nodes: the interchange compiled once per position label, the site
resolved at every layer of the set, and the checks that need the config or the tokenizer.

Knows nothing about tensors. The interchange's shape, its metrics' differentiability and the
unit's fit to the component were refused offline (``causalab.document.attribution``, V29);
here a layer past the model, a table past ``MAX_ATTRIBUTION_ROWS`` and integrated gradients
over prompts of different lengths are refused (C20), each at the step's field.
"""
from __future__ import annotations

from causalab.compile.addresses import head_count, resolve_address
from causalab.compile.passes import Context, Entry, build_pass
from causalab.compile.plan import Address, Attribute, Pass
from causalab.compile.saves import save_ops
from causalab.document.attribution import HEADS_THROUGH, QK_PARTNER, interchange
from causalab.document.schema import Attribute as AttributeStep, VerifyBound
from causalab.document.vocab import ATTRIBUTION_LAYERS_ALL, MAX_ATTRIBUTION_ROWS
from causalab.errors import CompileError


def _layers(raw: AttributeStep, site, ctx: Context, at: tuple) -> tuple[int | None, ...]:
    """The layers of the set: ``"all"``, the listed ones, or the site's own (C20 past the end)."""
    if raw.layers is None:
        return (site.layers[0],) if site.layers else (None,)
    if raw.layers == ATTRIBUTION_LAYERS_ALL:
        return tuple(range(ctx.facts.layers))
    for j, layer in enumerate(raw.layers):
        if layer >= ctx.facts.layers:
            raise CompileError(at + ("layers", j), f"layer {layer} is out of range: the model "
                               f"has {ctx.facts.layers} layers")
    return tuple(raw.layers)


def _addresses(raw: AttributeStep, site_name: str, layers: tuple, ctx: Context) -> tuple:
    """The site at each layer; a head unit selects every head (the site's own when it has some)."""
    site = ctx.document.sites[site_name]
    component, heads = site.component, site.heads
    if raw.unit == "head":
        component = HEADS_THROUGH.get(component, component)
        heads = heads or list(range(head_count(component, ctx.facts)))
    attn = ctx.document.model.attn_implementation
    return tuple(resolve_address(component, layer, heads, site.units, ctx.config, attn,
                                 ("sites", site_name)) for layer in layers)


def _with_position(entry: Entry, write: str, operand: str, pos) -> Entry:
    """The interchange with its write and operand moved to ``pos``."""
    body = entry.body
    writes = {**body.writes, write: body.writes[write].model_copy(update={"pos": pos})}
    reads = {**body.reads, operand: body.reads[operand].model_copy(update={"pos": pos})}
    return Entry(entry.name, body.model_copy(update={"writes": writes, "reads": reads}),
                 entry.path)


def unit_count(address: Address, unit: str) -> int:
    """How many units one address holds: 1, its heads, or its features."""
    if unit == "head":
        return len(address.heads)
    if unit == "feature":
        return address.width
    return 1


def _check_size(raw: AttributeStep, addresses: tuple, labels: tuple, rows: int,
                at: tuple) -> None:
    units = sum(unit_count(a, raw.unit) for a in addresses) * len(labels)
    if units * rows > MAX_ATTRIBUTION_ROWS:
        raise CompileError(at + ("unit",), f"{units} units x {rows} rows make "
                           f"{units * rows} table rows, more than MAX_ATTRIBUTION_ROWS = "
                           f"{MAX_ATTRIBUTION_ROWS}; narrow the site's units or the layers")


def _check_paths(pass_: Pass, base: str, counterfactual: str, at: tuple,
                 why: str = "integrated gradients walks between them token by token "
                            "(steps: 1 does not)") -> None:
    """Integrated gradients interpolates the two prompts token by token, and edges are
    patched position by position: equal lengths."""
    one, other = pass_.inputs[base], pass_.inputs[counterfactual]
    for row in range(pass_.rows):
        if one.attention_mask[row] != other.attention_mask[row]:
            raise CompileError(at, f"row {pass_.example_ids[row]}: the {base!r} and "
                               f"{counterfactual!r} prompts differ in length; {why}")


def attribute(step: str, raw: AttributeStep, entry: Entry, ctx: Context) -> Attribute:
    """The step as one plan node (docs/format.md §9.7)."""
    at = ("steps", step)
    found = interchange(ctx.document, entry)
    site = ctx.document.sites[found.site]
    labels = tuple(raw.positions) or (None,)
    passes = tuple(build_pass(entry if label is None else _with_position(
        entry, found.write, found.operand, raw.positions[label]), raw.rows, at + ("rows",), ctx)
        for label in labels)
    layers = _layers(raw, site, ctx, at)
    addresses = _addresses(raw, found.site, layers, ctx)
    _check_size(raw, addresses, labels, passes[0].rows, at)
    embeddings = None
    if raw.edges:  # edges are patched position by position between the two prompts
        _check_paths(passes[0], found.base, found.counterfactual, at + ("edges",),
                     "edges are patched position by position")
    if raw.steps > 1:
        _check_paths(passes[0], found.base, found.counterfactual, at + ("steps",))
        embeddings = resolve_address("embeddings", None, None, None, ctx.config,
                                     ctx.document.model.attn_implementation, at)
    metrics = tuple(raw.metrics) if raw.metrics is not None else tuple(entry.body.metrics)
    corrections = _corrections(raw, site.component, addresses, ctx, at)
    return Attribute(name=step, passes=passes, labels=labels, write=found.write,
                     operand=found.operand, base=found.base, counterfactual=found.counterfactual,
                     layers=layers, addresses=addresses, unit=raw.unit, metrics=metrics,
                     steps=raw.steps, embeddings=embeddings, saves=save_ops(raw.saves),
                     circuit_k=tuple(raw.circuit_k or ()) if raw.edges else None,
                     receivers=raw.receivers or "heads",
                     **corrections)


def _corrections(raw: AttributeStep, component: str, addresses: tuple, ctx: Context,
                 at: tuple) -> dict:
    """AtP*'s addresses: per layer the QK fix's partner, scores and pattern (eager attention,
    no softcap: C20 at ``qk_fix``); every layer's attention and MLP outputs for GradDrop."""
    found = {}
    attn = ctx.document.model.attn_implementation
    if raw.qk_fix:
        if getattr(ctx.config, "attn_logit_softcapping", None):
            raise CompileError(at + ("qk_fix",), "the QK fix recomputes a softmax of scores "
                               "shifted linearly; softcapped attention scores are not")
        heads = lambda name: list(range(head_count(name, ctx.facts)))  # noqa: E731
        found = {key: tuple(resolve_address(name, a.layer, heads(name), None, ctx.config, attn,
                                            at + ("qk_fix",)) for a in addresses)
                 for key, name in (("partners", QK_PARTNER[component]),
                                   ("scores", "attention_scores"),
                                   ("patterns", "attention_probs"))}
    if isinstance(raw.verify, VerifyBound):
        found.update(verify=raw.verify.round, verify_bound=float(raw.verify.bound),
                     verify_cap=raw.verify.max_units)
    elif raw.verify:
        found["verify"] = raw.verify
    if raw.verify:
        found["units"] = _unit_addresses(raw, addresses, ctx, at)
    if raw.graddrop:
        found["gates"] = tuple(resolve_address(name, layer, None, None, ctx.config, attn,
                                               at + ("graddrop",))
                               for layer in range(ctx.facts.layers)
                               for name in ("attention_output", "mlp_output"))
    return found


def _unit_addresses(raw: AttributeStep, addresses: tuple, ctx: Context, at: tuple) -> tuple:
    """Each unit of one position label alone, in table order: what ``verify`` patches."""
    attn = ctx.document.model.attn_implementation
    found = []
    for a in addresses:
        if raw.unit == "site":
            found.append(a)
            continue
        each = a.heads if raw.unit == "head" else (a.units or tuple(range(a.width)))
        for u in each:
            heads, units = ((u,), a.units) if raw.unit == "head" else (a.heads, (u,))
            found.append(resolve_address(a.component, a.layer, heads, units, ctx.config, attn,
                                         at + ("verify",)))
    return tuple(found)
