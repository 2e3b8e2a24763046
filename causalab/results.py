"""Results as data, for notebooks: run a document and get DataFrames and tensors back.

``run`` runs a document (optionally tracked) and returns a :class:`Result`: every saved metric
table as a ``pandas.DataFrame`` (one row per data row: ``example_id``, ``value``,
``eligible``, ``reason``, …), every published value as a tensor, and the run ids. ``read_table``
reads one saved table from a path or a ``runs:/<run_id>/<path>`` URI; ``search_points`` is one
row per tracked point run (coordinates, metric means, ``produced_by``), from MLflow's run
search. It adds no experiment logic: the pipeline runs, tracking logs, this reshapes.

>>> import causalab
>>> result = causalab.run("documents/v2/patching.json")  # doctest: +SKIP
>>> result.table("iia.json")[["example_id", "value", "eligible"]]  # doctest: +SKIP
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from causalab.engine.events import Chain, Events
from causalab.errors import UsageError
from causalab.files import TABLE_SUFFIX, TENSOR_SUFFIX


@dataclass
class Result:
    """What one run left: tables by file (relative to ``out``), published values by point."""

    out: str
    written: list[str]
    tables: dict[str, Any] = field(default_factory=dict)
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def table(self, name: str):
        """Every point's table of that file name as one DataFrame, with a ``point`` column."""
        import pandas

        frames = [frame.assign(point=_point_of(path))
                  for path, frame in self.tables.items() if Path(path).name == name]
        if not frames:
            raise UsageError((name,), f"no saved table named {name!r}; saved: "
                                      f"{sorted({Path(p).name for p in self.tables})}")
        return pandas.concat(frames, ignore_index=True)

    def value(self, name: str, point: str = "") -> Any:
        """A published value (a tensor) of one point (``""`` for an unswept document)."""
        found = self.values.get(point, {})
        if name not in found:
            raise UsageError((point or "<root>", name),
                             f"no published value {name!r}; published: {sorted(found)}")
        return found[name]


def _point_of(path: str) -> str:
    """The point directory a table was written under (``""`` for an unswept document)."""
    parent = Path(path).parent.as_posix()
    return "" if parent == "." else parent


class _Collect(Events):
    """Keep each point's published values (a step's ``outputs``) as the point ends."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}

    def point_end(self, point: Any, written: list[str], error: BaseException | None) -> None:
        if error is None:
            self.values[getattr(point, "directory", "") or ""] = _published(point)


def _published(node: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for child in getattr(node, "children", ()) or ():
        if getattr(child, "digest", None) is None and hasattr(child, "children"):
            found.update(_published(child))
        outputs = (getattr(child, "results", None) or {}).get("outputs") or {}
        found.update({name: _tensor(value) for name, value in outputs.items()})
    return found


def _tensor(published: Any) -> Any:
    """The tensor of a published value, detached on the CPU (the engine wraps it)."""
    value = getattr(published, "value", published)
    return value.detach().cpu() if hasattr(value, "detach") else value


def run(document: Mapping[str, Any] | str | Path, *, out: str | None = None,
        track: bool = False, tracking_uri: str | None = None, experiment: str | None = None,
        rerun: bool | None = None, data_root: str | None = None, device_map: str | None = None,
        batch_size: int | None = None, resume_mib: int | None = None) -> Result:
    """Run a document (a dict or a JSON file) and return its tables and values as data.

    ``out`` defaults to a new temporary folder. With ``track`` the run is logged to MLflow
    exactly as ``causalab run`` logs it; a point done before is then reused, not rerun. The
    other keywords are the run's options (:class:`causalab.options.RunOptions`, whose
    defaults a ``None`` takes); a bad one is refused naming it.
    """
    from causalab.options import check_device, run_options
    from causalab.pipeline import run_document

    options = run_options("python", out=out, track=track, tracking_uri=tracking_uri,
                          experiment=experiment, rerun=rerun, data_root=data_root,
                          device_map=device_map, batch_size=batch_size, resume_mib=resume_mib)
    check_device(options, "python")
    raw = _document(document)
    out = options.out or tempfile.mkdtemp(prefix="causalab-run-")
    collect = _Collect()
    tracker = None
    if options.track:
        from causalab.tracking import TrackingEvents

        tracker = TrackingEvents(tracking_uri=options.tracking_uri,
                                 experiment=options.experiment, rerun=options.rerun, out=out,
                                 uri_option=("tracking_uri",))
    try:
        written = run_document(raw, out=out, batch_size=options.batch_size,
                               device_map=options.device_map, data_root=options.data_root,
                               events=Chain(tracker, collect), resume_mib=options.resume_mib)
        if tracker is not None:
            tracker.wait()  # Result.runs names the stored runs
    except BaseException as error:
        if tracker is not None:
            tracker.close(error)
        raise
    written = [str(p) for p in written]
    tables = {str(Path(p).relative_to(out)): read_table(p) for p in written
              if _is_table(p)}
    return Result(out=out, written=written, tables=tables, values=collect.values,
                  runs=dict(tracker.point_runs) if tracker else {},
                  skipped=dict(tracker.skipped) if tracker else {})


def _document(document: Mapping[str, Any] | str | Path) -> dict:
    if isinstance(document, Mapping):
        return dict(document)
    from causalab.document import load_json

    path = Path(document)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError((str(path),), f"cannot read document: {error.strerror or error}") from None
    return load_json(text, name=str(path))


def _is_table(path: str) -> bool:
    """A metric table: a JSON array of row objects (not document.json or run.json)."""
    if not path.endswith(TABLE_SUFFIX) or path.endswith(TENSOR_SUFFIX):
        return False
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, list) and all(isinstance(row, dict) for row in data)


def read_table(source: str | Path, tracking_uri: str | None = None):
    """One saved metric table as a DataFrame, from a path or ``runs:/<run_id>/<path>``.

    >>> read_table("runs:/0123abcd/test_iia.json").columns[:3].tolist()  # doctest: +SKIP
    ['example_id', 'metric', 'value']
    """
    import pandas

    text = str(source)
    if text.startswith("runs:/"):
        from causalab.tracking import fetch

        with tempfile.TemporaryDirectory(prefix="causalab-table-") as folder:
            local = fetch(text, folder, tracking_uri=tracking_uri)
            return read_table(local)
    try:
        data = json.loads(Path(text).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError((text,), f"cannot read table: {error.strerror or error}") from None
    except ValueError as error:
        raise UsageError((text,), f"not JSON: {error}") from None
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise UsageError((text,), "not a metric table (a JSON array of row objects)")
    return pandas.DataFrame.from_records(data)


def search_points(experiment: str | None = None, *, tracking_uri: str | None = None,
                  filter_string: str = "", parent_run_id: str | None = None):
    """One row per tracked point run: run id, status, model, coordinates, metric means,
    ``produced_by`` and, for a point reused from another run, ``reused_from``.

    ``experiment`` defaults to MLFLOW_EXPERIMENT_NAME, else ``causalab``; ``parent_run_id``
    keeps one sweep's or multirun's children.
    """
    from causalab.tracking.search import point_rows

    return point_rows(experiment, tracking_uri=tracking_uri, filter_string=filter_string,
                      parent_run_id=parent_run_id)
