"""Rules between a step and the rest of its point: rows, outputs, refs, saves, fits, order.

Decided offline from the validated ``Document`` and the step entries ``references.py``
registered. What each step *produces* (metrics, outputs, generated ids, fit traces, weights)
is computed here once and read by the save rules. No file is opened: containment and
collisions are checked on the path strings.
"""
from __future__ import annotations

import posixpath

from causalab.document.attribution import check_attribute
from causalab.document.names import mlflow_key, unsafe_segment
from causalab.document.references import Entry, operand_refs, roles_used
from causalab.document.schema import Attribute, Document, Fit, Observe, Save, Weights
from causalab.document.vocab import FEATURIZER_KINDS, IDENTITY, is_reserved_result
from causalab.errors import DocumentError, Path
from causalab.files import RESERVED, TABLE_SUFFIX, TENSOR_SUFFIX

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
        _featurizer(doc, name, here)
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
        _featurizer(doc, g, at + ("anneal", g))
        if g not in gates:
            raise DocumentError(at + ("anneal", g), f"anneal is for a gate this fit trains; "
                                f"{g!r} is not one (trained gates: {', '.join(sorted(gates)) or 'none'})")
    if step.early_stop.metric not in metrics:
        raise DocumentError(at + ("early_stop", "metric"), f"early_stop watches "
                            f"{step.early_stop.metric!r}, which is not a metric "
                            f"({', '.join(sorted(metrics)) or 'none'})")


def _featurizer(doc: Document, name: str, at: Path) -> None:
    if name not in doc.featurizers:
        known = ", ".join(doc.featurizers) or "none"
        hint = f" ('{IDENTITY}' has no parameters)" if name == IDENTITY else ""
        raise DocumentError(at, f"no featurizer named {name!r} (declared: {known}){hint}")


def _check_weights(doc: Document, step: Weights, at: Path) -> None:
    for j, name in enumerate(step.names):
        _featurizer(doc, name, at + ("names", j))
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
