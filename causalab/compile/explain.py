"""``explain``: the compiled plan tree as text (docs/format.md §15 grammar) and as JSON (``--json``).

Reads a plan and nothing else: no model, no tokenizer, no rows. The text is for people; the
JSON payload is the serialised plan, which round-trips through ``plan_from_json``.

    >>> from causalab.compile.plan import Plan
    >>> explain(Plan(name="<root>", directory="", children=()))
    '<root>: Plan'
"""
from __future__ import annotations

from causalab.compile.plan import (Address, Attribute, Featurizers, FeaturizerSpec, Fit, Forward,
                                   Observe, Pass, Plan, ReadOp, Weights, WriteOp, plan_to_json)
from causalab.compile.positions import spell


def _number(value: float) -> str:
    return repr(float(value))


def address_text(address: Address) -> str:
    """``block_output[0]``, ``lm_head``, ``attention_premix[1] heads=[2]``."""
    text = address.component if address.layer is None else f"{address.component}[{address.layer}]"
    if address.heads:
        text += f" heads=[{','.join(map(str, address.heads))}]"
    if address.units:
        text += f" units=[{','.join(map(str, address.units))}]"
    return text


def read_line(read: ReadOp, decode: int) -> str:
    line = (f"read  '{read.name}' at {address_text(read.address)} pos={spell(read.pos)} "
            f"via '{read.featurizer}'")
    if read.view == "logits":
        line += " as logits"
    if read.pos.frame == "generated":
        if read.pos.index is not None and read.pos.index >= 0 and read.pos.variable is None \
                and read.pos.segment is None:
            line += f" @step {read.pos.index}"
        else:
            line += f" over {decode} steps"
    return line


def _operand(write: WriteOp) -> list[str]:
    operand = write.operand
    if operand.kind == "literal":
        return [_number(operand.value)]
    if operand.kind in ("read", "ref"):
        return [operand.name]
    return []


def write_line(write: WriteOp) -> str:
    args = _operand(write) + [f"{k}={_number(v) if isinstance(v, float) else v}"
                              for k, v in write.params.items()]
    line = (f"write '{write.name}' at {address_text(write.address)} pos={spell(write.pos)} "
            f"{write.mechanism}({', '.join(args)}) via '{write.featurizer}'")
    if write.features is not None:
        line += f" on its features [{', '.join(map(str, write.features))}]"
    return line


def forward_lines(forward: Forward, pass_: Pass, indent: str) -> list[str]:
    tokens = pass_.inputs[forward.input].tokens if forward.input in pass_.inputs else 0
    head = f"{indent}forward '{forward.model}' on '{forward.input}'  ({pass_.rows} rows x {tokens} tokens)"
    if forward.decode:
        head += f"  decode={forward.decode}"
    ops = {("write", w.name): write_line(w) for w in forward.writes}
    ops.update({("read", r.name): read_line(r, forward.decode) for r in forward.reads})
    return [head] + [f"{indent}  {ops[tap]}" for tap in forward.taps]


def _names(items) -> str:
    return "[" + ", ".join(repr(i) for i in items) + "]"


def observe_line(node: Observe) -> str:
    metrics = [f"{m.name}/{m.kind}" for m in node.pass_.metrics]
    line = f"{node.name}: Observe  metrics={_names(metrics)}"
    if node.outputs:
        outs = [f"{o.name}={o.read}" if o.reduce == "none" else f"{o.name}={o.reduce}({o.read})"
                for o in node.outputs]
        line += f"  outputs={_names(outs)}"
    if node.saves:
        line += f"  saves={_names(s.file_path for s in node.saves)}"
    return line


def fit_line(node: Fit) -> str:
    updates = len(node.batches[0]) if node.batches else 0
    objective = "(" + ", ".join(f"({_number(w)}, {t!r})" for w, t in node.objective)
    objective += ",)" if len(node.objective) == 1 else ")"
    line = (f"{node.name}: Fit  {node.epochs} epochs x {updates} update{'s' if updates != 1 else ''}"
            f"  lr={node.lr} objective={objective} params={tuple(node.params)!r}"
            f"  early_stop={node.early_stop_metric!r} patience={node.patience}")
    if node.anneal:
        line += f" anneal={ {g: tuple(v) for g, v in node.anneal.items()} }"
    saves = node.saves + node.eval_saves
    if saves:
        line += f"  saves={_names(s.file_path for s in saves)}"
    return line


def _layer_span(layers: tuple) -> str:
    if layers == (None,):
        return ""
    if layers == tuple(range(layers[0], layers[0] + len(layers))) and len(layers) > 2:
        return f"[{layers[0]}..{layers[-1]}]"
    return "[" + ",".join(map(str, layers)) + "]"


def attribute_lines(node: Attribute, pad: str) -> list[str]:
    """The step, then what it runs: the counterfactual's forward, the base's forward and
    backward per integrated-gradients step, and where each position label lands."""
    from causalab.compile.attribution import unit_count

    if node.circuit_k is not None:
        return _edge_lines(node, pad)
    first = node.addresses[0]
    units = sum(unit_count(a, node.unit) for a in node.addresses) * len(node.labels)
    estimate = "atp" if node.steps == 1 else f"integrated gradients, {node.steps} steps"
    estimate += "".join(text for on, text in ((node.patterns, " + QK fix"),
                                              (node.gates, " + GradDrop"),
                                              (node.verify, _verify_words(node)))
                        if on)
    line = (f"{pad}{node.name}: Attribute  {first.component}{_layer_span(node.layers)} "
            f"unit={node.unit} ({units} units)  metrics={_names(node.metrics)}  "
            f"estimate={estimate}")
    if node.saves:
        line += f"  saves={_names(s.file_path for s in node.saves)}"
    pass_ = node.passes[0]
    tokens = {role: pass_.inputs[role].tokens for role in (node.base, node.counterfactual)}
    lines = [line,
             f"{pad}    forward '{node.counterfactual}' ({pass_.rows} rows x "
             f"{tokens[node.counterfactual]} tokens): read the site at {len(node.layers)} layers",
             f"{pad}    forward + backward '{node.base}' ({pass_.rows} rows x "
             f"{tokens[node.base]} tokens) x {node.steps}: d metric / d site at every layer"]
    for label, each in zip(node.labels, node.passes):
        write = next(w for fw in each.forwards for w in fw.writes if w.name == node.write)
        read = next(r for fw in each.forwards for r in fw.reads if r.name == node.operand)
        name = "" if label is None else f"{label}: "
        lines.append(f"{pad}    {name}(a_cf at pos={spell(read.pos)} - a_base at "
                     f"pos={spell(write.pos)}) . gradient")
    return lines


def _verify_words(node: Attribute) -> str:
    """``verify: N`` as its count; with a bound, when it stops and at most how far it goes."""
    if node.verify_bound is None:
        return f" + verify {node.verify}"
    return (f" + verifies until the bound is below {node.verify_bound:g}, at most "
            f"{node.verify_most} units ({node.verify_round} a round)")


def _edge_lines(node: Attribute, pad: str) -> list[str]:
    """An ``edges: true`` step: its graph and forwards (docs/format.md §9.7)."""
    pass_ = node.passes[0]
    tokens = pass_.inputs[node.base].tokens
    sizes = ", ".join(map(str, node.circuit_k)) or "MIB's budgets (0.1 % ... 50 % of the edges)"
    return [f"{pad}{node.name}: Attribute  edges (EAP-IG, {node.steps} steps)  "
            f"metrics={_names(node.metrics)}  circuit_k={sizes}",
            f"{pad}    senders: embeddings, every head (through o_proj or c_proj; its share of "
            "a post-norm's output), every MLP; receivers: "
            + ("every later head's query, key and value input (per key/value head), "
               if node.receivers == "heads" else "every later attention input, ")
            + "MLP input, the logits",
            f"{pad}    forward '{node.counterfactual}' and '{node.base}' ({pass_.rows} rows x "
            f"{tokens} tokens): every sender's output",
            f"{pad}    forward + backward '{node.base}' x {node.steps}: d metric / d each "
            "receiver's input",
            f"{pad}    per circuit size: a base forward with every edge outside the top k "
            "patched from the counterfactual",
            f"{pad}    MIB's circuits (CPR: signed ranking, CMD: |score|): the same forward at "
            "each budget the curve lacks"]


def featurizer_line(spec: FeaturizerSpec) -> str:
    parts = [f"{spec.name}: {spec.kind}"]
    if spec.k is not None:
        parts.append(f"k={spec.k}")
    parts.append(f"d={spec.d}")
    if spec.kind == "subspace":
        parts.append(spec.parametrization)
    if spec.file_path:
        parts.append(f"loaded from {spec.file_path}")
    elif spec.kind != "gate":
        parts.append(f"seed={spec.seed}")
    parts.append(f"trained={spec.trained_by is not None}")
    control = spec.stamp.get("model_control")
    if control:  # trained on, or loaded from, the model's control: never the checkpoint's fit
        parts.append(f"control={control} (seed {spec.stamp.get('model_control_seed')})")
    return " ".join(parts)


def _plan_line(node: Plan, pad: str) -> str:
    """``<root>: Plan``, and the control that replaced the checkpoint's weights, if any."""
    control = getattr(node.model, "control", None) if node.model else None
    where = f"  model={node.model.key} control={control} (its weights re-initialised, not the " \
            "checkpoint's)" if control else ""
    return f"{pad}{node.name}: Plan{where}"


def _lines(node, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(node, Plan):
        out = [_plan_line(node, pad)]
        for child in node.children:
            out += _lines(child, depth + 1)
        return out
    if isinstance(node, Featurizers):
        return [f"{pad}{node.name}: Featurizers"] + [
            f"{pad}    {featurizer_line(s)}" for s in node.featurizers]
    if isinstance(node, Observe):
        return [f"{pad}{observe_line(node)}"] + [
            line for fw in node.pass_.forwards for line in forward_lines(fw, node.pass_, pad + "    ")]
    if isinstance(node, Fit):
        return [f"{pad}{fit_line(node)}"] + [
            line for fw in node.train.forwards for line in forward_lines(fw, node.train, pad + "    ")]
    if isinstance(node, Attribute):
        return attribute_lines(node, pad)
    if isinstance(node, Weights):
        line = f"{pad}{node.name}: Weights  names={_names(node.names)}"
        return [line + (f"  saves={_names(s.file_path for s in node.saves)}" if node.saves else "")]
    raise TypeError(f"not a plan node: {type(node).__name__}")


def explain(plan: Plan) -> str:
    """The plan tree as the text ``causalab explain`` prints."""
    return "\n".join(_lines(plan, 0))


def unchecked(plan) -> list[tuple[tuple, str]]:
    """``(path, why)`` for each bundle check compile could not make (a ``runs:/`` bundle with
    no store known, a stamp without a digest), once each, in plan order."""
    found: list[tuple[tuple, str]] = []
    if isinstance(plan, Featurizers):
        for spec in plan.featurizers:
            entry = (("featurizers", spec.name, "file_path"), spec.unchecked)
            if spec.unchecked and entry not in found:
                found.append(entry)
    for child in getattr(plan, "children", ()):
        found += [entry for entry in unchecked(child) if entry not in found]
    return found


def explain_payload(plan: Plan) -> dict:
    """``explain --json``: the serialised plan plus ``steps`` (root step names or point labels)
    and ``unchecked`` (the checks compile could not make, as lines)."""
    payload = plan_to_json(plan)
    payload["unchecked"] = [f"{'.'.join(map(str, path))}: {why}" for path, why in unchecked(plan)]
    payload["steps"] = [child.name for child in plan.children
                        if not isinstance(child, Featurizers)]
    payload["text"] = explain(plan)
    return payload
