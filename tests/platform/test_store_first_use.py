"""A new SQLite store's first use killed part-way, by causalab or by MLflow's own client.

causalab makes a new store in place in one SQLite transaction (MLflow's initial tables and its
~70 alembic migrations, tracking/sqlite_store.py). A ``causalab run`` is killed with SIGKILL,
its whole process group, at moments of that first use read from the folder, never by
sleeping: its lock (in the temporary folder) taken before any database exists, and its
transaction open (its journal beside a store that has no tables yet). After the kill a reader
finds no store, or an empty one, never part of one; the next run on the store exits 0 with no
traceback, each point FINISHED once and nothing RUNNING, and nothing is left beside the store:
no lock, no copy. A moment the poll missed (the machine too loaded to see it) is tried again on
a fresh store, so the test never passes on a kill that landed elsewhere.

MLflow's own client makes a store one migration at a time, unlocked. A store it left between
two of them (its initial tables alone, a revision a third of the way, the revision before the
last: made here by MLflow's own steps, its initial models and its alembic env, stopped there)
is carried on by the next run, which exits 0 as above. One it left inside a batch migration
(killed while the migration's copy table exists) cannot be carried on by MLflow: the run says
so in one line naming the store, and that removing it loses nothing.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import mlflow.store
import pytest
from alembic.script import ScriptDirectory

from causalab.tracking.sqlite_store import lock_path
from dbm_runs import each_point_finished_once, run_env

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = str(REPO / "documents" / "v2" / "patching.json")
DATA = str(REPO / "documents" / "data")
LIMIT_S = 600
TRIES = 3
# MLflow's schema revisions, base first: how far a database's migrations have got.
MIGRATIONS = Path(mlflow.store.__file__).parent / "db_migrations"
REVISIONS = [r.revision for r in ScriptDirectory(str(MIGRATIONS)).walk_revisions()][::-1]


def _start(uri: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "causalab", "run", DOCUMENT, "--tracking-uri", uri,
         "--device-map", "cpu", "--out", str(out), "--data-root", DATA],
        cwd=out.parent, env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)


def _stop(process: subprocess.Popen) -> str:
    """SIGKILL ``process``'s group; its stderr."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.communicate(timeout=60)[1] or ""


def _tables(database: Path) -> set[str] | None:
    """The tables a reader sees in ``database`` (read-only), None while it cannot read it."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True,
                                                timeout=0.05)) as db:
            return {row[0] for row in db.execute(
                "select name from sqlite_master where type = 'table'")}
    except sqlite3.Error:
        return None


def _lock_taken(database: Path) -> bool:
    return lock_path(database).exists() and not database.exists()


def _transaction_open(database: Path) -> bool:
    return database.with_name(database.name + "-journal").exists() and \
        not _tables(database)


def _made(database: Path) -> bool:
    return bool(_tables(database))


def _killed_at(moment, folder: Path) -> bool:
    """Start a run on a fresh store in ``folder``, SIGKILL its group once ``moment`` holds;
    True when the kill landed before the store was made."""
    database = folder / "mlflow.db"
    run = _start(f"sqlite:///{database}", folder / "out")
    try:
        deadline = time.monotonic() + LIMIT_S
        while not moment(database) and not _made(database) and run.poll() is None:
            assert time.monotonic() < deadline, "the run never reached its first use"
            time.sleep(0.005)
        ended = run.poll()
    finally:
        stderr = _stop(run)
    assert ended is None, f"the run ended by itself ({ended}): {stderr[-3000:]}"
    return not _made(database)


def _next_run_uses(folder: Path) -> None:
    """The next run on the store exits 0, stores each point once, leaves nothing beside it."""
    database = folder / "mlflow.db"
    again = _start(f"sqlite:///{database}", folder / "out")
    _, stderr = again.communicate(timeout=LIMIT_S)
    assert again.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    each_point_finished_once(f"sqlite:///{database}")
    assert sorted(p.name for p in folder.iterdir()) == ["mlartifacts", "mlflow.db", "out"]
    assert not lock_path(database).exists()


@pytest.mark.parametrize("moment", [_lock_taken, _transaction_open],
                         ids=["lock-taken", "transaction-open"])
def test_a_run_killed_while_a_new_store_is_made_leaves_no_part_of_one_and_the_next_run_makes_it(
        tmp_path, monkeypatch, moment):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for attempt in range(TRIES):
        folder = tmp_path / f"try{attempt}"
        folder.mkdir()
        if _killed_at(moment, folder):
            break
    else:
        pytest.fail(f"{TRIES} kills all landed after the store was made: {moment.__name__} "
                    "was never seen")
    assert not _tables(folder / "mlflow.db")  # no store, or an empty one: never part of one
    _next_run_uses(folder)


def _mlflow_made_to(database: Path, revision: str | None) -> None:
    """What MLflow's own first use leaves when it stops after ``revision`` (None: after its
    initial tables): its initial models' tables, then its migrations as MLflow runs them
    (its alembic.ini and env.py), to that revision."""
    import sqlalchemy
    from alembic import command
    from alembic.config import Config
    from mlflow.store.tracking.dbmodels.initial_models import Base as Initial

    engine = sqlalchemy.create_engine(f"sqlite:///{database}")
    Initial.metadata.create_all(engine)
    engine.dispose()
    if revision is not None:
        config = Config(str(MIGRATIONS / "alembic.ini"))
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("sqlalchemy.url", f"sqlite:///{database}")
        command.upgrade(config, revision)


@pytest.mark.parametrize("revision", [None, REVISIONS[len(REVISIONS) // 3], REVISIONS[-2]],
                         ids=["initial-tables", "a-third-of-the-way", "one-before-the-last"])
def test_a_store_mlflow_left_between_two_migrations_is_carried_on_by_the_next_run(
        tmp_path, monkeypatch, revision):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _mlflow_made_to(tmp_path / "mlflow.db", revision)
    _next_run_uses(tmp_path)


def _copy_table(database: Path) -> bool:
    return any(t.startswith("_alembic_tmp_") for t in _tables(database) or ())


def test_a_store_mlflow_left_inside_a_batch_migration_is_one_line_naming_it(
        tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    for attempt in range(TRIES):  # MLflow's own client, killed inside a batch migration
        database.unlink(missing_ok=True)
        plain = subprocess.Popen(
            [sys.executable, "-c", f"from mlflow import MlflowClient\n"
                                   f"MlflowClient({uri!r}).search_experiments()"],
            cwd=tmp_path, env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            deadline = time.monotonic() + LIMIT_S
            while not _copy_table(database) and plain.poll() is None:
                assert time.monotonic() < deadline, "MLflow never made the store"
                time.sleep(0.002)
        finally:
            _stop(plain)
        if _copy_table(database):
            break
    else:
        pytest.fail(f"{TRIES} kills of MLflow's first use all missed its batch migrations")
    run = _start(uri, tmp_path / "out")
    _, stderr = run.communicate(timeout=LIMIT_S)
    lines = stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(f"error: --tracking-uri: the tracking store at {uri} is not "
                               "usable (MLflow cannot carry on migrating it"), lines
    assert lines[0].endswith(f"it holds no run, so removing {database} loses nothing)"), lines
    assert not lock_path(database).exists()


def test_a_full_disk_at_a_new_stores_first_use_is_one_line_and_leaves_nothing_beside_it(
        tmp_path, monkeypatch):
    """A disk too small for MLflow's tables (a real 128 KiB tmpfs; the suite runs as root, as
    ``make setup`` does): the first use's one transaction rolls back, so nothing is left but an
    empty file where the store was asked for, no journal, copy or lock beside it, no lock in the
    temporary folder, and nothing in the working folder but ``--out``."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    disk, work = tmp_path / "disk", tmp_path / "work"
    disk.mkdir()
    work.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, f"this test mounts a tmpfs (root): {mounted.stderr}"
    try:
        database = disk / "mlflow.db"
        uri = f"sqlite:///{database}"
        run = _start(uri, work / "out")
        _, stderr = run.communicate(timeout=LIMIT_S)
        assert run.returncode == 1 and stderr.strip().splitlines() == [
            f"error: --tracking-uri: the tracking store at {uri} is not usable (database or "
            "disk is full)"], stderr[-3000:]
        assert [p.name for p in disk.iterdir()] == ["mlflow.db"]
        assert database.stat().st_size == 0
        assert not lock_path(database).exists()
        assert [p.name for p in work.iterdir()] in ([], ["out"])
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
