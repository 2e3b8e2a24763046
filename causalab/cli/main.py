"""The ``causalab`` command: schema | vocab | model | tokens | data | validate | explain | run |
render | fetch | runs | diff | restamp | server | ui, each printing text or, with ``--json``, the whole result object.

This module is the command: its parser, its verb table and its one error boundary. The verbs
live in :mod:`causalab.cli.document_verbs` (those that read a document, a config or a dataset) and
:mod:`causalab.cli.run_verbs` (those that run a document or reach the tracking store). Every
verb is a function from parsed arguments to a dict with a ``text`` key and prints nothing
itself (an ``exit_status`` key, when there, is the exit status: ``diff`` found a change); ``main``
prints only after the verb returned, so a refusal leaves nothing half-written on
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
import json
import os
import re
import sys
import traceback
from typing import Callable, Sequence

from causalab import flags
from causalab.cli.run_verbs import (verb_diff, verb_fetch, verb_restamp, verb_run, verb_runs,
                                   verb_server, verb_ui)
from causalab.cli.document_verbs import (verb_data, verb_explain, verb_model, verb_render, verb_schema,
                                verb_tokens, verb_validate, verb_vocab)
from causalab.document import vocab
from causalab.errors import CausalabError, UsageError, format_path
from causalab.files import DEFAULT_DATA_ROOT, DEFAULT_OUT
from causalab.interrupts import INTERRUPTED, exit_status, interrupts, leave, one_line
from causalab.options import RunOptions

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so bad arguments meet the one error boundary."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError((), f"{message} (see '{self.prog} --help')")


# --- the parser ---------------------------------------------------------------------------

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
    """``run``'s flags: read as text here, validated as the run's options (causalab.options)."""
    device = RunOptions.model_fields["device_map"].default
    parser.add_argument("document")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--device-map", default=None,
                        help=f"accelerate device map (default: {device}: the accelerator when "
                             "there is one, else cpu)")
    parser.add_argument("--batch-size", default=None,
                        help="rows per forward window (default: the whole pass)")
    parser.add_argument("--resume-mib", default=None,
                        help="MiB of un-intervened values kept for prefix resume "
                             "(default: 256; 0 turns resume off)")
    parser.add_argument("--memory", default=None,
                        help="what the whole process may hold, weights included: 6GiB, 512MiB "
                             "or a share of free memory (default: 80%%)")
    parser.add_argument("--data-root", default=None, help=f"default: {DEFAULT_DATA_ROOT}")
    parser.add_argument("--no-track", action="store_true", help="skip MLflow tracking")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--rerun", action="store_true",
                        help="run points even when a finished run with their digest exists")
    parser.add_argument("--strict", action="store_true",
                        help="refuse when a bundle check cannot run (a stamp without a digest)")


VERBS: dict[str, tuple[Callable[[argparse.Namespace], dict], str]] = {
    "schema": (verb_schema, "print the document JSON Schema"),
    "vocab": (verb_vocab, "print every closed vocabulary"),
    "model": (verb_model, "a checkpoint's shape and components, without weights"),
    "tokens": (verb_tokens, "token counts of strings on a checkpoint's tokenizer"),
    "data": (verb_data, "rows, columns and splits of a dataset reference"),
    "validate": (verb_validate, "check a document alone, offline (explain checks it against "
                                "its model)"),
    "explain": (verb_explain, "compile a document and print the plan"),
    "run": (verb_run, "run a document and print the written paths"),
    "render": (verb_render, "render Hydra overrides to a canonical document"),
    "fetch": (verb_fetch, "download a tracked artifact"),
    "runs": (verb_runs, "list tracked runs"),
    "diff": (verb_diff, "compare two runs or output folders point by point; exit 1 if any moved"),
    "restamp": (verb_restamp, "re-stamp a bundle's tensor digest after an intended edit"),
    "server": (verb_server, "run the tracking server: PostgreSQL + mlflow server on 127.0.0.1"),
    "ui": (verb_ui, "MLflow's UI on a run's store, with the addresses of its sweep"),
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
            parser.add_argument("--strict", action="store_true",
                                help="refuse when a check cannot run (a runs:/ bundle with no "
                                     "store known, a stamp without a digest)")
            parser.add_argument("--traces", action="store_true",
                                help="print the traces a run opens instead (no weights loaded)")
            parser.add_argument("--memory", default=None, type=flags.memory,
                                help="the run's memory budget the traces are sized to "
                                     "(6GiB, 80%%; default: 80%% of free memory)")
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
    elif name == "restamp":
        parser.add_argument("file", help="a .safetensors bundle or a SAELens folder")
    elif name == "runs":
        parser.add_argument("--produced-by", default=None, type=flags.digest,
                            help="a point digest")
        parser.add_argument("--tracking-uri", default=None, type=flags.tracking_uri)
    elif name == "diff":
        parser.add_argument("a", help="an output folder, or a tracked run's id (a sweep's parent "
                                      "or one point)")
        parser.add_argument("b", help="the same, to compare with")
        parser.add_argument("--tol", type=float, default=None,
                            help="largest absolute difference that is still the same "
                                 "(default 1e-06)")
        parser.add_argument("--tracking-uri", default=None, type=flags.tracking_uri)
    elif name == "server":
        from causalab.server.stack import add_arguments  # imports neither mlflow nor psycopg2

        add_arguments(parser)
    elif name == "ui":
        from causalab.cli.ui import add_arguments as ui_arguments  # imports no mlflow

        ui_arguments(parser)


_DESCRIPTION = ("causalab: declarative causal interventions on transformer language models, "
                "tracked in MLflow.\nEach verb prints text, or with --json the whole result "
                "object; a refusal is one line on stderr.")
_EPILOG = """examples:
  causalab validate documents/v2/patching.json
  causalab explain documents/v2/das.json --json
  causalab run documents/v2/patching.json --out out --device-map cpu
  causalab runs --json
  causalab ui                              (MLflow's UI on ./mlflow.db; Ctrl-C stops it)
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
    overriding = os.environ.get("MLFLOW_TRACKING_URI")
    if getattr(args, "tracking_uri", None) and overriding and overriding != args.tracking_uri:
        print(f"note: tracking store {overriding} (MLFLOW_TRACKING_URI is set and wins over "
              f"--tracking-uri {args.tracking_uri})", file=sys.stderr)


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
    return int(result.get("exit_status", EXIT_OK))


def console() -> None:
    """The ``causalab`` command: :func:`main`'s status as the exit status; after an interrupt
    the process leaves at once (:func:`causalab.interrupts.leave`)."""
    status = main()
    if status in INTERRUPTED:
        leave(status)
    raise SystemExit(status)
