"""Concurrent runs of one document into one store compute each point once.

Real ``causalab run`` processes on the DBM sweep of the corpus (four points, a fit each, made
long enough to overlap), one SQLite store in a temporary directory, each run its own
``--out``. The store is then read with a plain ``MlflowClient``: each point's digest must have
exactly one FINISHED run that computed it, nothing may be left RUNNING, every process exits
0, and each point's tables are in exactly one of the ``--out`` folders while the other runs
said, one line a point, which run computes it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from mlflow import MlflowClient
from dbm_runs import dbm_sweep, run_env

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
EXPERIMENT = "claims"




def _store(folder: Path) -> str:
    """An existing store (its tables made once: MLflow's own migrations are not meant to run
    three at a time on one new file)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return uri


def _start(document: str, uri: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "causalab", "run", document, "--tracking-uri", uri,
         "--device-map", "cpu", "--out", str(out), "--data-root", DATA],
        cwd=out.parent, env=run_env(MLFLOW_EXPERIMENT_NAME=EXPERIMENT), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def _experiment_has_claims(uri: str) -> bool:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(EXPERIMENT)
    return found is not None and any(run.info.status == "RUNNING" for run in _points(uri))


def _points(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    return [run for run in client.search_runs([experiment], max_results=1000)
            if run.data.tags.get("causalab.kind") == "point"]


def test_three_runs_of_one_document_at_once_compute_each_point_once(tmp_path):
    document = dbm_sweep(tmp_path, 60)
    uri = _store(tmp_path)
    outs = [tmp_path / f"out{index}" for index in range(3)]
    runs = [_start(document, uri, out) for out in outs]
    ended = [run.communicate(timeout=600) for run in runs]
    for run, (stdout, stderr) in zip(runs, ended):
        assert run.returncode == 0, stderr[-3000:]
        assert "Traceback" not in stderr

    points = _points(uri)
    assert not [run for run in points if run.info.status == "RUNNING"]
    computed = [run for run in points if "causalab.reused_from" not in run.data.tags]
    finished = Counter(run.data.tags["causalab.produced_by"] for run in computed
                       if run.info.status == "FINISHED")
    assert len(finished) == 4 and set(finished.values()) == {1}, finished

    labels = {run.data.tags["causalab.point"]: run.info.run_id for run in computed
              if run.info.status == "FINISHED"}
    assert len(labels) == 4
    for label, run_id in labels.items():  # each point's tables in one --out, said by the others
        holders = [out for out in outs if (out / label / "document.json").is_file()]
        assert len(holders) == 1, (label, holders)
        others = [stderr for out, (_, stderr) in zip(outs, ended) if out not in holders]
        # A run that looked while the point was computed skips it as taken; one whose start
        # (seconds of imports on a busy machine) came after it ended reuses it as done.
        assert all(f"skipped {label}: being computed by run {run_id} " in text
                   or f"skipped {label}: done in run {run_id}" in text for text in others), \
            others


def test_a_point_a_live_run_holds_is_skipped_in_one_line_and_stored_once(tmp_path):
    document = dbm_sweep(tmp_path, 400)
    uri = _store(tmp_path)
    first = _start(document, uri, tmp_path / "first")
    deadline = time.monotonic() + 300
    while not _experiment_has_claims(uri):
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the first run claimed nothing"
        time.sleep(0.3)
    second = subprocess.run(
        [sys.executable, "-m", "causalab", "run", "--json", document, "--tracking-uri", uri,
         "--device-map", "cpu", "--out", str(tmp_path / "second"), "--data-root", DATA],
        cwd=tmp_path, env=run_env(MLFLOW_EXPERIMENT_NAME=EXPERIMENT), capture_output=True,
        text=True, timeout=600)
    assert first.wait(timeout=600) == 0, first.communicate()[1][-3000:]
    assert second.returncode == 0, second.stderr[-3000:]

    said = [line for line in second.stderr.splitlines() if "being computed by" in line]
    reply = json.loads(second.stdout)
    taken = {entry["point"] for entry in reply["taken"]}
    reused = {entry["point"] for entry in reply["skipped"]}
    assert taken and len(said) == len(taken)
    assert all(f"(pid {first.pid} on " in line for line in said)
    assert taken | reused == {run.data.tags["causalab.point"] for run in _points(uri)}

    points = _points(uri)
    assert not [run for run in points if run.info.status == "RUNNING"]
    finished = Counter(run.data.tags["causalab.produced_by"] for run in points
                       if run.info.status == "FINISHED"
                       and "causalab.reused_from" not in run.data.tags)
    assert len(finished) == 4 and set(finished.values()) == {1}
