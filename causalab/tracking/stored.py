"""A point's run is done only when all of it is stored: its files read back, its inputs unchanged.

What passed is kept on the run as ``causalab.stored``, what the point read besides its document
as ``causalab.inputs``; a resume takes a FINISHED run as the point's result only when both
still hold (docs/platform.md §5). A done point is linked into a new parent that asks for it
again: a FINISHED child with its params, metrics and tags, and ``causalab.reused_from`` naming
the run with its files, which resume follows (links never chain). Every function takes the
run's ``MlflowClient``.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterable, Mapping

from causalab.scores import summary
from causalab.tracking import runs as store
from causalab.tracking.artifacts import listing, named

STORED = "causalab.stored"
INPUTS = "causalab.inputs"
_COPIED_TAGS = (store.PRODUCED_BY, store.POINT, store.COORDINATES, store.MODEL_KEY,
                store.MODEL_REVISION, store.MODEL_CONTROL)


def shortfall(stored: Mapping[str, int], sent: Mapping[str, int]) -> str | None:
    """What of ``sent`` (``path -> size``) the store does not hold whole, in words."""
    missing = sorted(p for p in sent if p not in stored)
    short = sorted(p for p in sent if p in stored and stored[p] != sent[p])
    parts = [f"{len(missing)} of {len(sent)} files missing ({named(missing)})"] if missing else []
    parts += [f"{len(short)} stored short ({named(short)})"] if short else []
    return "; ".join(parts) or None


def record(sent: Mapping[str, int], metrics: Iterable[str]) -> str:
    """The ``causalab.stored`` tag: every file sent with its size and how many metrics, or,
    for hundreds of files, their count and bytes (a tag holds 8,000 characters)."""
    count = len(set(metrics))
    text = json.dumps({"files": dict(sorted(sent.items())), "metrics": count},
                      separators=(",", ":"))
    if len(text) > store.MAX_TAG_VAL_LENGTH:
        text = json.dumps({"count": len(sent), "bytes": sum(sent.values()), "metrics": count},
                          separators=(",", ":"))
    return text


def finish(mlflow: Any, run_id: str, sent: Mapping[str, int], metrics: Iterable[str],
           recorded: str | None = None) -> str | None:
    """End a point's run FINISHED once what it sent reads back, and return None; else return
    why not. ``recorded``: the record sent with the point's numbers, read back like them;
    written here when there was none or files followed it (an attribution point's grids)."""
    metrics = set(metrics)
    text = record(sent, metrics)
    why = shortfall(listing(mlflow, run_id), sent)
    run = mlflow.get_run(run_id)
    lost = sorted(metrics - set(run.data.metrics))
    if lost:
        why = "; ".join(filter(None, [why, f"{len(lost)} metrics not stored ({named(lost)})"]))
    if recorded == text and run.data.tags.get(STORED) != text:
        why = "; ".join(filter(None, [why, f"its {STORED} record is not the one sent"]))
    if why is not None:
        return f"not all of the point was stored: {why}"
    if recorded != text:
        store.log_batch(mlflow, run_id, tags={STORED: text})
    store.terminate(mlflow, run_id, "FINISHED")
    return None


def not_done(mlflow: Any, run: Any, inputs: Mapping[str, str]) -> str | None:
    """Why a FINISHED run (not a link) is not a point's result: inputs that changed since, or
    files gone from the store; None when it is."""
    run_id, tags = run.info.run_id, run.data.tags
    try:
        was = json.loads(tags.get(INPUTS) or "null")
        record = json.loads(tags.get(STORED) or "null")
    except ValueError:
        was = record = None
    if not isinstance(record, dict):
        return f"run {run_id} has no record that all of it was stored"
    if was is None and inputs:
        return f"run {run_id} recorded no digests of what it read"
    was = was or {}
    changed = sorted(k for k in set(inputs) | set(was) if was.get(k) != inputs.get(k))
    if changed:  # an input's digest key without its kind
        return f"{named([k.split(':', 1)[-1] for k in changed])} changed since run {run_id}"
    if len(run.data.metrics) < int(record.get("metrics", 0)):
        return f"run {run_id} has lost metrics from the store"
    stored = listing(mlflow, run_id)
    if "files" in record:
        why = shortfall(stored, record["files"])
    else:
        whole = len(stored) >= record.get("count", 0) \
            and sum(stored.values()) >= record.get("bytes", 0)
        why = None if whole else "files missing"
    return None if why is None else f"run {run_id}'s stored files are incomplete: {why}"


def done_runs(mlflow: Any, experiment: str, wanted: Mapping[str, Mapping[str, str]]
              ) -> tuple[dict[str, str], dict[str, str]]:
    """For each digest (its inputs given): the run that holds its result, else why the newest
    FINISHED one of it (a link followed to its origin) does not."""
    done: dict[str, str] = {}
    why: dict[str, str] = {}
    for digest, inputs in wanted.items():
        query = f"tags.`{store.PRODUCED_BY}` = '{digest}' and attributes.status = 'FINISHED'"
        for found in mlflow.search_runs([experiment], filter_string=query, max_results=20,
                                        order_by=["attributes.start_time DESC"]):
            origin = found.data.tags.get(store.REUSED_FROM)
            run = store.found_run(mlflow, origin) if origin else found
            reason = (not_done(mlflow, run, inputs) if run is not None else  # gone: mlflow gc
                      f"run {origin}, which run {found.info.run_id} reuses, is gone from the store")
            if reason is None:
                done[digest] = run.info.run_id
                why.pop(digest, None)
                break
            why.setdefault(digest, reason)
    return done, why


def link(mlflow, experiment: str, origin: str, parent: str, name: str,
         tags: Mapping[str, str], step: int = 0) -> str:
    """Create the link to ``origin`` under ``parent``, its metrics at ``step`` (its new
    sweep's axis value, as a point there logs them) and its description the origin's (one
    made from its metrics when it has none); returns the link's run id."""
    source = mlflow.get_run(origin)
    copied = {k: source.data.tags[k] for k in _COPIED_TAGS if k in source.data.tags}
    copied[store.NOTE] = source.data.tags.get(store.NOTE) or \
        summary.description(source.data.metrics) or None
    run_id = store.create_run(mlflow, experiment, name, {**tags, **copied,
                                                         store.REUSED_FROM: origin}, parent)
    now = int(time.time() * 1000)
    metrics = [store.Point(k, v, now, step) for k, v in source.data.metrics.items()]
    store.log_batch(mlflow, run_id, metrics=metrics, params=dict(source.data.params))
    store.terminate(mlflow, run_id, "FINISHED")
    return run_id

