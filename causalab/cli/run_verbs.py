"""The ``causalab`` verbs that run a document, reach the tracking store or write a bundle: run |
fetch | runs | restamp | server | ui (the command itself is :mod:`causalab.cli.main`).

``run`` takes its flags as the run's options (:mod:`causalab.options`, validated once, a
refusal naming the flag) and assembles its listener: MLflow tracking, or with ``--no-track``
a reader of ``runs:/`` bundles only. Each verb returns a dict with a ``text`` key; ``run``
prints beside stdout (on stderr) only which points it reused.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Callable

from causalab.cli.document_verbs import _read_document
from causalab.engine.events import Events
from causalab.errors import UsageError
from causalab.options import RunOptions, check_device, run_options


class _Notes(Events):
    """A check the run could not make: one ``note:`` line on stderr, as explain says it."""

    def note(self, line: str) -> None:
        print(f"note: {line}", file=sys.stderr)


class _Resolving(Events):
    """With ``--no-track``: log nothing, still read ``runs:/`` bundles from the tracking URI
    (MLFLOW_TRACKING_URI, ``--tracking-uri``, else ./mlflow.db); mlflow loads only if asked."""

    def __init__(self, tracking_uri: str | None) -> None:
        self.uri = tracking_uri
        self.skipped: dict[str, str] = {}

    def resolve(self, uri: str) -> str:
        from causalab.tracking import resolve_artifact

        return resolve_artifact(uri, self.uri)


def run_options_of(args: argparse.Namespace) -> RunOptions:
    """``causalab run``'s flags as the run's options (:mod:`causalab.options`), validated."""
    options = run_options("cli", out=args.out, device_map=args.device_map,
                          batch_size=args.batch_size, resume_mib=args.resume_mib,
                          memory=args.memory,
                          data_root=args.data_root, track=not args.no_track,
                          tracking_uri=args.tracking_uri, rerun=args.rerun,
                          strict=args.strict)
    check_device(options, "cli")
    return options


def _tracking_events(options: RunOptions, argv: list[str]) -> Any:
    """The MLflow listener for a run (docs/platform.md §5), or a ``runs:/`` reader with ``--no-track``."""
    if not options.track:
        return _Resolving(options.tracking_uri)
    from causalab.tracking import TrackingEvents

    return TrackingEvents(tracking_uri=options.tracking_uri, experiment=options.experiment,
                          rerun=options.rerun, out=options.out, argv=argv)


def verb_run(args: argparse.Namespace) -> dict:
    """Run a document and list the files written, in order; nothing else is printed.

    With tracking on, a point that raises or is interrupted ends its MLflow run FAILED or
    KILLED (the listener's context exit), never left looking finished.
    """
    from causalab.engine.events import Chain
    from causalab.pipeline import run_document
    from causalab.progress import PointProgress
    from causalab.plots.sweep_files import FitPictures, SweepPictures

    options = run_options_of(args)
    raw = _read_document(args.document)
    events = _tracking_events(options, list(args.argv))
    with events if options.track else contextlib.nullcontext():
        written = run_document(raw, out=options.out, batch_size=options.batch_size,
                               device_map=options.device_map, data_root=options.data_root,
                               events=Chain(FitPictures(options.out), events,
                                            PointProgress(), _Notes(),
                                            SweepPictures(options.out)),
                               resume_mib=options.resume_mib, strict=options.strict,
                               memory=options.memory)
    written = [str(p) for p in written]
    skipped = [{"point": label or "<root>", "reused_run_id": run_id,
                "linked_run_id": getattr(events, "linked", {}).get(label)}
               for label, run_id in events.skipped.items()]
    for entry in skipped:  # stdout stays the list of files; what was reused is said beside it
        print(f"skipped {entry['point']}: done in run {entry['reused_run_id']}", file=sys.stderr)
    taken = [{"point": label or "<root>", "computed_by": holder}
             for label, holder in getattr(events, "taken", {}).items()]
    return {"text": "\n".join(written), "written": written, "out": options.out,
            "skipped": skipped, "taken": taken}


def verb_fetch(args: argparse.Namespace) -> dict:
    """Download one tracked artifact (``runs:/<run_id>/<path>``) to a local path."""
    from causalab.tracking import fetch

    convert = _basis_of(args.uri) if args.basis else None
    path = str(fetch(args.uri, args.output, tracking_uri=args.tracking_uri, convert=convert))
    control = _control_of(path)
    if control is None:
        return {"text": path, "path": path, "uri": args.uri}
    said = (f"{path}\n  fitted on the {control['model_control']} control of "
            f"{control.get('model_key', '?')} (seed {control.get('model_control_seed', '?')}, "
            f"twin revision {control.get('model_control_revision', 'not recorded')}), "
            "not on the checkpoint's weights")
    return {"text": said, "path": path, "uri": args.uri, "control": control}


def _control_of(path: str) -> dict | None:
    """The control stamp of a fetched safetensors file (None: none, or not a bundle)."""
    from causalab.compile.bundles.checks import layout_header
    from causalab.errors import CausalabError

    if not path.endswith(".safetensors"):
        return None
    try:
        metadata = layout_header(path).get("__metadata__") or {}
    except CausalabError:
        return None
    if not metadata.get("model_control"):
        return None
    return {key: value for key, value in metadata.items()
            if key.startswith("model_control") or key == "model_key"}


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


def verb_restamp(args: argparse.Namespace) -> dict:
    """Recompute a bundle's tensor digest after an intended edit (docs/format.md §8.3)."""
    from causalab.engine.bundle_files import restamp

    names = restamp(args.file)
    return {"text": f"restamped {args.file}: {', '.join(names)}", "file": args.file,
            "tensors": names}


def verb_runs(args: argparse.Namespace) -> dict:
    """Tracked runs, newest first, optionally only those of one point digest."""
    from causalab.results.listing import list_runs

    runs = list_runs(produced_by=args.produced_by, tracking_uri=args.tracking_uri)
    if not runs:
        from causalab.tracking.runs import resolve_uri, store_exists

        uri = resolve_uri(args.tracking_uri)  # list_runs creates no store that is not there
        if not store_exists(uri):
            return {"text": f"(no runs: there is no tracking store at {uri})", "runs": []}
    lines = [f"{r['run_id']:<32}  {r['status']:<9} {(r.get('model') or '-'):<24} "
             f"{(r.get('job') or '-'):<32} {(r.get('name') or ''):<20} "
             f"{(r.get('produced_by') or '')[:12]}"
             f"{'  reuses ' + r['reused_from'] if r.get('reused_from') else ''}".rstrip()
             for r in [_RUNS_HEADER, *runs]]
    return {"text": "\n".join(lines) if runs else "(no runs)", "runs": runs}


# The header row of ``causalab runs``: each column's name where its values start.
_RUNS_HEADER = {"run_id": "run", "status": "status", "model": "model", "job": "job",
                "name": "name", "produced_by": "produced_by"}


def verb_diff(args: argparse.Namespace) -> dict:
    """Compare two runs or output folders point by point: every metric of every point matched
    by its coordinates (else its produced_by), against --tol; exit 1 when any moved."""
    from causalab.results import diff

    tol = diff.TOLERANCE if args.tol is None else args.tol
    if not tol >= 0:
        raise UsageError(("--tol",), f"must be a number, 0 or more, not {args.tol!r}")
    a = diff.side(args.a, args.tracking_uri, "a")
    b = diff.side(args.b, args.tracking_uri, "b")
    result = diff.compare(a, b, tol)
    return {"text": diff.lines(result, args.a, args.b), **result,
            "exit_status": 1 if result["changed"] else 0}


def verb_server(args: argparse.Namespace) -> dict:
    """Start, stop or look at the team tracking stack (PostgreSQL + mlflow server)."""
    from causalab.server import stack as server

    return server.verb(args)


def verb_ui(args: argparse.Namespace) -> dict:
    """Start MLflow's UI on a run's store, print the addresses of its sweep, stop on Ctrl-C."""
    from causalab.cli import ui

    return ui.verb(args)
