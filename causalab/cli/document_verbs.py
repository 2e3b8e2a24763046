"""The ``causalab`` verbs that read a document, a model's config or a dataset: schema | vocab |
validate | data | model | tokens | explain | render (the command itself is :mod:`causalab.cli.main`).

Each verb is a function from parsed arguments to a dict with a ``text`` key and prints
nothing itself. None loads weights; ``schema``, ``vocab`` and ``validate`` import none of
torch, transformers, nnterp or mlflow, and ``explain`` imports the tracking layer only for a
``runs:/`` bundle it meets.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from causalab.errors import UsageError

_SAMPLE_CHARS = 200


def _read_document(path: str) -> dict:
    """The document at ``path`` as raw JSON (bytes checked by ``causalab.document.load``)."""
    from causalab.document import load_json

    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise UsageError((), f"cannot read document {path!r}: {err.strerror or err}") from None
    return load_json(data, name=path)


# --- verbs that need no model -------------------------------------------------------------

def verb_schema(args: argparse.Namespace) -> dict:
    """The JSON Schema of a document as written (sweeps allowed), the point form in its $defs."""
    from causalab.document import json_schema

    schema = json_schema()
    return {"text": json.dumps(schema, indent=2), "schema": schema}


def verb_vocab(args: argparse.Namespace) -> dict:
    """Every closed vocabulary: components, mechanisms, featurizer and metric kinds, positions."""
    from causalab.document import vocab

    return {"text": vocab.render_vocab(), **vocab.vocab_payload()}


def verb_validate(args: argparse.Namespace) -> dict:
    """Lower every sweep point and check the document alone, offline (no model read: a layer
    the model does not have is ``explain``'s to refuse); refusals name the JSON path."""
    from causalab.document import naming_warnings, validate

    raw = _read_document(args.document)
    points = validate(raw)
    labels = [point.label for point, _ in points]
    warned = [{"path": ".".join(map(str, path)), "message": message}
              for path, message in naming_warnings(raw)]
    for warning in warned:  # a warning is one line on stderr; the document is still valid
        print(f"warning: {warning['path']}: {warning['message']}", file=sys.stderr)
    model = (raw.get("model") or {}).get("key") if isinstance(raw, dict) else None
    against = f"against {model}'s config and tokenizer" if model else "against its model"
    return {"text": f"ok: {args.document} is a valid document on its own (validate reads no "
                    f"model; causalab explain {args.document} checks it {against})",
            "ok": True, "checked": "document", "points": len(points), "labels": labels,
            "warnings": warned}


def verb_data(args: argparse.Namespace) -> dict:
    """A dataset reference's rows: count, columns, columns with empty cells, splits, a sample."""
    from causalab.compile.rows import load_rows

    table = load_rows(args.ref, args.data_root, (args.ref,))
    columns: list[str] = []
    for row in table.rows:
        columns += [name for name in row if name not in columns]
    empty = [name for name in columns
             if any(row.get(name) in (None, "", []) for row in table.rows)]
    splits: dict[str, int] = {}
    for row in table.rows:
        split = str(row.get("split", ""))
        splits[split] = splits.get(split, 0) + 1
    sample = table.rows[0]
    sample_text = json.dumps(sample, ensure_ascii=False)
    if len(sample_text) > _SAMPLE_CHARS:
        sample_text = sample_text[:_SAMPLE_CHARS] + "…"
    text = "\n".join([
        f"{args.ref}: {len(table.rows)} rows from {table.file}",
        f"columns: {', '.join(columns)}",
        f"empty cells in: {', '.join(empty) if empty else '(none)'}",
        "splits: " + ", ".join(f"{name or '(none)'}={n}" for name, n in splits.items()),
        f"sample ({table.example_ids[0]}): {sample_text}",
    ])
    return {"text": text, "ref": args.ref, "file": table.file, "rows": len(table.rows),
            "columns": columns, "empty_columns": empty, "splits": splits,
            "example_ids": list(table.example_ids), "sample": sample}


# --- verbs that need a tokenizer or a config ---------------------------------------------

def verb_model(args: argparse.Namespace) -> dict:
    """A checkpoint's facts without its weights: path, shape, padding, every component's place."""
    from causalab.compile.addresses import component_table, facts
    from causalab.models import load_config, load_tokenizer, resolve

    resolved = resolve(args.key, args.revision)
    config = load_config(resolved.path)
    tokenizer = load_tokenizer(resolved.path)
    found = facts(config)
    table = component_table(config, args.attn_implementation)
    payload = {
        "key": resolved.key, "path": resolved.path, "revision": resolved.revision,
        "builtin": resolved.builtin, "dtype": args.dtype,
        "attn_implementation": args.attn_implementation,
        "num_layers": found.layers, "hidden_size": found.hidden, "num_heads": found.q_heads,
        "num_kv_heads": found.kv_heads, "head_dim": found.head_dim,
        "intermediate_size": found.intermediate, "vocab_size": found.vocab,
        "padding_side": tokenizer.padding_side, "components": table,
    }
    lines = [
        f"{resolved.key}  revision={resolved.revision}",
        f"path: {resolved.path}",
        f"layers={found.layers} hidden={found.hidden} heads={found.q_heads} "
        f"kv_heads={found.kv_heads} head_dim={found.head_dim} "
        f"intermediate={found.intermediate} vocab={found.vocab} "
        f"padding_side={tokenizer.padding_side}",
        "components at layer 0:",
    ]
    for name, row in table.items():
        if row["resolves"]:
            width = f"width={row['width']}" if row["width"] is not None else "no width"
            lines.append(f"  {name:<22} ok {width:<12} {row['op']}")
        else:
            lines.append(f"  {name:<22} -- {row['why']}")
    return {"text": "\n".join(lines), **payload}


def verb_tokens(args: argparse.Namespace) -> dict:
    """Each string's token count on a checkpoint's tokenizer; a metric column needs exactly 1."""
    from causalab.models import load_tokenizer, resolve

    for index, string in enumerate(args.strings, start=1):
        try:
            string.encode("utf-8")
        except UnicodeEncodeError:  # argv bytes that were not UTF-8, kept as surrogates
            raise UsageError(("strings",), f"string {index} ({os.fsencode(string)!r}) is not "
                                           "UTF-8 text, so no tokenizer can read it") from None
    tokenizer = load_tokenizer(resolve(args.key, args.revision).path)
    found, lines = [], []
    for string in args.strings:
        ids = tokenizer(string, add_special_tokens=False)["input_ids"]
        pieces = [tokenizer.decode([i]) for i in ids]
        single = len(ids) == 1
        found.append({"string": string, "count": len(ids), "ids": ids, "pieces": pieces,
                      "single": single})
        flag = "" if single else "  <- not one token: cannot be a metric column"
        noun = "token" if len(ids) == 1 else "tokens"
        lines.append(f"{string!r:<16} {len(ids)} {noun} {pieces!r}{flag}")
    return {"text": "\n".join(lines), "key": args.key, "tokens": found,
            "all_single": all(t["single"] for t in found)}


def verb_explain(args: argparse.Namespace) -> dict:
    """The compiled plan tree, against config, tokenizer and data; no weights."""
    import causalab.compile

    raw = _read_document(args.document)
    plan = causalab.compile.compile_document(raw, data_root=args.data_root,
                                             resolver=_known_store(args))
    _unchecked(causalab.compile.unchecked(plan) + _unchecked_pins(plan), args.strict)
    if args.traces:  # the traces a run opens, planned from config and tokenizer alone
        from causalab.engine.dry_run import explain_traces

        return explain_traces(plan, args.memory)
    if not args.json:  # the serialised plan costs as much as compiling it; text needs none
        return {"text": causalab.compile.explain(plan)}
    return causalab.compile.explain_payload(plan)


def _unchecked(notes: list, strict: bool) -> None:
    """Each check compile could not make, one ``note:`` line on stderr; a refusal with --strict."""
    from causalab.errors import CompileError, format_path

    if strict and notes:
        raise CompileError(*notes[0])
    for path, why in notes:
        print(f"note: {format_path(path)}: {why}", file=sys.stderr)


def _unchecked_pins(plan) -> list[tuple[tuple, str]]:
    """``(model.revision, why)`` once per local model directory whose pin only a run's load
    can check (``causalab.models.resolve.unchecked_pin``)."""
    from causalab.models.resolve import unchecked_pin

    points = [plan] if plan.model is not None else list(plan.children)
    models = {(m.key, m.path, m.revision) for m in (getattr(p, "model", None) for p in points) if m}
    return [(("model", "revision"), why) for why in
            sorted({unchecked_pin(*model) for model in models} - {None})]


def _known_store(args: argparse.Namespace):
    """A ``runs:/`` resolver when a tracking URI is known (flag, MLFLOW_TRACKING_URI or an
    ./mlflow.db already there), so explain checks tracked bundles' stamps; else None."""
    if not (args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or os.path.exists("mlflow.db")):
        return None

    def resolve(uri: str) -> str:  # imports the tracking layer only when a URI is met
        from causalab.tracking import resolve_artifact

        return resolve_artifact(uri, args.tracking_uri)
    return resolve


def verb_render(args: argparse.Namespace) -> dict:
    """The canonical document a Hydra composition renders to (docs/platform.md §4); one that
    would not validate is refused at its path, as a run of it would be."""
    from causalab.document import validate
    from causalab.hydra.rendering import render

    document = render(list(args.overrides), config_dir=args.config_dir)
    validate(document)
    return {"text": json.dumps(document, indent=2, ensure_ascii=False), "document": document}
