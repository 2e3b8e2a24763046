"""Passes: one intervention over one step's rows, as reads, writes, forwards, batches and metrics.

Reads the validated point (the schema objects, their defaults already filled) and the data
tables; knows nothing about weights. Model anatomy comes from ``addresses``, order from ``schedule``.
"""
from __future__ import annotations

import json

from dataclasses import dataclass, field
from typing import Any

from causalab.compile import schedule
from causalab.compile.addresses import Facts
from causalab.compile.plan import (Address, MetricOp, Operand, Pass, PromptBatch, ReadOp,
                                   WriteOp)
from causalab.compile.positions import position_spec
from causalab.compile.prompts import prompt_batch, single_token
from causalab.compile.rows import Table, anchor_values, column_cells, load_rows, role_values
from causalab.document import vocab
from causalab.document.interventions import Intervention, Ref
from causalab.document.schema import Document
from causalab.errors import CompileError


@dataclass
class Context:
    """What every pass of one point compiles against."""

    document: Document
    config: Any
    tokenizer: Any
    data_root: str
    facts: Facts
    addresses: dict[str, Address]
    featurizers: dict[str, Any] = field(default_factory=dict)
    # Output name -> {reduce, rows, width, k}: what earlier steps published (C10, C19).
    published: dict[str, dict] = field(default_factory=dict)
    # What the points of one compile share (``_shared``): row tables and prompt batches.
    shared: dict = field(default_factory=dict)
    # The data files this point's passes read (its resume key covers them: compile/inputs.py).
    tables: set = field(default_factory=set)


@dataclass(frozen=True)
class Entry:
    """One intervention a step runs: its registered name, body and JSON path."""

    name: str
    body: Intervention
    path: tuple


def entries(document: Document, step: str, spelled: Any) -> list[Entry]:
    """The step's ``interventions`` field as entries (docs/format.md §9.1): name, inline or a list."""
    def one(value: Any, inline_name: str, path: tuple) -> Entry:
        if isinstance(value, str):
            return Entry(value, document.interventions[value], ("interventions", value))
        return Entry(inline_name, value, path)

    base = ("steps", step, "interventions")
    if isinstance(spelled, list):
        return [one(v, f"{step}[{i}]", base + (i,)) for i, v in enumerate(spelled)]
    return [one(spelled, step, base)]


def _read_ops(entry: Entry, ctx: Context) -> dict[str, ReadOp]:
    reads = {}
    for name, r in entry.body.reads.items():
        reads[name] = ReadOp(
            name=name, site=r.site, address=ctx.addresses[r.site], pos=position_spec(r.pos),
            input=r.input, model=r.model, featurizer=r.featurizer, view=r.view)
    return reads


def _write_ops(entry: Entry, ctx: Context) -> dict[str, WriteOp]:
    writes = {}
    for name, w in entry.body.writes.items():
        writes[name] = WriteOp(
            name=name, site=w.site, address=ctx.addresses[w.site], pos=position_spec(w.pos),
            mechanism=w.mechanism, operand=_operand(w.operand), featurizer=w.featurizer,
            features=tuple(w.features) if w.features is not None else None,
            params=dict(w.params))
    return writes


def _operand(operand: Any) -> Operand:
    """The authored operand as plan data: none, a literal, a published ref or a read's name."""
    if operand is None:
        return Operand("none")
    if isinstance(operand, Ref):
        return Operand("ref", name=operand.ref)
    if isinstance(operand, str):
        return Operand("read", name=operand)
    return Operand("literal", value=float(operand))


def _shared(ctx: Context, key: tuple, build):
    """``build()`` once per compile for ``key``: the points of a sweep read the same rows."""
    if key not in ctx.shared:
        ctx.shared[key] = build()
    return ctx.shared[key]


def _tables(rows: dict, roles: list[str], path: tuple, ctx: Context) -> dict[str, Table]:
    """Each used role's rows; every role must give the same number of rows (C1).

    Validate (V10) has already refused a step lacking rows for a role a forward runs on.
    """
    tables = {role: _shared(ctx, ("rows", rows[role], path + (role,)),
                            lambda role=role: load_rows(rows[role], ctx.data_root, path + (role,)))
              for role in roles}
    ctx.tables.update(t.file for t in tables.values())
    counts = {role: len(t.rows) for role, t in tables.items()}
    for role, count in counts.items():
        if count != counts[roles[0]]:
            raise CompileError(path + (role,), f"roles resolve to different row counts: {counts}")
    return tables


def _batches(forwards, tables: dict[str, Table], entry: Entry, rows_path: tuple,
             ctx: Context) -> dict[str, PromptBatch]:
    """Tokenize each role once; anchor values for every variable an op on it names (C14).
    A role's batch is built once per compile for its rows, field and variables."""
    batches = {}
    for role, table in tables.items():
        field_path = ctx.document.roles[role].field
        anchored = {}
        for fw in forwards:
            if fw.input != role:
                continue
            for kind, op in [("reads", r) for r in fw.reads] + [("writes", w) for w in fw.writes]:
                var = op.pos.variable
                if var and var not in anchored:
                    anchored[var] = entry.path + (kind, op.name, "pos", "scope", "variable")
        key = ("batch", role, table.ref, field_path, tuple(anchored.items()), rows_path)
        batches[role] = _shared(ctx, key, lambda: _batch(role, table, field_path, anchored,
                                                         rows_path, ctx))
    return batches


def _batch(role: str, table: Table, field_path: str, anchored: dict, rows_path: tuple,
           ctx: Context) -> PromptBatch:
    variables = {var: anchor_values(table, field_path, var, where)
                 for var, where in anchored.items()}
    values = role_values(table, field_path, rows_path + (role,))
    return prompt_batch(role, field_path, values, ctx.tokenizer, variables, rows_path + (role,),
                        positions=_positions(ctx.config), example_ids=table.example_ids,
                        generation_prompt=ctx.document.roles[role].generation_prompt)


def _check_segments(forwards, ctx: Context, entry: Entry) -> None:
    """C15: a chat segment on a checkpoint without a chat template."""
    if getattr(ctx.tokenizer, "chat_template", None):
        return
    for fw in forwards:
        for kind, op in [("reads", r) for r in fw.reads] + [("writes", w) for w in fw.writes]:
            if op.pos.segment and op.pos.segment != "eos":
                raise CompileError(entry.path + (kind, op.name, "pos", "scope", "segment"),
                                   "chat segments need a chat template; this checkpoint has none")


def _metric_ops(entry: Entry, reads: dict[str, ReadOp], tables: dict[str, Table],
                ctx: Context) -> tuple[MetricOp, ...]:
    """Column token ids and the column-eligible rows of every metric (C17)."""
    ops = []
    for name, m in entry.body.metrics.items():
        kind = _kind(m.kind)
        read = reads[m.of]
        table = tables[read.input]
        ids, eligible = [], set(range(len(table.rows)))
        for column_field in kind["columns"]:
            path = entry.path + ("metrics", name, column_field)
            cells = column_cells(table, getattr(m, column_field), path)
            column_ids = []
            for row, cell in enumerate(cells):
                if cell is None or cell == "":
                    eligible.discard(row)
                    column_ids.append(-1)
                    continue
                if not isinstance(cell, str):  # 7 read as the text "7" scored a token no one wrote
                    raise CompileError(path, f"row {row}: {json.dumps(cell)} is not a string; "
                                             "an answer cell is the answer's text")
                token = single_token(ctx.tokenizer, cell)
                if token is None:
                    raise CompileError(path, f"row {row}: {cell!r} is not exactly one token")
                column_ids.append(token)
            ids.append(tuple(column_ids))
        if not eligible:
            raise CompileError(entry.path + ("metrics", name, kind["columns"][0]),
                               "no row has every column this metric names: a mean of no rows")
        ops.append(MetricOp(
            name=name, kind=m.kind, of=m.of, model=read.model, input=read.input,
            columns=tuple(getattr(m, c) for c in kind["columns"]), token_ids=tuple(ids),
            eligible=tuple(sorted(eligible)), unit=kind["unit"],
            estimand_version=kind["estimand_version"],
            reads=tuple(getattr(m, field) for field in kind["reads"])))
    return tuple(ops)


def _kind(kind: str) -> dict:
    """A metric kind's row of the vocabulary: ordered column fields, unit, estimand version."""
    row = vocab.METRIC_KINDS[kind]
    row = row if isinstance(row, dict) else vars(row)
    return {"columns": tuple(row["columns"]), "reads": tuple(row.get("reads", ())),
            "unit": row["unit"],
            "estimand_version": row.get("estimand_version", f"{kind}/v1")}


def _positions(config: Any) -> int | None:
    """The checkpoint's position table: no prompt, with what a decode adds, may run past it."""
    config = getattr(config, "text_config", None) or config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def _check_context(decode: int, batch, entry: Entry, ctx: Context) -> None:
    """A decode that would run past the checkpoint's context is refused, not run (and hung on)."""
    context = _positions(ctx.config)
    if decode and context and batch.tokens + decode > context:
        raise CompileError(entry.path + ("decode",), f"decode {decode} after prompts of "
                           f"{batch.tokens} tokens needs {batch.tokens + decode} positions; "
                           f"the checkpoint's context is {context}")


def _static_checks(forwards, reads, batches, rows: int, entry: Entry, ctx: Context) -> None:
    decode = entry.body.decode
    for fw in forwards:
        batch = batches[fw.input]
        for read in fw.reads:
            schedule.check_fixed_cuts(read.name, read.pos, batch,
                                      entry.path + ("reads", read.name, "pos"))
            width = ctx.facts.vocab if read.view == "logits" else (
                read.address.width or read.address.full_width)
            schedule.check_stacked(read, width, decode, rows,
                                   entry.path + ("reads", read.name, "pos"))
        for write in fw.writes:
            wpath = entry.path + ("writes", write.name)
            schedule.check_fixed_cuts(write.name, write.pos, batch, wpath + ("pos",))
            space = schedule.featurizer_space(write.featurizer, ctx.featurizers, write.address.width)
            schedule.check_features(write, space, wpath + ("features",))
            schedule.check_ref_operand(write, ctx.published, rows, wpath + ("operand",))
            if write.operand.kind == "read":
                source = reads[write.operand.name]
                schedule.check_operand_space(write, source, ctx.featurizers, wpath + ("operand",))
                schedule.check_pattern_operand(write, source, batches[source.input], batch,
                                               wpath + ("operand",))
    for fw in forwards:
        _check_context(decode, batches[fw.input], entry, ctx)


def _check_placed(forwards, batches, example_ids: tuple, entry: Entry, ctx: Context) -> None:
    """C23 on every read and write: decoded with the tokenizer the engine decodes with."""
    def decode_text(ids):
        return ctx.tokenizer.decode(list(ids))
    for fw in forwards:
        for kind, op in [("reads", r) for r in fw.reads] + [("writes", w) for w in fw.writes]:
            schedule.check_placed_somewhere(op.name, op.pos, batches[fw.input], decode_text,
                                            example_ids, entry.path + (kind, op.name, "pos"))


def build_pass(entry: Entry, rows: dict, rows_path: tuple, ctx: Context) -> Pass:
    """Compile one intervention over one ``rows`` mapping into a :class:`Pass`."""
    reads, writes = _read_ops(entry, ctx), _write_ops(entry, ctx)
    models = {m: list(spec.writes) for m, spec in entry.body.models.items()}
    forwards = schedule.build_forwards(reads, writes, models, entry.body.decode, entry.path)
    roles = [role for role in ctx.document.roles if any(fw.input == role for fw in forwards)]
    tables = _tables(rows, roles, rows_path, ctx)
    _check_segments(forwards, ctx, entry)
    batches = _batches(forwards, tables, entry, rows_path, ctx)
    count = len(next(iter(tables.values())).rows) if tables else 0
    _static_checks(forwards, reads, batches, count, entry, ctx)
    example_ids = tables[roles[0]].example_ids if roles else ()
    _check_placed(forwards, batches, example_ids, entry, ctx)
    metrics = _metric_ops(entry, reads, tables, ctx)
    dynamic = any(op.pos.dynamic for fw in forwards for op in fw.reads + fw.writes)
    return Pass(intervention=entry.name, rows=count, example_ids=example_ids,
                inputs=batches, forwards=forwards, metrics=metrics, dynamic=dynamic)


def pass_tables(rows: dict, ctx: Context, path: tuple) -> dict[str, Table]:
    """The tables a rows mapping selects, for checks that compare two mappings (C18)."""
    tables = {role: load_rows(ref, ctx.data_root, path + (role,)) for role, ref in rows.items()}
    ctx.tables.update(t.file for t in tables.values())
    return tables
