"""Results as data, for notebooks: run a document and get DataFrames and tensors back.

``run`` runs a document (optionally tracked) and returns a :class:`Result`: every saved metric
table as a ``pandas.DataFrame`` (one row per data row: ``example_id``, ``value``,
``eligible``, ``reason``, …), every published value as a tensor, each point's coordinates and
scores, and the run ids. A tracked rerun whose points are done gives back the same: a reused
point's tables, saved values and scores are read back from its run in the store. In a
notebook a ``Result`` shows itself as one row per point. ``read_table`` reads one saved
table from a path or a ``runs:/<run_id>/<path>`` URI; ``search_points`` is one row per
tracked point run (coordinates and every metric's last value, ``produced_by``), from MLflow's
run search. It adds no experiment logic: the pipeline runs, tracking logs, this reshapes.

>>> import causalab
>>> result = causalab.run("documents/v2/patching.json")  # doctest: +SKIP
>>> result.table("iia.json")[["example_id", "value", "eligible"]]  # doctest: +SKIP
"""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from causalab.engine.events import Chain, Events
from causalab.errors import UsageError
from causalab.files import DOCUMENT, TABLE_SUFFIX, TENSOR_KEY, TENSOR_SUFFIX

_SHOWN_SCORES = 6  # score columns a Result's repr shows


@dataclass
class Result:
    """What one run left: tables by file (relative to ``out``), published values, coordinates
    and scores by point (its directory, ``""`` for an unswept document), the runs."""

    out: str
    written: list[str]
    tables: dict[str, Any] = field(default_factory=dict)
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    coordinates: dict[str, dict[str, Any]] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)

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

    def points(self):
        """One row per point: ``point``, its coordinates, ``run_id``, ``reused``, its scores
        (``iia/test``, its 95 % interval ``iia/test.lo`` and ``.hi``, ``iia/control``, …,
        main score first) and a fit's last ``train/loss``
        and ``eval/<metric>``."""
        import pandas

        from causalab.scores.naming import listed

        rows = []
        for point, coordinates in self.coordinates.items():
            run_id = self.runs.get(point) or self.skipped.get(point)
            row = {"point": point or "<root>", **{k: _plain(v) for k, v in coordinates.items()},
                   "run_id": run_id, "reused": point in self.skipped}
            rows.append(row | dict(self.scores.get(point, {})))
        frame = pandas.DataFrame.from_records(rows)
        measured = {k for found in self.scores.values() for k in found}
        keys = sorted((c for c in frame.columns if c in measured), key=listed)
        return frame[[c for c in frame.columns if c not in keys] + keys] if rows else frame

    def _shown(self):
        frame = self.points()
        if "run_id" in frame and frame["run_id"].isna().all():
            frame = frame.drop(columns=["run_id", "reused"])
        measured = {k for found in self.scores.values() for k in found}
        return frame.drop(columns=[c for c in frame.columns if c in measured][_SHOWN_SCORES:])

    def _heading(self) -> str:
        reused = f", {len(self.skipped)} reused from the store" if self.skipped else ""
        return (f"Result: {len(self.coordinates)} point(s){reused}, {len(self.tables)} "
                f"table(s), {len(self.written)} file(s) in {self.out}")

    def __repr__(self) -> str:
        if not self.coordinates:
            return self._heading()
        return f"{self._heading()}\n{self._shown().to_string(index=False)}"

    def _repr_html_(self) -> str:
        import html

        shown = self._shown().to_html(index=False) if self.coordinates else ""
        return f"<p>{html.escape(self._heading())}</p>{shown}"


def _plain(value: Any) -> Any:
    return value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value


def _point_of(path: str) -> str:
    """The point directory a table was written under (``""`` for an unswept document)."""
    parent = Path(path).parent.as_posix()
    return "" if parent == "." else parent


class _Collect(Events):
    """Keep each point's place, scores and published values (a step's ``outputs``)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}
        self.coordinates: dict[str, dict[str, Any]] = {}
        self.scores: dict[str, dict[str, float]] = {}
        self.directories: dict[str, str] = {}  # point label -> its directory

    def point_start(self, point: Any) -> bool:
        directory = getattr(point, "directory", "") or ""
        self.directories[getattr(point, "name", "") or ""] = directory
        self.coordinates[directory] = dict(getattr(point, "coordinates", None) or {})
        return True

    def metric(self, point: Any, step: str, name: str, mean: float | None, eligible: int) -> None:
        from causalab.scores.naming import metric_key

        if mean is not None:
            directory = getattr(point, "directory", "") or ""
            self.scores.setdefault(directory, {})[metric_key(step, name)] = float(mean)

    def interval(self, point: Any, step: str, name: str, low: float, high: float) -> None:
        from causalab.scores.naming import bound_keys, metric_key

        found = self.scores.setdefault(getattr(point, "directory", "") or "", {})
        found.update(zip(bound_keys(metric_key(step, name)), (float(low), float(high))))

    def fit_update(self, point: Any, step: str, update: int, loss: float) -> None:
        self._last(point, step, "train/loss", loss)

    def fit_epoch(self, point: Any, step: str, epoch: int, eval_mean: float,
                  kept: float | None) -> None:
        fit = ((getattr(point, "document", None) or {}).get("steps") or {}).get(step) or {}
        watched = (fit.get("early_stop") or {}).get("metric", "metric")
        self._last(point, step, f"eval/{watched}", eval_mean)

    def _last(self, point: Any, step: str, key: str, value: float | None) -> None:
        """A fit's series as its last finite value, keyed as tracking keys it."""
        if value is None or value != value or abs(value) == float("inf"):
            return
        steps = (getattr(point, "document", None) or {}).get("steps") or {}
        fits = [name for name, body in steps.items() if (body or {}).get("kind") == "fit"]
        directory = getattr(point, "directory", "") or ""
        self.scores.setdefault(directory, {})[key if len(fits) <= 1 else f"{step}/{key}"] = \
            float(value)

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
        batch_size: int | None = None, resume_mib: int | None = None,
        memory: str | None = None) -> Result:
    """Run a document (a dict or a JSON file) and return its tables and values as data.

    ``out`` defaults to a new temporary folder, removed when the process ends. With
    ``track`` the run is logged to MLflow exactly as ``causalab run`` logs it; a point done
    before is then reused, not rerun, and its files are read back from its run. The other
    keywords are the run's options (:class:`causalab.options.RunOptions`, whose defaults a
    ``None`` takes); a bad one is refused naming it.
    """
    from causalab.options import check_device, run_options
    from causalab.pipeline import run_document
    from causalab.plots.sweep_files import FitPictures

    options = run_options("python", out=out, track=track, tracking_uri=tracking_uri,
                          experiment=experiment, rerun=rerun, data_root=data_root,
                          device_map=device_map, batch_size=batch_size, resume_mib=resume_mib,
                          memory=memory)
    check_device(options, "python")
    raw = _document(document)
    out = options.out or _temporary()
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
                               events=Chain(FitPictures(out), tracker, collect),
                               resume_mib=options.resume_mib,
                               memory=options.memory)
        if tracker is not None:
            tracker.wait()  # Result.runs names the stored runs
    except BaseException as error:
        if tracker is not None:
            tracker.close(error)
        raise
    written = [str(p) for p in written]
    if tracker is not None:
        written += _reused(tracker, collect, out)
    tables = {str(Path(p).relative_to(out)): read_table(p) for p in written if _is_table(p)}
    return Result(out=out, written=written, tables=tables, values=collect.values,
                  runs=dict(tracker.point_runs) if tracker else {},
                  skipped=dict(tracker.skipped) if tracker else {},
                  coordinates=collect.coordinates, scores=collect.scores)


def _temporary() -> str:
    """A new folder for a run given no ``out``, removed when the process ends."""
    folder = tempfile.mkdtemp(prefix="causalab-run-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _reused(tracker, collect: _Collect, out: str) -> list[str]:
    """Every reused point's files, read back from its run into its directory under ``out``
    (a file this run wrote is kept); its saved values and scores join ``collect``."""
    from causalab.scores import naming
    from causalab.tracking import artifacts
    from causalab.tracking import runs as store

    found: list[str] = []
    for label, run_id in tracker.skipped.items():
        directory = collect.directories.get(label, label)
        target = Path(out) / directory
        files = tracker.call(artifacts.download_run, run_id, str(target))
        found += [str(target / name) for name in files]
        metrics = tracker.call(store.metrics_of, run_id)
        collect.scores[directory] = {k: v for k, v in metrics.items() if not naming.is_count(k)}
        collect.values[directory] = _saved_values(target, files)
    return found


def _saved_values(folder: Path, files: list[str]) -> dict[str, Any]:
    """The published values a point's saves kept, by name: what its ``document.json`` saves
    as ``.safetensors`` from a step's ``outputs``."""
    if DOCUMENT not in files:
        return {}
    from safetensors.torch import load_file

    document = json.loads((folder / DOCUMENT).read_text(encoding="utf-8"))
    found: dict[str, Any] = {}
    for step in (document.get("steps") or {}).values():
        published = set((step or {}).get("outputs") or {})
        for save in (step or {}).get("saves") or []:
            path = folder / str(save.get("file_path", ""))
            if save.get("value") in published and path.suffix == TENSOR_SUFFIX and path.is_file():
                tensors = load_file(str(path))
                found[save["value"]] = tensors.get(TENSOR_KEY, tensors)
    return found


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


def search_points(experiment: Any = None, *, sweep: Any = "newest",
                  tracking_uri: str | None = None, filter_string: str = "",
                  parent_run_id: str | None = None):
    """One row per tracked point run of one sweep: run id, status, model, coordinates, every
    metric's last value (scores such as ``iia/test``, a fit's final ``train/loss`` and
    ``eval/<metric>``, row counts ``n/…``), ``produced_by`` and, for a point reused from
    another run, ``reused_from``.

    ``sweep``: ``"newest"`` (the default) is the experiment's newest sweep, multirun or lone
    point run, the one whose point started last; a parent run's id (or ``parent_run_id``, its
    older name) or a :class:`Result` (``search_points(result)`` works too) is that one;
    ``"all"`` is every point of the experiment. ``frame.attrs["sweep"]`` names the parent
    shown. ``experiment`` defaults to MLFLOW_EXPERIMENT_NAME, else ``causalab`` (on a server with a
    login, ``causalab-<user>``: :func:`causalab.tracking.runs.default_experiment`).
    """
    from causalab.results.search import point_rows

    if isinstance(experiment, Result):
        experiment, sweep = None, experiment
    return point_rows(experiment, sweep=sweep, tracking_uri=tracking_uri,
                      filter_string=filter_string, parent_run_id=parent_run_id)
