"""A point counts as done only when all of it is stored, and only while what it read is unchanged.

Real ``causalab run`` processes on the tiny Llama into a real SQLite store in a temporary folder.
The full disk is a real one: a small tmpfs mounted under the test's folder (the suite runs as
root, as ``make setup`` does), filled with a filler file until a sweep's uploads run out of
room, then freed. The store is read back with MlflowClient; the files a point wrote to ``--out``
are the independent record of what its run must hold.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from causalab.tracking import runs as store
from causalab.tracking import stored

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "documents" / "data"
PATCHING = REPO / "documents" / "v2" / "patching.json"
HEADS = REPO / "documents" / "v2" / "head_patching.json"
DAS_APPLY = REPO / "documents" / "v2" / "das_apply.json"


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               OMP_WAIT_POLICY="PASSIVE", CAUSALAB_QUIET="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _run(document: Path, out: Path, store_dir: Path, data: Path, cwd: Path):
    return subprocess.run(
        [sys.executable, "-m", "causalab", "run", str(document), "--out", str(out),
         "--data-root", str(data), "--tracking-uri", f"sqlite:///{store_dir / 'mlflow.db'}"],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def _points(store_dir: Path) -> list:
    """Every point run in the store (links included), read back through MLflow."""
    client = MlflowClient(tracking_uri=f"sqlite:///{store_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(store.DEFAULT_EXPERIMENT)
    return [run for run in client.search_runs([experiment.experiment_id], max_results=1000)
            if run.data.tags.get(store.KIND) == "point"], client


def _files(client, run_id: str) -> dict[str, int]:
    found, folders = {}, [None]
    while folders:
        for info in client.list_artifacts(run_id, folders.pop()):
            if info.is_dir:
                folders.append(info.path)
            else:
                found[info.path] = info.file_size
    return found


def _written(out: Path, label: str) -> dict[str, int]:
    """What a point wrote to ``--out`` (its folder), ``name -> size``: its run must hold these."""
    folder = out / label
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs at ``tmp_path/store``, unmounted at the end."""
    mount = tmp_path / "store"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    assert made.returncode == 0, f"this test mounts a tmpfs (root, as make setup): {made.stderr}"
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_leaves_no_point_finished_without_its_files_and_a_rerun_completes_each_once(
        small_disk, tmp_path):
    # The store made and its experiment opened by a one-point run, then the disk filled so that
    # the sweep's four points run out of room part way.
    first = _run(PATCHING, tmp_path / "setup", small_disk, DATA, tmp_path)
    assert first.returncode == 0, first.stderr
    room = os.statvfs(small_disk)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * max(0, room.f_bavail * room.f_frsize - 40 * 1024))

    full = _run(HEADS, tmp_path / "full", small_disk, DATA, tmp_path)
    assert full.returncode != 0, full.stdout
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in full.stderr, full.stderr
    runs, client = _points(small_disk)
    sweep_points = [r for r in runs if r.data.tags.get(store.POINT, "").startswith("heads=")]
    finished = [r for r in sweep_points if r.info.status == "FINISHED"]
    assert len(finished) < 4, "the disk never filled: nothing was tested"
    for run in finished:  # a FINISHED point holds every file it wrote, at its size
        label = run.data.tags[store.POINT]
        held = _files(client, run.info.run_id)
        assert all(held.get(name) == size for name, size in _written(tmp_path / "full", label).items()), \
            (label, held)
        assert stored.STORED in run.data.tags

    filler.unlink()
    again = _run(HEADS, tmp_path / "again", small_disk, DATA, tmp_path)
    assert again.returncode == 0, again.stderr
    runs, client = _points(small_disk)
    computed = [r for r in runs if r.data.tags.get(store.POINT, "").startswith("heads=")
                and r.info.status == "FINISHED" and store.REUSED_FROM not in r.data.tags]
    labels = sorted(r.data.tags[store.POINT] for r in computed)
    assert labels == ["heads=0", "heads=1", "heads=2", "heads=3"], labels
    for run in computed:
        label = run.data.tags[store.POINT]
        out = tmp_path / ("again" if (tmp_path / "again" / label).is_dir() else "full")
        held = _files(client, run.info.run_id)
        assert all(held.get(name) == size for name, size in _written(out, label).items())


def _swept_rows(tmp_path: Path) -> tuple[Path, Path]:
    """A data root with a copy of the weekday table, and a two-point sweep whose points read
    one table each (the base rows swept between the original and the copy)."""
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    shutil.copytree(data / "weekdays", data / "copy")
    document = json.loads(PATCHING.read_text())
    document["steps"]["patch"]["rows"]["base"] = {"sweep": ["weekdays/train", "copy/train"],
                                                  "as": "table"}
    path = tmp_path / "swept.json"
    path.write_text(json.dumps(document))
    return data, path


def test_editing_a_data_table_reruns_exactly_the_points_that_read_it(tmp_path):
    data, document = _swept_rows(tmp_path)
    first = _run(document, tmp_path / "first", tmp_path, data, tmp_path)
    assert first.returncode == 0, first.stderr
    again = _run(document, tmp_path / "again", tmp_path, data, tmp_path)
    assert again.returncode == 0 and "rerunning" not in again.stderr, again.stderr
    assert again.stderr.count("skipped ") == 2, again.stderr

    table = data / "copy" / "train.json"
    rows = json.loads(table.read_text())
    table.write_text(json.dumps(rows, indent=1))  # the same rows, other bytes: still an edit
    edited = _run(document, tmp_path / "edited", tmp_path, data, tmp_path)
    assert edited.returncode == 0, edited.stderr
    reruns = [line for line in edited.stderr.splitlines() if line.startswith("rerunning")]
    assert len(reruns) == 1 and "copy/train.json changed since run" in reruns[0], edited.stderr
    assert edited.stderr.count("skipped ") == 1, edited.stderr
    runs, _ = _points(tmp_path)
    computed = sorted(r.data.tags[store.POINT] for r in runs
                      if r.info.status == "FINISHED" and store.REUSED_FROM not in r.data.tags)
    assert computed == ["table=copy_train", "table=copy_train", "table=weekdays_train"], \
        computed


def test_a_bundle_overwritten_at_its_path_reruns_the_point_that_reads_it(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from causalab.engine.bundle_files import restamp

    bundle = tmp_path / "rot.safetensors"
    shutil.copyfile(REPO / "documents" / "artifacts" / "rot.safetensors", bundle)
    document = json.loads(DAS_APPLY.read_text())
    for spec in document["featurizers"].values():
        spec["file_path"] = str(bundle)
    path = tmp_path / "das_apply.json"
    path.write_text(json.dumps(document))
    first = _run(path, tmp_path / "first", tmp_path, DATA, tmp_path)
    assert first.returncode == 0, first.stderr
    again = _run(path, tmp_path / "again", tmp_path, DATA, tmp_path)
    assert again.returncode == 0 and "skipped <root>" in again.stderr, again.stderr

    with safe_open(str(bundle), "pt") as handle:  # an intended edit, re-stamped on purpose
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        metadata = handle.metadata()
    name = sorted(tensors)[0]
    tensors[name] = -tensors[name]
    save_file(tensors, str(bundle), metadata=metadata)
    restamp(str(bundle))
    edited = _run(path, tmp_path / "edited", tmp_path, DATA, tmp_path)
    assert edited.returncode == 0, edited.stderr
    assert f"rerunning <root>: {bundle} changed since run" in edited.stderr, edited.stderr
    assert "skipped" not in edited.stderr


def test_a_finished_run_whose_stored_file_went_missing_is_computed_again(tmp_path):
    first = _run(PATCHING, tmp_path / "first", tmp_path, DATA, tmp_path)
    assert first.returncode == 0, first.stderr
    runs, client = _points(tmp_path)
    (run,) = runs
    assert _files(client, run.info.run_id).get("iia.json") == (tmp_path / "first" / "iia.json").stat().st_size
    (held,) = (tmp_path / "mlartifacts").rglob("iia.json")
    held.unlink()  # lost from the store after the run ended FINISHED
    again = _run(PATCHING, tmp_path / "again", tmp_path, DATA, tmp_path)
    assert again.returncode == 0, again.stderr
    assert (f"rerunning <root>: run {run.info.run_id}'s stored files are incomplete: "
            "1 of") in again.stderr and "(iia.json)" in again.stderr, again.stderr
    assert (tmp_path / "again" / "iia.json").is_file()


def test_a_corrupt_store_is_one_line_naming_its_file(tmp_path):
    (tmp_path / "mlflow.db").write_bytes(bytes(range(256)) * 80)
    done = _run(PATCHING, tmp_path / "out", tmp_path, DATA, tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: --tracking-uri: the tracking store at sqlite:///{tmp_path / 'mlflow.db'} is not "
        "usable (file is not a database)"], done.stderr


def test_a_read_only_store_is_one_line_and_nothing_is_recorded_as_done(small_disk, tmp_path):
    first = _run(PATCHING, tmp_path / "first", small_disk, DATA, tmp_path)
    assert first.returncode == 0, first.stderr
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    again = _run(HEADS, tmp_path / "again", small_disk, DATA, tmp_path)
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 1 and len(lines) == 1, again.stderr
    assert lines[0] == (f"error: --tracking-uri: the tracking store at sqlite:///"
                        f"{small_disk / 'mlflow.db'} is not usable (attempt to write a "
                        "readonly database)"), lines
    runs, _ = _points(small_disk)
    assert [r.data.tags.get(store.POINT) for r in runs] == [""]  # only the first run's point
