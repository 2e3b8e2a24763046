"""Scheduling: which forwards an intervention needs, in which order, with taps in forward order.

Works on plan ops already bound to addresses; it never tokenizes and never loads rows. Static
checks that need only ops and prompt lengths live here too: model-graph cycles (C12), unfittable
fixed cuts (C16), featurizer widths and features (C6, C7, C9), operands (C10, C11), the stacked
generated-read bound (C13) and pca vector counts (C19).
"""
from __future__ import annotations

from typing import Any

from causalab.compile.plan import Forward, PromptBatch, ReadOp, WriteOp
from causalab.compile.positions import MISSING, OUT_OF_RANGE, cut, resolve
from causalab.document.vocab import IDENTITY
from causalab.errors import CompileError

STACKED_BOUND = 256 * 2**20


def forward_keys(reads: dict[str, ReadOp]) -> list[tuple[str, str]]:
    """(model, input) pairs some read names, in first-named order."""
    keys: list[tuple[str, str]] = []
    for read in reads.values():
        if (read.model, read.input) not in keys:
            keys.append((read.model, read.input))
    return keys


def _operand_reads(writes: dict[str, WriteOp], names: list[str]) -> list[str]:
    return [writes[w].operand.name for w in names if writes[w].operand.kind == "read"]


def order_forwards(keys: list[tuple[str, str]], reads: dict[str, ReadOp],
                   writes: dict[str, WriteOp], models: dict[str, list[str]],
                   path: tuple) -> list[tuple[str, str]]:
    """Topological order: a forward whose writes take a read runs after that read's forward."""
    needs = {}
    for key in keys:
        sources = _operand_reads(writes, models.get(key[0], []))
        needs[key] = {(reads[r].model, reads[r].input) for r in sources}
    done: list[tuple[str, str]] = []
    while len(done) < len(keys):
        ready = [k for k in keys if k not in done and needs[k] <= set(done)]
        if not ready:
            stuck = sorted({k[0] for k in keys if k not in done})
            raise CompileError(path, f"the models {stuck} depend on each other in a cycle")
        done.append(ready[0])
    return done


def taps(writes: tuple[WriteOp, ...], reads: tuple[ReadOp, ...]) -> tuple[tuple[str, str], ...]:
    """Issue order: address order, writes before reads at one address, writes as listed."""
    keyed = [((w.address.order, 0, i), ("write", w.name)) for i, w in enumerate(writes)]
    keyed += [((r.address.order, 1, i), ("read", r.name)) for i, r in enumerate(reads)]
    return tuple(tap for _, tap in sorted(keyed, key=lambda item: item[0]))


def build_forwards(reads: dict[str, ReadOp], writes: dict[str, WriteOp],
                   models: dict[str, list[str]], decode: int, ipath: tuple) -> tuple[Forward, ...]:
    """Every forward the intervention's reads name, sorted; each with its writes and taps."""
    keys = order_forwards(forward_keys(reads), reads, writes, models, ipath + ("models",))
    forwards = []
    for model, role in keys:
        its_writes = tuple(writes[w] for w in models.get(model, []))
        its_reads = tuple(r for r in reads.values() if (r.model, r.input) == (model, role))
        forwards.append(Forward(model=model, input=role, writes=its_writes, reads=its_reads,
                                taps=taps(its_writes, its_reads), decode=decode))
    return tuple(forwards)


def check_fixed_cuts(op_name: str, spec, batch: PromptBatch, path: tuple) -> None:
    """C16: a fixed-width, un-anchored prompt cut that some row cannot fit."""
    if spec.dynamic or spec.width is None:
        return
    bad = [row for row, length in enumerate(batch.lengths)
           if cut(spec, length)[1] == OUT_OF_RANGE]
    if bad:
        raise CompileError(path, f"{op_name!r}: rows {bad} cannot fit this cut ({OUT_OF_RANGE}; "
                                 f"prompt lengths {[batch.lengths[r] for r in bad]})")


def check_placed_somewhere(op_name: str, spec, batch: PromptBatch, decode_text: Any,
                           example_ids: tuple, path: tuple) -> None:
    """C23: a prompt cut that selects no token on any row (a chat segment plain rows lack, a
    span empty on every row) would fail only after the weights load. Resolved row by row with
    the engine's own rule, stopping at the first row it places, so a working cut costs one row."""
    if spec.frame != "prompt":
        return
    reasons = []
    for row in range(len(batch.input_ids)):
        window, reason = resolve(spec, batch, row, decode_text)
        if window:
            return
        reasons.append(reason or MISSING)
    if not reasons:
        return
    names = [str(example_ids[r]) if r < len(example_ids) else str(r) for r in range(len(reasons))]
    shown = ", ".join(names[:5]) + (f", … ({len(names)} rows)" if len(names) > 5 else "")
    why = ", ".join(sorted(set(reasons)))
    raise CompileError(path, f"{op_name!r} selects no token on any row ({why} on every row: "
                             f"{shown}); check its scope or span against the rows")


def vector_count(read: ReadOp, batch: PromptBatch) -> int | None:
    """Vectors a read yields over all rows, when the positions alone decide it."""
    if read.pos.dynamic:
        return None
    return sum(len(cut(read.pos, length)[0]) for length in batch.lengths)


def check_stacked(read: ReadOp, width: int | None, decode: int, rows: int, path: tuple) -> None:
    """C13: a generated-frame read stacked per decode step above 256 MiB."""
    spec = read.pos
    if spec.frame != "generated" or (spec.index is not None and spec.index >= 0):
        return
    size = decode * rows * (width or 1) * 4
    if size > STACKED_BOUND:
        raise CompileError(path, f"stacking {read.name!r} over {decode} steps x {rows} rows x "
                                 f"{width} wide needs {size / 2**20:.0f} MiB (bound 256 MiB); "
                                 "name a single step, decode fewer tokens or use fewer rows")


def featurizer_space(name: str, specs: dict[str, Any], width: int | None) -> int | None:
    """Size of a featurizer's feature space: site width for identity and gate, else k."""
    if name == IDENTITY:
        return width
    spec = specs.get(name)
    if spec is None:
        return None
    return spec.d if spec.kind == "gate" else spec.k


def check_features(write: WriteOp, space: int | None, path: tuple) -> None:
    """C9: ``features`` distinct and inside the featurizer's space."""
    if write.features is None:
        return
    if len(set(write.features)) != len(write.features):
        raise CompileError(path, f"features {list(write.features)} are not distinct")
    bad = [j for j in write.features if j < 0 or (space is not None and j >= space)]
    if bad:
        raise CompileError(path, f"feature {bad[0]} is outside a {space}-wide feature space")


def check_operand_space(write: WriteOp, read: ReadOp, specs: dict[str, Any], path: tuple) -> None:
    """A read operand must live in the write's feature space: as wide as that space, or as
    wide as the write's ``features`` cut of it (a read through another featurizer is not)."""
    ours = featurizer_space(write.featurizer, specs, write.address.width)
    theirs = featurizer_space(read.featurizer, specs, read.address.width)
    if ours is None or theirs is None or read.address.key_axis:
        return
    allowed = {ours} | ({len(write.features)} if write.features else set())
    if theirs not in allowed:
        raise CompileError(path, f"operand {read.name!r} is {theirs} features wide (via "
                                 f"{read.featurizer!r}) but write {write.name!r} acts on "
                                 f"{ours} (via {write.featurizer!r}); read the operand through "
                                 "the write's featurizer")


def check_ref_operand(write: WriteOp, published: dict[str, dict], rows: int, path: tuple) -> None:
    """C10/C11 for ``{"ref": …}``: pca bases, row counts, windows and key-axis patterns."""
    if write.operand.kind != "ref":
        return
    out = published.get(write.operand.name)
    if out is None:
        return
    if write.address.key_axis:
        raise CompileError(path, f"attention pattern {write.operand.name!r} was published by an "
                                 "earlier step, whose key layout is not known here")
    if out["reduce"] in ("pca", "sae"):
        raise CompileError(path, f"{write.operand.name!r} is a {out['reduce']} featurizer; load "
                                 "it as a featurizer instead of using it as an operand")
    if out["reduce"] != "none":
        return
    if out["rows"] != rows:
        raise CompileError(path, f"{write.operand.name!r} was read over {out['rows']} rows; "
                                 f"this write runs on {rows}")
    if None not in (out["width"], write.pos.width) and out["width"] != write.pos.width:
        raise CompileError(path, f"{write.operand.name!r} is {out['width']} positions wide; "
                                 f"this write's window is {write.pos.width}")


def check_pattern_operand(write: WriteOp, read: ReadOp, source: PromptBatch,
                          target: PromptBatch, path: tuple) -> None:
    """C11: a key-axis operand needs both prompts the same token length on every row."""
    if not write.address.key_axis:
        return
    a, b = source.lengths, target.lengths
    bad = [(row, x, y) for row, (x, y) in enumerate(zip(a, b)) if x != y]
    if bad:
        listed = ", ".join(f"row {r}: {x} vs {y}" for r, x, y in bad)
        raise CompileError(path, f"pattern {read.name!r} comes from prompts of other lengths ({listed})")
