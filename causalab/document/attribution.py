"""Rules an ``attribute`` step owes its intervention (docs/format.md §9.7), decided offline.

An attribute step linearises one interchange: a single model whose single write swaps a read
of the same site (on another role) into its input, with identity featurizers and no decode.
Its metrics must be read on that model and be differentiable; its unit must be one the
site's component has. Every refusal is a ``DocumentError`` (V29) at the path of the field
that is wrong. Widths, layer counts and token lengths need the config and tokenizer and are
checked by ``causalab.compile.attribution``.
"""
from __future__ import annotations

from dataclasses import dataclass

from causalab.document.interventions import Entry
from causalab.document.schema import Attribute, Document
from causalab.document.vocab import (ATTRIBUTION_UNITS, COMPONENTS, IDENTITY, METRIC_KINDS,
                                     ORIGINAL)
from causalab.errors import DocumentError, Path

# A head of attention_output is its premix slice through the out-projection, which is linear:
# the two estimates are one number, so a head unit there is computed at attention_premix.
HEADS_THROUGH = {"attention_output": "attention_premix"}
# AtP*'s QK fix: a patched query or key moves its head's pattern, which is recomputed exactly
# (the softmax of the scores the patch moves) at the pattern that component feeds; the other
# side of the dot product is read whole at the same layer.
QK_PARTNER = {"attention_query": "attention_key", "attention_key": "attention_query"}


@dataclass(frozen=True)
class Interchange:
    """The parts of an interchange the step reads: the write, its operand and the model."""

    write: str
    operand: str
    model: str
    base: str
    counterfactual: str
    site: str


def interchange(doc: Document, entry: Entry) -> Interchange:
    """The intervention as an interchange, or the first field that keeps it from being one."""
    body, at = entry.body, entry.path
    if body.decode:
        raise DocumentError(at + ("decode",), "attribution scores one forward; decode must be 0")
    if len(body.models) != 1:
        raise DocumentError(at + ("models",), f"attribution linearises one patched model; "
                            f"this intervention declares {len(body.models)}")
    model, spec = next(iter(body.models.items()))
    if len(spec.writes) != 1:
        raise DocumentError(at + ("models", model, "writes"), "attribution linearises one "
                            f"write; model {model!r} applies {len(spec.writes)}")
    name = spec.writes[0]
    write = body.writes[name]
    here = at + ("writes", name)
    if write.mechanism != "swap":
        raise DocumentError(here + ("mechanism",), f"attribution estimates an interchange "
                            f'(mechanism "swap"), not {write.mechanism!r}')
    if not isinstance(write.operand, str):
        raise DocumentError(here + ("operand",), "the swapped value must be a read of this "
                            "intervention (the counterfactual's activation)")
    if write.featurizer != IDENTITY or write.features is not None:
        raise DocumentError(here + ("featurizer",), "attribution patches the site itself: "
                            "no featurizer or features on the write")
    source = body.reads[write.operand]
    if source.featurizer != IDENTITY or source.site != write.site or source.model != ORIGINAL:
        raise DocumentError(at + ("reads", write.operand), "the operand must read the write's "
                            "own site on the un-intervened model, without a featurizer")
    return Interchange(write=name, operand=write.operand, model=model, base=spec.input,
                       counterfactual=source.input, site=write.site)


def attributed_metrics(step: Attribute, entry: Entry, patched: str,
                       at: Path) -> dict[str, Path]:
    """The metrics the step scores, each with the path a refusal of it names."""
    body = entry.body
    if step.metrics is None:
        chosen = {m: entry.path + ("metrics", m, "kind") for m in body.metrics}
    else:
        chosen = {}
        for j, name in enumerate(step.metrics):
            if name not in body.metrics:
                raise DocumentError(at + ("metrics", j), f"no metric {name!r} in intervention "
                                    f"{entry.name!r} (metrics: {', '.join(body.metrics) or 'none'})")
            chosen[name] = at + ("metrics", j)
    if not chosen:
        raise DocumentError(entry.path + ("metrics",), "attribution needs a metric to differentiate")
    reads = {body.metrics[name].of for name in chosen}
    if len(reads) > 1:
        raise DocumentError(list(chosen.values())[-1], "attribution differentiates metrics of "
                            f"one read; these read {', '.join(sorted(reads))}")
    for name, path in chosen.items():
        metric = body.metrics[name]
        if not METRIC_KINDS[metric.kind]["differentiable"]:
            kinds = ", ".join(k for k, r in METRIC_KINDS.items() if r["differentiable"])
            raise DocumentError(path, f"metric {name!r} is {metric.kind}, a step function with "
                                f"no gradient; attribution takes {kinds}")
        if body.reads[metric.of].model != patched:
            raise DocumentError(entry.path + ("metrics", name, "of"), f"metric {name!r} reads "
                                f"{metric.of!r} off the patched model {patched!r}; the patch "
                                "cannot move it")
    return chosen


def _check_unit(doc: Document, step: Attribute, site: str, at: Path) -> None:
    component = doc.sites[site].component
    row = COMPONENTS.get(component)
    needs = ATTRIBUTION_UNITS[step.unit]["needs"]
    if row is None:
        raise DocumentError(at + ("unit",), f"{component} is not a component attribution knows")
    if needs == "heads" and not (row["per_head"] or component in HEADS_THROUGH):
        raise DocumentError(at + ("unit",), f"{component} has no heads; a head unit needs a "
                            "per-head component or attention_output")
    if needs == "width" and (row["width"] is None or row["key_axis"]):
        raise DocumentError(at + ("unit",), f"{component} has no feature axis to cut into units")
    if step.qk_fix and (component not in QK_PARTNER or step.unit != "head"):
        raise DocumentError(at + ("qk_fix",), "the QK fix recomputes a head's pattern for a "
                            "patched query or key: it needs unit: head on "
                            f"{' or '.join(QK_PARTNER)}, not unit {step.unit} on {component}")
    if step.layers is not None and row["whole_model"]:
        raise DocumentError(at + ("layers",), f"{component} is whole-model: it has no layers "
                            "to attribute over")


def check_attribute(doc: Document, step: Attribute, entry: Entry, at: Path) -> set[str]:
    """Refuse the first rule the step breaks (V29); return the metric names it produces."""
    found = interchange(doc, entry)
    chosen = attributed_metrics(step, entry, found.model, at)
    _check_unit(doc, step, found.site, at)
    for label, pos in step.positions.items():
        if pos.frame != "prompt":
            raise DocumentError(at + ("positions", label, "frame"), "attribution reads the "
                                "prompt; a generated position has nothing to patch")
    return set(chosen)
