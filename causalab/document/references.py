"""Rules between the nodes of one point (docs/format.md §14.1): names, operands, orders,
metrics, fits, and a step's rows, outputs, refs and saves against the rest of its point.

Everything here is decidable offline, from the validated ``Document`` alone: no tokenizer,
config, rows or weights (those rules live in ``causalab.compile``), and no file is opened:
containment and collisions are checked on the path strings. Single-node rules live in the
schema. Each refusal is a ``DocumentError`` at the path docs/format.md §14 gives. The node rules
come first (``check_references``, which returns each step's entries); the step rules
(``check_steps``) walk the steps in written order over those entries, and what each step
*produces* (metrics, outputs, generated ids, fit traces, weights) is computed once (``produced``)
and read by the save rules.
"""
from __future__ import annotations

import posixpath

from causalab.document.attribution import check_attribute
from causalab.document.interventions import Entry, Intervention, Ref, Write
from causalab.document.names import mlflow_key, shell_form, unsafe_segment
from causalab.document.positions import Position
from causalab.document.schema import Attribute, Document, Fit, Observe, Save, Weights
from causalab.document.steps import step_interventions
from causalab.document.vocab import (COMPONENTS, DTYPE_LARGEST, FEATURIZER_KINDS, IDENTITY,
                                     MECHANISMS, METRIC_KINDS, ORIGINAL, STEP_SOURCES,
                                     VOCABULARY_COMPONENTS,
                                     is_reserved_result)
from causalab.errors import DocumentError, Path
from causalab.files import RESERVED, TABLE_SUFFIX, TENSOR_SUFFIX

RESIDUAL = tuple(name for name, row in COMPONENTS.items() if row["residual"])



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
        for field in METRIC_KINDS[metric.kind].get("reads", ()):
            _check_clean_read(doc, body, getattr(metric, field), at + ("metrics", k), field)


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


def _check_clean_read(doc: Document, body: Intervention, name: str, at: Path, field: str) -> None:
    """A metric's further read (``base_of``, ``counterfactual_of``): vocabulary-shaped like
    its ``of`` and taken on the unpatched model, whose clean gap it measures."""
    try:
        _check_metric(doc, body, name, at)
    except DocumentError as error:
        raise DocumentError(at + (field,), error.message) from None
    if body.reads[name].model != ORIGINAL:
        raise DocumentError(at + (field,), f"read {name!r} is taken on model "
                            f"{body.reads[name].model!r}; the clean gap is the unpatched "
                            f"model's ({ORIGINAL!r})")


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


# A step against the rest of its point.

TABLE, TENSOR = "table", "tensor"
# A trained dictionary (``reduce: sae``): one stamped .safetensors file, or a folder (a path
# with no suffix) laid out as SAELens saves one (docs/format.md §9.3).
DICTIONARY = "dictionary"


def check_steps(doc: Document, entries: dict[str, list[Entry]]) -> None:
    """Walk the steps in written order, publishing outputs as each one finishes."""
    published: dict[str, str] = {}
    files: dict[str, Path] = {}
    for s, step in doc.steps.items():
        at = ("steps", s)
        mine = entries.get(s, [])
        nested = isinstance(getattr(step, "interventions", None), list)
        if isinstance(step, (Observe, Fit, Attribute)):
            _check_rows(doc, step.rows, mine, at + ("rows",))
            _check_refs(mine, published)
        if isinstance(step, Attribute):
            scored = check_attribute(doc, step, mine[0], at)
            _check_saves(step.saves, {mine[0].name: {m: TABLE for m in scored}}, at, files)
            continue
        if isinstance(step, Observe):
            _check_outputs(step, mine, published, at)
            produced = {e.name: _observed(e, step) for e in mine}
            _check_saves(step.saves, produced, at, files, nested)
        elif isinstance(step, Fit):
            _check_fit(doc, step, mine, at)
            _check_rows(doc, step.eval.rows, mine, at + ("eval", "rows"))
            evaluated = {e.name: _observed(e, None) for e in mine}
            _check_saves(step.eval.saves, evaluated, at + ("eval",), files, nested)
            _check_saves(step.saves, {e.name: _fitted(doc, step) for e in mine}, at, files,
                         nested)
        else:
            _check_weights(doc, step, at)
            _check_saves(step.saves, {"": {n: TENSOR for n in step.names}}, at, files)
    _check_training_order(doc, entries)
    _check_metric_keys(doc, entries)


def _check_metric_keys(doc: Document, entries: dict[str, list[Entry]]) -> None:
    """V30: two keys of one run that MLflow's sanitising makes one (``iia/s🔥`` and ``iia/s💧`` are
    both ``iia/s_``): the later step's numbers would silently replace the earlier's."""
    fits = [s for s, step in doc.steps.items() if isinstance(step, Fit)]
    seen: dict[str, tuple[str, Path]] = {}
    for s, mine in entries.items():
        nested = isinstance(getattr(doc.steps[s], "interventions", None), list)
        keys = [(f"{s}/train/loss", ("steps", s))] if s in fits and len(fits) > 1 else []
        for entry in mine:
            label = f"{s}/{entry.name}" if nested else s
            keys += [(f"{m}/{label}", entry.path + ("metrics", m) if mlflow_key(m) != m
                      else ("steps", s)) for m in entry.body.metrics]
        for key, at in keys:
            logged = mlflow_key(key)
            if logged in seen and seen[logged][0] != key:
                first, where = seen[logged]
                raise DocumentError(at, f"metric key {key!r} is logged to MLflow as {logged!r}, "
                                    f"as is {first!r} ({'.'.join(map(str, where))}); rename one "
                                    "so each keeps its own numbers (MLflow keys hold letters, "
                                    "digits and _-. /: only)")
            seen.setdefault(logged, (key, at))


def _check_rows(doc: Document, rows: dict[str, str], mine: list[Entry], at: Path) -> None:
    for role in rows:
        if role not in doc.roles:
            raise DocumentError(at + (role,), f"no role named {role!r} "
                                f"(declared: {', '.join(doc.roles)})")
    needed = sorted(set().union(*(roles_used(e.body) for e in mine)) - set(rows))
    if needed:
        raise DocumentError(at, f"no rows for role {', '.join(needed)}, which this step's "
                            "intervention runs a forward on")


def _check_refs(mine: list[Entry], published: dict[str, str]) -> None:
    for entry in mine:
        for w, ref in operand_refs(entry.body):
            if ref not in published:
                so_far = ", ".join(published) or "nothing yet"
                raise DocumentError(entry.path + ("writes", w, "operand"),
                                    f'{{"ref": "{ref}"}} names no output of an earlier step '
                                    f"(published so far: {so_far})")


def _check_outputs(step: Observe, mine: list[Entry], published: dict[str, str],
                   at: Path) -> None:
    reads = set().union(*(e.body.reads for e in mine))
    for o, output in step.outputs.items():
        here = at + ("outputs", o)
        if is_reserved_result(o):
            raise DocumentError(here, f"{o!r} is a result name the run produces itself")
        if output.read not in reads:
            raise DocumentError(here, f"output reads {output.read!r}, which is not a read of "
                                f"this step's intervention (reads: {', '.join(sorted(reads))})")
        if o in reads:
            raise DocumentError(here, f"output {o!r} shares its name with a read; an operand "
                                "names one or the other")
        if o in published:
            raise DocumentError(here, f"{o!r} is already published by step {published[o]!r}")
    # A list step's entries keep their outputs inside their own nested plans.
    if isinstance(step.interventions, list):
        return
    published.update({o: at[1] for o in step.outputs})


def produced(doc: Document, step: str, entry: Entry, *, evaluation: bool = False) -> set[str]:
    """Result names one entry of a step produces: what its saves (``evaluation``: a fit's
    eval saves) may name bare. The one definition validate and the compiler both use."""
    node = doc.steps[step]
    if isinstance(node, Fit) and not evaluation:
        return set(_fitted(doc, node))
    return set(_observed(entry, node if isinstance(node, Observe) else None))


def _generated(entry: Entry) -> set[str]:
    body = entry.body
    if body.decode <= 0:
        return set()
    inputs: dict[str, set[str]] = {}
    for read in body.reads.values():
        inputs.setdefault(read.model, set()).add(read.input)
    names = set()
    for model, roles in inputs.items():
        names |= {f"{model}.generated"} if len(roles) == 1 else {
            f"{model}.{role}.generated" for role in roles}
    return names


def _observed(entry: Entry, step: Observe | None) -> dict[str, str]:
    out = {k: TABLE for k in entry.body.metrics}
    out.update({g: TENSOR for g in _generated(entry)})
    if step is not None:
        out.update({o: DICTIONARY if output.reduce == "sae" else TENSOR
                    for o, output in step.outputs.items() if output.read in entry.body.reads})
    return out


def _fitted(doc: Document, step: Fit) -> dict[str, str]:
    out = {"train/loss": TENSOR, "train/eval": TENSOR}
    out.update({f"{g}.mask": TENSOR for g in step.params
                if doc.featurizers.get(g) is not None and doc.featurizers[g].kind == "gate"})
    return out


def _resolve(value: str, produced: dict[str, dict[str, str]], at: Path) -> tuple[str, str]:
    """``(entry, kind)`` a save's value names; a list step may qualify it ``<entry>/<value>``."""
    owners = [e for e, names in produced.items() if value in names]
    if len(owners) == 1:
        return owners[0], produced[owners[0]][value]
    if len(owners) > 1:
        choices = ", ".join(f"{e}/{value}" for e in owners)
        raise DocumentError(at, f"{value!r} is produced by several entries; qualify it: "
                            f"{choices}")
    for entry, names in produced.items():
        rest = value[len(entry) + 1:]
        if entry and value.startswith(entry + "/") and rest in names:
            return entry, names[rest]
    every = sorted({(f"{e}/{n}" if len(produced) > 1 else n)
                    for e, names in produced.items() for n in names})
    raise DocumentError(at, f"this step does not produce {value!r}; it produces: "
                        f"{', '.join(every) or 'nothing'}")


def _check_suffix(save: Save, kind: str, at: Path) -> None:
    suffix = TABLE_SUFFIX if kind == TABLE else TENSOR_SUFFIX
    if save.file_path.endswith(suffix):
        return
    if kind == DICTIONARY and "." not in save.file_path.rsplit("/", 1)[-1]:
        return
    what = {TABLE: "a metric, saved as a JSON table", TENSOR: "a tensor",
            DICTIONARY: "a dictionary"}[kind]
    folder = " (or name a folder, with no suffix, for SAELens's layout)" if kind == DICTIONARY else ""
    raise DocumentError(at, f"{save.value!r} is {what}: its path must end in {suffix}{folder}")


def _check_saves(saves: list[Save], produced: dict[str, dict[str, str]], at: Path,
                 files: dict[str, Path], nested: bool = False) -> None:
    """Value produced here, extension, containment, collisions; ``nested``: a list step,
    whose saves land in ``<step>/<entry>/``."""
    for j, save in enumerate(saves):
        here = at + ("saves", j)
        entry, kind = _resolve(save.value, produced, here + ("value",))
        _check_suffix(save, kind, here + ("file_path",))
        name = _contained(save.file_path, here + ("file_path",))
        directory = f"{at[1]}/{entry}" if nested else ""
        if not directory and name in RESERVED:
            raise DocumentError(here + ("file_path",), f"{name} is written by the run itself")
        _check_collision(posixpath.join(directory, name), here + ("file_path",), files)


def _check_collision(full: str, at: Path, files: dict[str, Path]) -> None:
    """V28: two saves of the point writing one file, or one's file where the other needs a
    folder, whichever steps they sit in (a list step's ``<step>/<entry>/`` included)."""
    for other, first in files.items():
        if full == other or full.startswith(other + "/") or other.startswith(full + "/"):
            where = ".".join(str(p) for p in first)
            if full == other:
                raise DocumentError(at, f"{full} is already written by {where}")
            clash = "lies inside" if len(full) > len(other) else "would hold"
            raise DocumentError(at, f"{full} {clash} {other}, which {where} writes")
    files[full] = at


def _contained(file_path: str, at: Path) -> str:
    if posixpath.isabs(file_path) or file_path.startswith("\\") or ":" in file_path[:2]:
        raise DocumentError(at, f"{file_path!r} is absolute; paths are relative to the "
                            "output directory")
    shell = shell_form(file_path)
    if shell is not None:
        raise DocumentError(at, f"{file_path!r} {shell}: nothing expands it, so it would be a "
                            "file or folder of that name under the output directory; give "
                            "the path relative to --out")
    name = posixpath.normpath(file_path)
    if name == ".." or name.startswith("../"):
        raise DocumentError(at, f"{file_path!r} escapes the output directory")
    if posixpath.basename(name).startswith("."):
        raise DocumentError(at, f"{file_path!r} names a file with no stem (a hidden file); "
                            "give it a name before its suffix, e.g. scores.json")
    for part in name.split("/"):
        why = unsafe_segment(part)
        if why is not None:
            raise DocumentError(at, f"{file_path!r}: part {part!r} {why}; each part of a save "
                                "path must be one safe file name")
    return name


def _check_fit(doc: Document, step: Fit, mine: list[Entry], at: Path) -> None:
    if not step.params:  # V25: an optimizer over nothing trains nothing
        raise DocumentError(at + ("params",), "a fit trains at least one featurizer; "
                            "params is empty")
    for j, name in enumerate(step.params):
        here = at + ("params", j)
        if name in step.params[:j]:
            raise DocumentError(here, f"{name!r} is listed twice; each featurizer is trained once")
        _declared_featurizer(doc, name, here)
        if not FEATURIZER_KINDS[doc.featurizers[name].kind]["trainable"]:
            raise DocumentError(here, f"{name!r} is a {doc.featurizers[name].kind} featurizer, "
                                "which is loaded and never trained")
    gates = {g for g in step.params if doc.featurizers[g].kind == "gate"}
    metrics = set.intersection(*(set(e.body.metrics) for e in mine)) if mine else set()
    for j, (_, term) in enumerate(step.objective):
        if term not in metrics and term not in {f"{g}.mask" for g in gates}:
            raise DocumentError(at + ("objective", j, 1), f"objective term {term!r} is neither "
                                f"a metric ({', '.join(sorted(metrics)) or 'none'}) nor "
                                "<gate>.mask for a gate this fit trains")
    for g in step.anneal:
        _declared_featurizer(doc, g, at + ("anneal", g))
        if g not in gates:
            raise DocumentError(at + ("anneal", g), f"anneal is for a gate this fit trains; "
                                f"{g!r} is not one (trained gates: {', '.join(sorted(gates)) or 'none'})")
    if step.early_stop.metric not in metrics:
        raise DocumentError(at + ("early_stop", "metric"), f"early_stop watches "
                            f"{step.early_stop.metric!r}, which is not a metric "
                            f"({', '.join(sorted(metrics)) or 'none'})")


def _declared_featurizer(doc: Document, name: str, at: Path) -> None:
    if name not in doc.featurizers:
        known = ", ".join(doc.featurizers) or "none"
        hint = f" ('{IDENTITY}' has no parameters)" if name == IDENTITY else ""
        raise DocumentError(at, f"no featurizer named {name!r} (declared: {known}){hint}")


def _check_weights(doc: Document, step: Weights, at: Path) -> None:
    for j, name in enumerate(step.names):
        _declared_featurizer(doc, name, at + ("names", j))
        kind = doc.featurizers[name].kind
        if not FEATURIZER_KINDS[kind]["exportable"]:
            raise DocumentError(at + ("names", j), f"{name!r} is a {kind} featurizer, which "
                                "has no fitted weight to export")


def _uses(entries: list[Entry]) -> set[str]:
    return {node.featurizer for e in entries
            for node in list(e.body.reads.values()) + list(e.body.writes.values())
            if node.featurizer != IDENTITY}


def _check_training_order(doc: Document, entries: dict[str, list[Entry]]) -> None:
    """A step may not run a featurizer that only a later fit trains (V24)."""
    names = list(doc.steps)
    trains = [set(step.params) if isinstance(step, Fit) else set() for step in doc.steps.values()]
    for i, s in enumerate(names):
        trained_so_far = set().union(*trains[:i + 1])
        for name in sorted(_uses(entries.get(s, [])) - trained_so_far):
            later = [names[j] for j in range(i + 1, len(names)) if name in trains[j]]
            if later:
                raise DocumentError(("steps", s), f"step uses featurizer {name!r} before fit "
                                    f"{later[0]!r} trains it; move the step after the fit or "
                                    "declare a separate featurizer for an untrained baseline")
