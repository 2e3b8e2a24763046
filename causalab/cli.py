"""The ``causalab`` command: schema | vocab | model | tokens | data | validate | explain | run |
render | fetch | runs, each printing text or, with ``--json``, the whole result object.

Every verb is a function from parsed arguments to a dict with a ``text`` key and prints nothing
itself; ``main`` prints only after the verb returned, so a refusal leaves nothing half-written on
stdout. Heavy libraries (torch, transformers, nnterp, mlflow, hydra) are imported inside the verbs
that need them: ``schema``, ``vocab`` and ``validate`` import none of them. One boundary turns a
:class:`~causalab.errors.CausalabError` into one line, ``error: <path>: <message>``, on stderr
and exit status 1 (2 for a :class:`~causalab.errors.UsageError` or bad arguments); a traceback
is shown only with ``--debug``.

    >>> main(["vocab"])  # doctest: +SKIP
    0
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from causalab import flags
from causalab.document import vocab
from causalab.engine.events import Events
from causalab.errors import CausalabError, UsageError, format_path
from causalab.files import DEFAULT_DATA_ROOT, DEFAULT_OUT
from causalab.interrupts import INTERRUPTED, exit_status, interrupts, leave, one_line

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
_SAMPLE_CHARS = 200


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so bad arguments meet the one error boundary."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError((), f"{message} (see '{self.prog} --help')")


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
    """Lower every sweep point and check it offline; refusals name the JSON path."""
    from causalab.document import naming_warnings, validate

    raw = _read_document(args.document)
    points = validate(raw)
    labels = [point.label for point, _ in points]
    warned = [{"path": ".".join(map(str, path)), "message": message}
              for path, message in naming_warnings(raw)]
    for warning in warned:  # a warning is one line on stderr; the document is still valid
        print(f"warning: {warning['path']}: {warning['message']}", file=sys.stderr)
    return {"text": f"ok: {args.document} is a valid document", "ok": True,
            "points": len(points), "labels": labels, "warnings": warned}


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
    if not args.json:  # the serialised plan costs as much as compiling it; text needs none
        return {"text": causalab.compile.explain(plan)}
    return causalab.compile.explain_payload(plan)


def _known_store(args: argparse.Namespace):
    """A ``runs:/`` resolver when a tracking URI is known (flag, MLFLOW_TRACKING_URI or an
    ./mlflow.db already there), so explain checks tracked bundles' stamps; else None."""
    if not (args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or os.path.exists("mlflow.db")):
        return None

    def resolve(uri: str) -> str:  # imports the tracking layer only when a URI is met
        from causalab.tracking import resolve_artifact

        return resolve_artifact(uri, args.tracking_uri)
    return resolve


# --- verbs that run or reach the tracking store ------------------------------------------

class _Resolving(Events):
    """With ``--no-track``: log nothing, still read ``runs:/`` bundles from the tracking URI
    (MLFLOW_TRACKING_URI, ``--tracking-uri``, else ./mlflow.db); mlflow loads only if asked."""

    def __init__(self, tracking_uri: str | None) -> None:
        self.uri = tracking_uri
        self.skipped: dict[str, str] = {}

    def resolve(self, uri: str) -> str:
        from causalab.tracking import resolve_artifact

        return resolve_artifact(uri, self.uri)


def _tracking_events(args: argparse.Namespace) -> Any:
    """The MLflow listener for a run (docs/platform.md §5), or a ``runs:/`` reader with ``--no-track``."""
    if args.no_track:
        return _Resolving(args.tracking_uri)
    from causalab.tracking import TrackingEvents

    return TrackingEvents(tracking_uri=args.tracking_uri, rerun=args.rerun, out=args.out,
                          argv=list(args.argv))


def verb_run(args: argparse.Namespace) -> dict:
    """Run a document and list the files written, in order; nothing else is printed.

    With tracking on, a point that raises or is interrupted ends its MLflow run FAILED or
    KILLED (the listener's context exit), never left looking finished.
    """
    from causalab.engine.events import Chain
    from causalab.pipeline import run_document
    from causalab.progress import PointProgress

    raw = _read_document(args.document)
    events = _tracking_events(args)
    tracked = not args.no_track
    with events if tracked else contextlib.nullcontext():
        written = run_document(raw, out=args.out, batch_size=args.batch_size,
                               device_map=args.device_map, data_root=args.data_root,
                               events=Chain(events, PointProgress()),
                               resume_mib=args.resume_mib)
    written = [str(p) for p in written]
    skipped = [{"point": label or "<root>", "reused_run_id": run_id,
                "linked_run_id": getattr(events, "linked", {}).get(label)}
               for label, run_id in events.skipped.items()]
    for entry in skipped:  # stdout stays the list of files; what was reused is said beside it
        print(f"skipped {entry['point']}: done in run {entry['reused_run_id']}", file=sys.stderr)
    return {"text": "\n".join(written), "written": written, "out": args.out,
            "skipped": skipped}


def verb_render(args: argparse.Namespace) -> dict:
    """The canonical document a Hydra composition renders to (docs/platform.md §4); one that
    would not validate is refused at its path, as a run of it would be."""
    from causalab.document import validate
    from causalab.rendering import render

    document = render(list(args.overrides), config_dir=args.config_dir)
    validate(document)
    return {"text": json.dumps(document, indent=2, ensure_ascii=False), "document": document}


def verb_fetch(args: argparse.Namespace) -> dict:
    """Download one tracked artifact (``runs:/<run_id>/<path>``) to a local path."""
    from causalab.tracking import fetch

    convert = _basis_of(args.uri) if args.basis else None
    path = str(fetch(args.uri, args.output, tracking_uri=args.tracking_uri, convert=convert))
    return {"text": path, "path": path, "uri": args.uri}


def _basis_of(uri: str) -> Callable[[str, str], None]:
    """``fetch --basis``'s rewrite of the downloaded file, refused at ``--basis`` naming the
    URI (not the temporary file) when it is no subspace bundle."""
    def convert(source: str, target: str) -> None:
        from safetensors import SafetensorError

        from causalab.engine.featurizers.subspace import export_basis

        try:
            export_basis(source, target, named=uri)
        except (SafetensorError, OSError):
            raise UsageError(("--basis",), f"{uri} is not a safetensors bundle, so it has no "
                                           "basis to write") from None
    return convert


def verb_runs(args: argparse.Namespace) -> dict:
    """Tracked runs, newest first, optionally only those of one point digest."""
    from causalab.tracking import list_runs

    runs = list_runs(produced_by=args.produced_by, tracking_uri=args.tracking_uri)
    if not runs:
        from causalab.tracking.runs import resolve_uri, store_exists

        uri = resolve_uri(args.tracking_uri)  # list_runs creates no store that is not there
        if not store_exists(uri):
            return {"text": f"(no runs: there is no tracking store at {uri})", "runs": []}
    lines = [f"{r['run_id']}  {r['status']:<9} {(r.get('model') or '-'):<24} "
             f"{(r.get('job') or '-'):<32} {(r.get('name') or ''):<20} "
             f"{(r.get('produced_by') or '')[:12]}"
             f"{'  reuses ' + r['reused_from'] if r.get('reused_from') else ''}".rstrip()
             for r in runs]
    return {"text": "\n".join(lines) if lines else "(no runs)", "runs": runs}


def verb_server(args: argparse.Namespace) -> dict:
    """Start, stop or look at the team tracking stack (PostgreSQL + mlflow server)."""
    from causalab import server

    return server.verb(args)


# --- the parser ---------------------------------------------------------------------------

def _at_least(low: int) -> Callable[[str], int]:
    """An ``argparse`` type: an integer no smaller than ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {value}")
        return value
    return parse


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--json`` and ``--debug`` before or after the verb (after: only set when given)."""
    default = False if top else argparse.SUPPRESS
    parser.add_argument("--json", action="store_true", default=default,
                        help="print the whole result object as JSON")
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show a traceback on error")


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", help="built-in (causalab:tiny-llama), local directory or hub id")
    parser.add_argument("--revision", default="main", help="commit, tag or tensor digest")


def _run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("document")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: out)")
    parser.add_argument("--device-map", default="auto", type=flags.device_map,
                        help="accelerate device map (default: auto; use cpu without a GPU)")
    parser.add_argument("--batch-size", type=_at_least(1), default=None,
                        help="rows per forward window (default: the whole pass)")
    parser.add_argument("--resume-mib", type=_at_least(0), default=None,
                        help="MiB of un-intervened values kept for prefix resume "
                             "(default: 256; 0 turns resume off)")
    parser.add_argument("--data-root", default=None, help=f"default: {DEFAULT_DATA_ROOT}")
    parser.add_argument("--no-track", action="store_true", help="skip MLflow tracking")
    parser.add_argument("--tracking-uri", default=None, type=flags.tracking_uri)
    parser.add_argument("--rerun", action="store_true",
                        help="run points even when a finished run with their digest exists")


VERBS: dict[str, tuple[Callable[[argparse.Namespace], dict], str]] = {
    "schema": (verb_schema, "print the document JSON Schema"),
    "vocab": (verb_vocab, "print every closed vocabulary"),
    "model": (verb_model, "a checkpoint's shape and components, without weights"),
    "tokens": (verb_tokens, "token counts of strings on a checkpoint's tokenizer"),
    "data": (verb_data, "rows, columns and splits of a dataset reference"),
    "validate": (verb_validate, "check a document offline"),
    "explain": (verb_explain, "compile a document and print the plan"),
    "run": (verb_run, "run a document and print the written paths"),
    "render": (verb_render, "render Hydra overrides to a canonical document"),
    "fetch": (verb_fetch, "download a tracked artifact"),
    "runs": (verb_runs, "list tracked runs"),
    "server": (verb_server, "run the tracking server: PostgreSQL + mlflow server on 127.0.0.1"),
}


def _verb_args(name: str, parser: argparse.ArgumentParser) -> None:
    if name in ("model", "tokens"):
        _model_args(parser)
    if name == "model":
        parser.add_argument("--dtype", choices=tuple(vocab.DTYPES), default="fp32")
        parser.add_argument("--attn-implementation", choices=vocab.ATTN_IMPLEMENTATIONS,
                            default=None)
    elif name == "tokens":
        parser.add_argument("strings", nargs="+", help="candidate metric cells, e.g. ' Friday'")
    elif name == "data":
        parser.add_argument("ref", help="dataset reference, e.g. weekdays/data#train")
        parser.add_argument("--data-root", default=None, help=f"default: {DEFAULT_DATA_ROOT}")
    elif name in ("validate", "explain"):
        parser.add_argument("document")
        parser.add_argument("--data-root", default=None, help=f"default: {DEFAULT_DATA_ROOT}")
        if name == "explain":
            parser.add_argument("--tracking-uri", default=None, type=flags.tracking_uri,
                                help="store to fetch runs:/ bundles from, to check their stamps")
    elif name == "run":
        _run_args(parser)
    elif name == "render":
        parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=das")
        parser.add_argument("--config-dir", default=None, help="default: the shipped conf/")
    elif name == "fetch":
        parser.add_argument("uri", help="runs:/<run_id>/<artifact path>")
        parser.add_argument("-o", "--output", default=None, help="where to write it")
        parser.add_argument("--tracking-uri", default=None, type=flags.tracking_uri)
        parser.add_argument("--basis", action="store_true",
                            help="write a subspace bundle's orthonormal basis alone: "
                                 "safetensors {'basis': (d, k)}, x @ basis = features")
    elif name == "runs":
        parser.add_argument("--produced-by", default=None, type=flags.digest,
                            help="a point digest")
        parser.add_argument("--tracking-uri", default=None, type=flags.tracking_uri)
    elif name == "server":
        from causalab.server import add_arguments  # imports neither mlflow nor psycopg2

        add_arguments(parser)


_DESCRIPTION = ("causalab: declarative causal interventions on transformer language models, "
                "tracked in MLflow.\nEach verb prints text, or with --json the whole result "
                "object; a refusal is one line on stderr.")
_EPILOG = """examples:
  causalab validate documents/v2/patching.json
  causalab explain documents/v2/das.json --json
  causalab run documents/v2/patching.json --out out --device-map cpu
  causalab runs --json
  python -m causalab.run experiment=das model=llama   (Hydra: compose, render, run, track)"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="causalab", description=_DESCRIPTION, epilog=_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(parser, top=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, (function, help_text) in VERBS.items():
        sub = verbs.add_parser(name, help=help_text, description=function.__doc__)
        _verb_args(name, sub)
        _common(sub, top=False)
    return parser


# Refusals a verb raises at a document path whose value came from an argument or flag.
_BLAME = {
    "model": {("model", "key"): ("key",), ("model", "revision"): ("--revision",)},
    "tokens": {("model", "key"): ("key",), ("model", "revision"): ("--revision",)},
}


def _check_flags(args: argparse.Namespace) -> None:
    """Flag values that would fail only later, refused now at the flag (``flags.py``)."""
    if getattr(args, "data_root", DEFAULT_DATA_ROOT) is None:
        args.data_root = DEFAULT_DATA_ROOT
    elif hasattr(args, "data_root"):
        flags.check_directory(args.data_root, ("--data-root",))
    if getattr(args, "config_dir", None) is not None:
        flags.check_directory(args.config_dir, ("--config-dir",))
    if hasattr(args, "out"):
        flags.check_writable(args.out, ("--out",))
    if getattr(args, "output", None) is not None:
        flags.check_writable(args.output, ("-o/--output",), file_ok=True)
    if hasattr(args, "device_map"):
        flags.check_device(args.device_map, ("--device-map",))


# --- the one error boundary ---------------------------------------------------------------

def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _error_line(err: BaseException) -> str:
    if isinstance(err, UsageError) and not err.path:
        return f"error: {_one_line(err.message)}"
    if isinstance(err, CausalabError):
        return f"error: {format_path(err.path)}: {_one_line(err.message)}"
    # Not a refusal but a fault: still one line, with the way to see more.
    return (f"error: {type(err).__name__}: {_one_line(str(err))} "
            f"(run with --debug for the traceback)")


def _error_object(err: BaseException) -> dict:
    """A refusal as ``--json`` prints it: ``{"ok": false, "error": {path, message, line}}``."""
    refusal = isinstance(err, CausalabError)
    return {"ok": False, "error": {
        "kind": type(err).__name__,
        "path": list(err.path) if refusal else [],
        "message": _one_line(err.message if refusal else str(err)),
        "line": _error_line(err)}}


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        text = json.dumps(result, indent=2, ensure_ascii=False, default=str)
    else:
        text = result.get("text") or ""
    if not text:
        return
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (``causalab vocab | head``): not an error, and nothing to say.
        sys.stdout = open(os.devnull, "w")


def process_settings() -> None:
    """Settings of the process, made by the entry point before torch loads (never at import).

    nnsight runs a trace body in a worker thread; OpenMP threads that spin while waiting
    stall it for ~10 ms per small matmul on a 2-core machine, so they wait passively.
    A user's own setting wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; returns the exit status (0 ok, 1 refused, 2 usage, 130/143 SIGINT/SIGTERM)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    process_settings()
    debug = "--debug" in argv  # known even when parsing itself fails
    try:
        try:
            args = build_parser().parse_args(argv)
            args.argv = argv
        except SystemExit as stop:  # --help and --version print and stop
            return int(stop.code or 0)
        _check_flags(args)
        with interrupts(), flags.blamed_on(_BLAME.get(args.verb, {})):
            result = VERBS[args.verb][0](args)
    except KeyboardInterrupt as stop:  # SIGINT or SIGTERM: 130 or 143, one line
        print(one_line(stop), file=sys.stderr)
        return exit_status(stop)
    except Exception as err:  # the one boundary: everything becomes one line
        if debug:
            traceback.print_exc(file=sys.stderr)
        print(_error_line(err), file=sys.stderr)
        if "--json" in argv:
            _print(_error_object(err), True)
        return EXIT_USAGE if isinstance(err, UsageError) else EXIT_REFUSED
    _print(result, args.json)
    return EXIT_OK


def console() -> None:
    """The ``causalab`` command: :func:`main`'s status as the exit status; after an interrupt
    the process leaves at once (:func:`causalab.interrupts.leave`)."""
    status = main()
    if status in INTERRUPTED:
        leave(status)
    raise SystemExit(status)
