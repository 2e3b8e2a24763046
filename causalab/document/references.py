"""Rules between nodes of one point (docs/format.md §14.1): names, operands, orders, metrics, fits.

Everything here is decidable offline, from the validated ``Document`` alone: no tokenizer,
config, rows or weights (those rules live in ``causalab.compile``). Single-node rules live in
the schema. Each refusal is a ``DocumentError`` at the path docs/format.md §14 gives; step-level
rules (outputs, refs, saves, fits) are in ``step_references.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

from causalab.document.interventions import Intervention, Ref, Write
from causalab.document.positions import Position
from causalab.document.schema import Attribute, Document, Fit, Observe, Weights
from causalab.document.steps import step_interventions
from causalab.document.vocab import (COMPONENTS, DTYPE_LARGEST, IDENTITY, MECHANISMS, ORIGINAL,
                                     STEP_SOURCES, VOCABULARY_COMPONENTS, is_reserved_result)
from causalab.errors import DocumentError, Path

RESIDUAL = tuple(name for name, row in COMPONENTS.items() if row["residual"])


@dataclass(frozen=True)
class Entry:
    """One intervention a step runs: its registered name, body and JSON path."""

    name: str
    body: Intervention
    path: Path


def check_references(doc: Document) -> dict[str, list[Entry]]:
    """Refuse the first cross-node violation; return each step's entries for the step rules."""
    for name, body in doc.interventions.items():
        check_intervention(doc, body, ("interventions", name))
    entries = step_entries(doc)
    for step_entries_ in entries.values():
        for entry in step_entries_:
            if entry.path[0] == "steps":
                check_intervention(doc, entry.body, entry.path)
    sites = _check_featurizer_sites(doc, entries)
    for name, featurizer in doc.featurizers.items():
        if step_source(featurizer.file_path) is not None:
            _check_step_source(doc, entries, name, sites, ("featurizers", name, "file_path"))
    return entries


def step_entries(doc: Document) -> dict[str, list[Entry]]:
    """Each observe/fit/attribute step's interventions, inline ones registered (V7, V8, V9)."""
    out: dict[str, list[Entry]] = {}
    for s, step in doc.steps.items():
        if not isinstance(step, (Observe, Fit, Attribute)):
            continue
        at = ("steps", s)
        if step.interventions is None:
            declared = ", ".join(doc.interventions) or "none"
            raise DocumentError(at, f"{step.kind} needs interventions: a declared name "
                                f"({declared}), an inline intervention object, or a list")
        out[s] = [_entry(doc, s, value, at + sub) for value, sub in step_interventions(step)]
        _refuse_repeats(out[s], at)
    return out


def _refuse_repeats(entries: list[Entry], at: Path) -> None:
    """One intervention twice in a list would write its files over its own first entry's."""
    seen: set[str] = set()
    for j, entry in enumerate(entries):
        if entry.name in seen:
            raise DocumentError(at + ("interventions", j),
                                f"{entry.name!r} is already listed in this step; "
                                "each intervention runs once per step")
        seen.add(entry.name)


def _entry(doc: Document, step: str, value: str | Intervention, at: Path) -> Entry:
    if isinstance(value, str):
        if value not in doc.interventions:
            declared = ", ".join(doc.interventions) or "none"
            raise DocumentError(at, f"no intervention named {value!r} (declared: {declared}); "
                                "an intervention may also be written inline")
        return Entry(value, doc.interventions[value], ("interventions", value))
    name = step if len(at) == 3 else f"{step}[{at[3]}]"
    if name in doc.interventions:
        raise DocumentError(("steps", step, "interventions"),
                            f"inline intervention registers as {name!r}, which is declared")
    return Entry(name, value, at)


def check_intervention(doc: Document, body: Intervention, at: Path) -> None:
    """Names, sites, views, operands, write order and metrics inside one intervention."""
    for r, read in body.reads.items():
        _check_read(doc, body, r, at + ("reads", r))
    for w, write in body.writes.items():
        _check_write(doc, body, write, at + ("writes", w))
    for m, model in body.models.items():
        here = at + ("models", m)
        if m == ORIGINAL:
            raise DocumentError(here, f'"{ORIGINAL}" is the un-intervened model; rename it')
        _declared(model.input, doc.roles, "role", here + ("input",))
        for j, name in enumerate(model.writes):
            _declared(name, body.writes, "write of this intervention", here + ("writes", j))
        _check_write_order(doc, {n: body.writes[n] for n in model.writes}, here + ("writes",))
    for k, metric in body.metrics.items():
        _check_metric(doc, body, metric.of, at + ("metrics", k))


def _declared(name: str, table: dict, what: str, at: Path) -> None:
    if name not in table:
        known = ", ".join(table) or "none"
        raise DocumentError(at, f"no {what} named {name!r} (declared: {known})")


def _featurizer(doc: Document, name: str, at: Path) -> None:
    if name != IDENTITY:
        _declared(name, doc.featurizers, f"featurizer (or '{IDENTITY}')", at)


def _reserved(name: str, at: Path) -> None:
    if is_reserved_result(name):
        raise DocumentError(at, f"{name!r} is a result name the run produces itself "
                            "(*.generated, <gate>.mask, train/loss, train/eval)")


def _check_read(doc: Document, body: Intervention, r: str, at: Path) -> None:
    read = body.reads[r]
    _reserved(r, at)
    _declared(read.site, doc.sites, "site", at + ("site",))
    _declared(read.input, doc.roles, "role", at + ("input",))
    if read.model != ORIGINAL:
        _declared(read.model, body.models, f"model of this intervention (or '{ORIGINAL}')",
                  at + ("model",))
    _featurizer(doc, read.featurizer, at + ("featurizer",))
    component = doc.sites[read.site].component
    if read.view == "logits" and component not in RESIDUAL:
        raise DocumentError(at + ("view",), f'view "logits" is for the residual stream '
                            f"({', '.join(RESIDUAL)}), not {component}")
    _check_decode(body, read.pos, at + ("pos",))
    if (component == "lm_head" and body.decode > 0 and read.pos.frame == "prompt"
            and read.pos.width != 1):
        raise DocumentError(at + ("pos",), "under decode lm_head keeps only the last "
                            "position: read one position there")


def _check_decode(body: Intervention, pos: Position, at: Path) -> None:
    if pos.frame != "generated":
        return
    if body.decode <= 0:
        raise DocumentError(at, 'the generated frame needs "decode" > 0 on the intervention')
    if pos.index is not None and pos.index >= body.decode:
        raise DocumentError(at, f"generated index {pos.index} is past the last decode step "
                            f"({body.decode - 1})")


def _check_write(doc: Document, body: Intervention, write: Write, at: Path) -> None:
    _declared(write.site, doc.sites, "site", at + ("site",))
    component = doc.sites[write.site].component
    if COMPONENTS.get(component, {}).get("read_only"):
        raise DocumentError(at + ("site",), f"{component} is read-only: it can be read, "
                            "never written")
    _featurizer(doc, write.featurizer, at + ("featurizer",))
    _check_decode(body, write.pos, at + ("pos",))
    _check_magnitudes(doc.model.dtype, write, at)
    if not isinstance(write.operand, str):
        return
    if write.operand not in body.reads:
        raise DocumentError(at + ("operand",), f"{write.operand!r} is not a read of this "
                            f'intervention; a value published by an earlier step is '
                            f'{{"ref": "{write.operand}"}}')
    source = body.reads[write.operand]
    if source.view == "logits":
        raise DocumentError(at + ("operand",), f"{write.operand!r} is a logits view and "
                            "cannot be a write operand")
    if None not in (write.pos.width, source.pos.width) and write.pos.width != source.pos.width:
        raise DocumentError(at + ("pos",), f"the write is {write.pos.width} positions wide "
                            f"but its operand {write.operand!r} is {source.pos.width}")


def _check_magnitudes(dtype: str, write: Write, at: Path) -> None:
    """V15: every number a write puts into the forward (its params of type number, a literal
    operand) fits the model's dtype; ``lerp`` with t = 1e308 in fp32 would multiply by inf."""
    params = MECHANISMS[write.mechanism]["params"]
    numbers = [(("params", name), value) for name, value in write.params.items()
               if params[name]["type"] == "number"]
    if isinstance(write.operand, (int, float)) and not isinstance(write.operand, bool):
        numbers.append((("operand",), write.operand))
    for where, value in numbers:
        if abs(value) > DTYPE_LARGEST[dtype]:
            raise DocumentError(at + where, f"{value!r} is past the largest {dtype} value "
                                f"({DTYPE_LARGEST[dtype]:.4g}): the forward would see inf")


def _check_write_order(doc: Document, writes: dict[str, Write], at: Path) -> None:
    """Within one model's list: no second absolute write over positions and features of one
    site that an earlier one also sets, and a renormalize only after another write at its
    site and last there. Writes on disjoint features compose, each on its own, in order."""
    names = list(writes)
    for j, name in enumerate(names):
        write = writes[name]
        kind = MECHANISMS[write.mechanism]["class"]
        before = [n for n in names[:j] if writes[n].site == write.site]
        after = [n for n in names[j + 1:] if writes[n].site == write.site]
        if kind == "restoring" and (not before or after):
            where = "after another write" if not before else "last"
            raise DocumentError(at, f"{write.mechanism} at site {write.site!r} must come "
                                f"{where} at that site")
        if kind != "absolute":
            continue
        for earlier in before:
            first = writes[earlier]
            shared = _shared_features(first, write)
            if MECHANISMS[first.mechanism]["class"] == "absolute" and shared \
                    and _may_overlap(first.pos, write.pos):
                raise DocumentError(at, f"two absolute writes at site {write.site!r} over "
                                    f"overlapping positions set {shared}: {earlier!r} "
                                    f"({first.mechanism}) and {name!r} ({write.mechanism}); "
                                    "the second would discard the first there")


def _shared_features(p: Write, q: Write) -> str:
    """What both writes set, in words; "" when they are provably disjoint: both name
    ``features`` of one featurizer and no feature twice."""
    if p.featurizer != q.featurizer:
        return f"the same values (through featurizers {p.featurizer!r} and {q.featurizer!r})"
    if p.features is None or q.features is None:
        return "every feature" if p.features is None and q.features is None else (
            f"features {sorted(set(p.features or q.features))}")
    both = sorted(set(p.features) & set(q.features))
    return f"features {both}" if both else ""


def _static_indices(pos: Position) -> set[int] | None:
    if pos.index is not None:
        return {pos.index}
    if pos.last is not None:
        return set(range(-pos.last, 0))
    if pos.width is not None and pos.span is not None:
        return set(range(*pos.span))
    return None


def _may_overlap(p: Position, q: Position) -> bool:
    """False only when the two cuts are provably disjoint without knowing any row."""
    if p.frame != q.frame or p.scope != q.scope:
        return True
    a, b = _static_indices(p), _static_indices(q)
    if a is None or b is None:
        return True
    same_side = all(i < 0 for i in a | b) or all(i >= 0 for i in a | b)
    return not same_side or bool(a & b)


def _check_metric(doc: Document, body: Intervention, of: str, at: Path) -> None:
    _reserved(at[-1], at)
    if of not in body.reads:
        raise DocumentError(at + ("of",), f"metric reads {of!r}, which is not a read of this "
                            f"intervention (reads: {', '.join(body.reads) or 'none'})")
    read = body.reads[of]
    if read.pos.width != 1:
        found = "of unknown width" if read.pos.width is None else (
            f"{read.pos.width} positions wide")
        raise DocumentError(at + ("of",), f"a metric scores one position per row; read {of!r} "
                            f"is {found}")
    site = doc.sites[read.site]
    if site.component not in COMPONENTS and read.view != "logits":
        # Most likely a misspelt lm_head: the site is what is wrong, not the metric.
        raise DocumentError(("sites", read.site, "component"), f"unknown component "
                            f"{site.component!r}; metric {at[-1]!r} reads this site, and a "
                            f"metric needs {' or '.join(VOCABULARY_COMPONENTS)}")
    shaped = read.view == "logits" or site.component in VOCABULARY_COMPONENTS
    sliced = site.heads is not None or site.units is not None
    if not shaped or sliced or read.featurizer != IDENTITY:
        raise DocumentError(at + ("of",), f"read {of!r} is not vocabulary-shaped: a metric "
                            f"needs {' or '.join(VOCABULARY_COMPONENTS)} or a "
                            'view: "logits" read, without heads, units or a featurizer')


def _check_featurizer_sites(doc: Document, entries: dict[str, list[Entry]]) -> dict[str, list[str]]:
    bodies = {("interventions", n): b for n, b in doc.interventions.items()}
    bodies.update({e.path: e.body for es in entries.values() for e in es})
    sites: dict[str, list[str]] = {}
    for body in bodies.values():
        for node in list(body.reads.values()) + list(body.writes.values()):
            if node.featurizer != IDENTITY and node.site not in sites.setdefault(
                    node.featurizer, []):
                sites[node.featurizer].append(node.site)
    for name in doc.featurizers:
        if name not in sites:
            raise DocumentError(("featurizers", name),
                                f"featurizer {name!r} is declared but no read or write uses it, "
                                "so it has no site to take its width from")
    for name, found in sites.items():
        if len(found) > 1:
            raise DocumentError(("featurizers", name), f"one featurizer is one parameter set "
                                f"at one site; {name!r} is used at {' and '.join(found)}")
    return sites


def step_source(file_path: str | None) -> tuple[str, str] | None:
    """``"steps:<step>/<value>"`` -> ``(step, value)``; None for a file or a ``runs:/`` URI.

    >>> step_source("steps:harvest/basis")
    ('harvest', 'basis')
    """
    prefix = STEP_SOURCES["prefix"]
    if not file_path or not file_path.startswith(prefix):
        return None
    step, _, value = file_path[len(prefix):].partition("/")
    return step, value


def _source_of(doc: Document, step: str, value: str, sites: dict[str, list[str]],
               at: Path) -> tuple[str, int | None, str]:
    """What ``steps:<step>/<value>`` names: (featurizer kind it loads as, k, site)."""
    if step not in doc.steps:
        raise DocumentError(at, f"no step named {step!r} (steps: {', '.join(doc.steps)})")
    found = doc.steps[step]
    if isinstance(found, Weights) and value in found.names:
        source = doc.featurizers[value]
        if source.kind in STEP_SOURCES["weights"]:
            return source.kind, source.k, sites.get(value, [""])[0]
    outputs = found.outputs if isinstance(found, Observe) else {}
    loadable = {n: o for n, o in outputs.items() if o.reduce in STEP_SOURCES["reduce"]}
    if value not in loadable:
        offered = list(loadable) + list(found.names if isinstance(found, Weights) else ())
        raise DocumentError(at, f"step {step!r} publishes no featurizer {value!r} (it offers: "
                            f"{', '.join(offered) or 'none'}; a reduce "
                            f"{' or '.join(STEP_SOURCES['reduce'])} output or a weights entry)")
    output = loadable[value]
    reads = [e.body.reads[output.read] for e in step_entries(doc).get(step, [])
             if output.read in e.body.reads]
    return STEP_SOURCES["reduce"][output.reduce], output.k, reads[0].site if reads else ""


def _check_step_source(doc: Document, entries: dict[str, list[Entry]], name: str,
                       sites: dict[str, list[str]], at: Path) -> None:
    """A featurizer loaded from an earlier step: of the kind, rank and site that step
    publishes, and used only by steps after it (the stamp is checked again at run time)."""
    step, value = step_source(doc.featurizers[name].file_path)
    featurizer = doc.featurizers[name]
    kind, k, site = _source_of(doc, step, value, sites, at)
    if kind != featurizer.kind:
        raise DocumentError(at, f"steps:{step}/{value} is a {kind}; {name!r} is a "
                            f"{featurizer.kind}")
    if featurizer.k is not None and k is not None and featurizer.k != k:
        raise DocumentError(at, f"k: steps:{step}/{value} has k={k}, {name!r} says {featurizer.k}")
    if site and site not in sites.get(name, [site]):
        raise DocumentError(at, f"site: steps:{step}/{value} was read at {site!r}; {name!r} "
                            f"is used at {sites[name][0]!r}")
    order = list(doc.steps)
    for s in order[:order.index(step) + 1]:
        used = {node.featurizer for e in entries.get(s, [])
                for node in list(e.body.reads.values()) + list(e.body.writes.values())}
        if name in used:
            raise DocumentError(("steps", s), f"step uses featurizer {name!r}, which loads "
                                f"from step {step!r}; move the step after {step!r}")


def operand_refs(body: Intervention) -> list[tuple[str, str]]:
    """``(write name, ref)`` for every write whose operand is ``{"ref": …}``."""
    return [(w, write.operand.ref) for w, write in body.writes.items()
            if isinstance(write.operand, Ref)]


def roles_used(body: Intervention) -> set[str]:
    """Roles some forward of this intervention runs on: reads' inputs and their models'."""
    used = {read.input for read in body.reads.values()}
    used |= {body.models[read.model].input for read in body.reads.values()
             if read.model in body.models}
    return used
