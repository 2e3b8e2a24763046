"""Steps: observe, fit and weights steps as plan nodes, with outputs, saves and fit batches.

Consumes passes from ``passes`` and the validated step objects (their defaults filled by the
schema); knows nothing about tensors. A fit's update batches are
shuffled here, on the client, from the fit's ``seed`` (docs/format.md §9.5, pitfall 14).
"""
from __future__ import annotations

import math
import random

from causalab.compile import schedule
from causalab.compile.passes import Context, Entry, build_pass, entries, pass_tables
from causalab.compile.plan import Fit, Observe, OutputOp, Pass, Plan, Weights
from causalab.compile.saves import save_ops
from causalab.compile.rows import shared_rows
from causalab.document.references import step_entries
from causalab.document.schema import Fit as FitStep
from causalab.document.schema import Observe as ObserveStep
from causalab.document.schema import Save, Step
from causalab.document.schema import Weights as WeightsStep
from causalab.document.references import produced
from causalab.document.vocab import MAX_UPDATES, METRIC_KINDS, SAELENS_HOOKS
from causalab.errors import CompileError
from causalab.files import TENSOR_SUFFIX

# A metric kind's ordered column fields: where C17 points when a batch has none of its rows.
_COLUMNS = {kind: tuple(row["columns"]) for kind, row in METRIC_KINDS.items()}


def _outputs(step: str, raw: ObserveStep, pass_: Pass, ctx: Context) -> tuple[OutputOp, ...]:
    """Outputs as plan ops; publishes each so later operands can be checked (C10, C19)."""
    ops = []
    reads = {r.name: (r, fw) for fw in pass_.forwards for r in fw.reads}
    for name, out in raw.outputs.items():
        op = OutputOp(name=name, read=out.read, reduce=out.reduce, k=out.k)
        read, fw = reads[op.read]
        if op.reduce == "pca":
            count = schedule.vector_count(read, pass_.inputs[fw.input])
            if count is not None and count < op.k:
                raise CompileError(("steps", step, "outputs", name, "k"),
                                   f"pca of rank {op.k} needs at least {op.k} vectors; "
                                   f"{op.read!r} yields {count}")
        ctx.published[name] = {"reduce": op.reduce, "rows": pass_.rows, "width": read.pos.width,
                               "k": op.k}
        ops.append(op)
    return tuple(ops)


def _check_saelens_saves(step: str, raw: ObserveStep, pass_: Pass) -> None:
    """A ``reduce: sae`` output saved to a folder is written as SAELens writes one, so its
    site needs a SAELens hook name (docs/format.md §9.3); a ``.safetensors`` path needs none."""
    reads = {r.name: r for fw in pass_.forwards for r in fw.reads}
    for index, save in enumerate(raw.saves):
        out = raw.outputs.get(save.value)
        if out is None or out.reduce != "sae" or save.file_path.endswith(TENSOR_SUFFIX):
            continue
        address = reads[out.read].address
        if (address.component not in SAELENS_HOOKS.values() or address.layer is None
                or address.heads is not None or address.units is not None):
            raise CompileError(("steps", step, "saves", index, "file_path"),
                               f"a SAELens folder needs a whole site with a SAELens hook "
                               f"({', '.join(sorted(set(SAELENS_HOOKS.values())))}); "
                               f"{out.read!r} reads {address.component}: save it to a "
                               ".safetensors file instead")


def observe(step: str, raw: ObserveStep, entry: Entry, ctx: Context) -> Observe:
    pass_ = build_pass(entry, raw.rows, ("steps", step, "rows"), ctx)
    outputs = _outputs(step, raw, pass_, ctx)
    _check_saelens_saves(step, raw, pass_)
    return Observe(name=step, pass_=pass_, outputs=outputs, saves=save_ops(raw.saves))


def update_batches(rows: int, pairs: int, epochs: int, seed: int) -> tuple:
    """``batches[epoch][update]``: row indices, reshuffled each epoch by one seeded generator."""
    rng = random.Random(seed)
    epochs_out = []
    for _ in range(epochs):
        order = list(range(rows))
        rng.shuffle(order)
        epochs_out.append(tuple(tuple(order[i:i + pairs]) for i in range(0, rows, pairs)))
    return tuple(epochs_out)


def _check_batches(train: Pass, batches: tuple, entry: Entry) -> None:
    """C17 per update: every metric keeps a column-eligible row in every batch."""
    for metric in train.metrics:
        eligible = set(metric.eligible)
        for epoch, updates in enumerate(batches):
            for update, rows in enumerate(updates):
                if not eligible.intersection(rows):
                    field = _COLUMNS[metric.kind][0]
                    raise CompileError(entry.path + ("metrics", metric.name, field),
                                       f"epoch {epoch} update {update} (rows {list(rows)}) has "
                                       "no row with every column this metric names")


def _check_disjoint(step: str, raw: FitStep, ctx: Context) -> None:
    """C18: fit and eval rows that are different refs must share no row."""
    path = ("steps", step, "eval", "rows")
    train = pass_tables(raw.rows, ctx, ("steps", step, "rows"))
    held = pass_tables(raw.eval.rows, ctx, path)
    for role, table in held.items():
        other = train.get(role)
        if other is None or other.ref == table.ref:
            continue
        shared = shared_rows(other, table)
        if shared:
            raise CompileError(path + (role,), f"fit rows {other.ref!r} and eval rows "
                                               f"{table.ref!r} share {shared} rows")


def fit(step: str, raw: FitStep, entry: Entry, ctx: Context) -> Fit:
    _check_disjoint(step, raw, ctx)
    train = build_pass(entry, raw.rows, ("steps", step, "rows"), ctx)
    held = build_pass(entry, raw.eval.rows, ("steps", step, "eval", "rows"), ctx)
    updates = raw.epochs * -(-train.rows // raw.pairs)
    if updates > MAX_UPDATES:  # the plan holds every update's rows: bound it before building
        raise CompileError(("steps", step, "epochs"), f"{raw.epochs} epochs of "
                           f"{train.rows} rows in pairs of {raw.pairs} make {updates} "
                           f"updates, more than MAX_UPDATES = {MAX_UPDATES}")
    batches = update_batches(train.rows, raw.pairs, raw.epochs, raw.seed)
    _check_batches(train, batches, entry)
    optimizer, stop = raw.optimizer, raw.early_stop
    return Fit(
        name=step, train=train, batches=batches, eval=held, params=tuple(raw.params),
        objective=tuple((float(w), term) for w, term in raw.objective),
        epochs=raw.epochs, pairs=raw.pairs, seed=raw.seed, lr=float(optimizer.lr),
        weight_decay=float(optimizer.weight_decay), early_stop_metric=stop.metric,
        early_stop_mode=stop.mode, patience=stop.patience,
        anneal={g: (float(a.start), float(a.end)) for g, a in raw.anneal.items()},
        saves=save_ops(raw.saves), eval_saves=save_ops(raw.eval.saves))


def weights(step: str, raw: WeightsStep) -> Weights:
    return Weights(name=step, names=tuple(raw.names), saves=save_ops(raw.saves))


def step_nodes(step: str, raw: Step, ctx: Context, directory: str) -> tuple:
    """One step as plan nodes: a node, or one nested Plan per entry of a list intervention."""
    if raw.kind == "weights":
        return (weights(step, raw),)
    if raw.kind == "attribute":
        from causalab.compile.attribution import attribute

        return (attribute(step, raw, entries(ctx.document, step, raw.interventions)[0], ctx),)
    build = observe if raw.kind == "observe" else fit
    found = entries(ctx.document, step, raw.interventions)
    if not isinstance(raw.interventions, list):
        return (build(step, raw, found[0], ctx),)
    nested = []
    names = [e.name for e in found]
    declared = {e.name: e for e in step_entries(ctx.document)[step]}
    for entry in found:
        # A list entry sees what earlier steps published, never a sibling's outputs.
        before = dict(ctx.published)
        mine = declared[entry.name]
        update = {"saves": _entry_saves(raw.saves, entry, names,
                                        produced(ctx.document, step, mine))}
        if raw.kind == "fit":
            update["eval"] = raw.eval.model_copy(update={"saves": _entry_saves(
                raw.eval.saves, entry, names,
                produced(ctx.document, step, mine, evaluation=True))})
        node = build(step, raw.model_copy(update=update), entry, ctx)
        ctx.published = before
        where = f"{directory}/{step}/{entry.name}" if directory else f"{step}/{entry.name}"
        nested.append(Plan(name=entry.name, directory=where, children=(node,)))
    return tuple(nested)


def _entry_saves(saves: list[Save], entry: Entry, names: list[str],
                 produced_here: set[str]) -> list[Save]:
    """The saves of a list step that belong to this entry: qualified, or bare and produced."""
    mine = []
    for save in saves:
        head, _, rest = save.value.partition("/")
        if rest and head in names:
            if head == entry.name:
                mine.append(save.model_copy(update={"value": rest}))
        elif save.value in produced_here:
            mine.append(save)
    return mine
