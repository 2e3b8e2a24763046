"""``causalab diff A B``: are two results the same, point by point, within a tolerance?

A side is an output folder (a run's ``--out``) or a tracked run (a sweep's parent, a
multirun's parent or one point), given by its id. Each side is read as points: a place
(its coordinates), its digest (``produced_by``) and its metrics under the keys tracking
logs (``iia/test``, ``n/iia/test``, ``train/loss``, …). A folder's point is a directory
holding ``document.json``; its metrics are the means over eligible rows (and their counts)
of the metric tables its document saves. Points are matched by their coordinates, or, when no
coordinates match, by ``produced_by``. Every metric either side has is compared: a
difference above ``tol`` (absolute), or a metric or point only one side has, is a change,
and the command exits 1 naming them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from causalab.errors import UsageError
from causalab.files import DOCUMENT
from causalab.scores import naming

TOLERANCE = 1e-6  # about float32 rounding of a mean of magnitude ~10: a rerun here is exact


def folder_points(root: Path) -> dict[str, dict[str, Any]]:
    """label -> {coordinates, produced_by, metrics} of every point directory under ``root``."""
    found = {}
    for document_path in sorted(root.rglob(DOCUMENT)):
        directory = document_path.parent
        document = json.loads(document_path.read_text(encoding="utf-8"))
        metrics, produced = _saved_means(directory, document)
        if not metrics:
            continue  # the root document of a sweep: its points are below it
        label = directory.relative_to(root).as_posix()
        found[label if label != "." else ""] = {
            "coordinates": _coordinates(label), "produced_by": produced, "metrics": metrics}
    return found


def _coordinates(label: str) -> dict[str, str]:
    """``layers=1,pos=-1`` -> {layers: 1, pos: -1} as text: a folder names its point so."""
    pairs = [part.split("=", 1) for part in label.split(",") if "=" in part]
    return {key: value for key, value in pairs}


def _saved_means(directory: Path, document: Mapping) -> tuple[dict[str, float], str | None]:
    """``<metric>/<step>`` -> mean of its saved table's eligible rows, ``n/…`` -> their
    count; and the tables' ``produced_by``."""
    metrics: dict[str, float] = {}
    produced = None
    for step, body in (document.get("steps") or {}).items():
        for save in (body or {}).get("saves") or []:
            path = directory / str(save.get("file_path", ""))
            if path.suffix != ".json" or not path.is_file():
                continue
            rows = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                continue
            values = [float(r["value"]) for r in rows if r.get("eligible") and
                      r.get("value") is not None]
            name = str(save.get("value", "")).rsplit("/", 1)[-1]
            key = naming.metric_key(step, name)
            metrics[key] = sum(values) / len(values) if values else math.nan
            metrics[naming.eligible_key(step, name)] = float(len(values))
            produced = produced or next((r.get("produced_by") for r in rows), None)
    return metrics, produced


def run_points(mlflow, run_id: str) -> dict[str, dict[str, Any]] | None:
    """label -> {coordinates, produced_by, metrics} of a tracked run's points; None when the
    store has no such run."""
    from causalab.tracking import landing
    from causalab.tracking import runs as store

    run = store.found_run(mlflow, run_id)
    if run is None:
        return None
    below = landing.stored_points(mlflow, run.info.experiment_id, run_id)
    found = {}
    for point in below or [run]:
        coordinates = landing.coordinates_of(point)
        label = ",".join(f"{k}={_text(v)}" for k, v in sorted(coordinates.items()))
        found[label] = {"coordinates": {k: _text(v) for k, v in coordinates.items()},
                        "produced_by": point.data.tags.get(store.PRODUCED_BY),
                        "metrics": {k: v for k, v in point.data.metrics.items()
                                    if not naming.is_bound(k)}}
    return found


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _matched(a: Mapping[str, dict], b: Mapping[str, dict]) -> tuple[list, list, list]:
    """(label a, label b) pairs, labels only in a, labels only in b."""
    by_place = {json.dumps(p["coordinates"], sort_keys=True): k for k, p in b.items()}
    pairs = [(k, by_place[json.dumps(p["coordinates"], sort_keys=True)]) for k, p in a.items()
             if json.dumps(p["coordinates"], sort_keys=True) in by_place]
    if not pairs:  # no place in common: the same document's points by their digest
        by_digest = {p["produced_by"]: k for k, p in b.items() if p["produced_by"]}
        pairs = [(k, by_digest[p["produced_by"]]) for k, p in a.items()
                 if p["produced_by"] in by_digest]
    left = [k for k in a if k not in {x for x, _ in pairs}]
    right = [k for k in b if k not in {y for _, y in pairs}]
    return pairs, left, right


def compare(a: Mapping[str, dict], b: Mapping[str, dict], tol: float) -> dict[str, Any]:
    """Every matched point's metrics compared; what moved beyond ``tol``, what is missing."""
    pairs, left, right = _matched(a, b)
    moved, same = [], 0
    for label_a, label_b in pairs:
        ma, mb = a[label_a]["metrics"], b[label_b]["metrics"]
        for key in sorted(set(ma) | set(mb), key=naming.listed):
            x, y = ma.get(key), mb.get(key)
            both_nan = x is not None and y is not None and math.isnan(x) and math.isnan(y)
            if x is not None and y is not None and (both_nan or abs(x - y) <= tol):
                same += 1
                continue
            moved.append({"point": label_a or "<root>", "metric": key, "a": x, "b": y,
                          "difference": None if x is None or y is None else y - x})
    return {"points": len(pairs), "same": same, "moved": moved, "tolerance": tol,
            "only_a": left, "only_b": right,
            "changed": bool(moved or left or right)}


def lines(result: Mapping[str, Any], a: str, b: str) -> str:
    """The report: one line a moved metric, one a point only one side has, then the verdict."""
    out = []
    for entry in result["moved"]:
        if entry["difference"] is None:
            side = "a" if entry["b"] is None else "b"
            out.append(f"{entry['point']}  {entry['metric']}: only in {side}")
        else:
            out.append(f"{entry['point']}  {entry['metric']}: {entry['a']:.6g} -> "
                       f"{entry['b']:.6g} ({entry['difference']:+.3g})")
    out += [f"{label or '<root>'}: only in {a}" for label in result["only_a"]]
    out += [f"{label or '<root>'}: only in {b}" for label in result["only_b"]]
    verdict = (f"{len(result['moved'])} metric(s) moved beyond {result['tolerance']:g}"
               if result["changed"] else f"the same within {result['tolerance']:g}")
    out.append(f"diff: {result['points']} point(s) matched, {result['same']} metric(s) "
               f"equal; {verdict}")
    return "\n".join(out)


def side(source: str, tracking_uri: str | None, where: str) -> dict[str, dict[str, Any]]:
    """The points of ``source``: an output folder, else a run id in the store."""
    path = Path(source)
    if path.is_dir():
        found = folder_points(path)
        if not found:
            raise UsageError((where,), f"{source}: no point with a saved metric table under it")
        return found
    if path.exists() or any(c in source for c in "/\\."):
        raise UsageError((where,), f"{source}: not an output folder")
    from causalab.tracking.reach import reach, source_of
    from causalab.tracking.runs import client, resolve_uri, store_exists

    uri = resolve_uri(tracking_uri)
    reach(uri, source_of())
    if not store_exists(uri):
        raise UsageError((where,), f"{source}: not a folder, and there is no store at {uri}")
    found = run_points(client(uri), source)
    if found is None:
        raise UsageError((where,), f"{source}: no such folder or run in {uri}")
    return found
