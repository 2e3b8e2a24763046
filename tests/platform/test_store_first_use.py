"""A ``causalab run`` killed with SIGKILL while a new SQLite store is first made.

The first run on a fresh ``--tracking-uri`` makes the store: MLflow creates its tables and runs
its ~70 alembic migrations, which are not one transaction (SQLite batch migrations copy a table
through ``_alembic_tmp_<name>``, each step committed on its own). The run is killed, its whole
process group, at moments of that first use read from the folder, never by sleeping: its lock
taken before any database exists, the initial tables made, a batch migration's copy table
present, the last migrations underway. After the kill no database in the folder is at MLflow's
head revision (the kill landed mid-first-use), and the next run on the store exits 0 with no
traceback, each point FINISHED once and nothing RUNNING. A moment the poll missed (the machine
too loaded to see it) is tried again on a fresh store, so the test never passes on a kill that
landed elsewhere.
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

import pytest
from alembic.script import ScriptDirectory
from mlflow.store.db.utils import _get_alembic_config

from dbm_runs import each_point_finished_once, run_env

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = str(REPO / "documents" / "v2" / "patching.json")
DATA = str(REPO / "documents" / "data")
LIMIT_S = 600
TRIES = 3
# MLflow's schema revisions, base first: how far a database's migrations have got.
REVISIONS = [r.revision for r in ScriptDirectory.from_config(_get_alembic_config(""))
             .walk_revisions()][::-1]
HEAD = REVISIONS[-1]
NOT_DATABASES = (".lock", "-journal", "-wal", "-shm")


def _start(uri: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "causalab", "run", DOCUMENT, "--tracking-uri", uri,
         "--device-map", "cpu", "--out", str(out), "--data-root", DATA],
        cwd=out.parent, env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)


def _databases(folder: Path) -> list[Path]:
    """The SQLite files beside the store's lock: the store, and any file it is made in."""
    return sorted(p for p in folder.glob("mlflow.db*") if not p.name.endswith(NOT_DATABASES))


def _state(database: Path) -> tuple[set[str], int] | None:
    """(tables, how many migrations done: -1 for none) of ``database``, read-only; None while
    it cannot be read (locked by the writer, not a database yet)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True,
                                                timeout=0.05)) as db:
            tables = {row[0] for row in db.execute(
                "select name from sqlite_master where type = 'table'")}
            found = list(db.execute("select version_num from alembic_version")) \
                if "alembic_version" in tables else []
    except sqlite3.Error:
        return None
    return tables, (REVISIONS.index(found[0][0]) if found else -1)


def _states(folder: Path) -> list[tuple[set[str], int]]:
    return [s for s in map(_state, _databases(folder)) if s is not None]


def _at_head(folder: Path) -> bool:
    return any(done == len(REVISIONS) - 1 for _, done in _states(folder))


def _lock_taken(folder: Path) -> bool:
    return (folder / "mlflow.db.lock").exists() and not _databases(folder)


def _tables_made(folder: Path) -> bool:
    return any("experiments" in tables and done < 3 for tables, done in _states(folder))


def _batch_copy(folder: Path) -> bool:
    return any(any(t.startswith("_alembic_tmp_") for t in tables)
               for tables, _ in _states(folder))


def _last_migrations(folder: Path) -> bool:
    return any(len(REVISIONS) - 8 <= done < len(REVISIONS) - 1 for _, done in _states(folder))


def _killed_at(moment, folder: Path) -> bool:
    """Start a run on a fresh store in ``folder``, SIGKILL its group once ``moment`` holds;
    True when the kill landed during the store's first use (no database at head after it)."""
    run = _start(f"sqlite:///{folder / 'mlflow.db'}", folder / "out")
    try:
        deadline = time.monotonic() + LIMIT_S
        while not moment(folder) and not _at_head(folder) and run.poll() is None:
            assert time.monotonic() < deadline, "the run never reached its first use"
            time.sleep(0.01)
        ended = run.poll()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        _, stderr = run.communicate(timeout=60)
    assert ended is None, f"the run ended by itself ({ended}): {stderr[-3000:]}"
    return not _at_head(folder)


@pytest.mark.parametrize("moment", [_lock_taken, _tables_made, _batch_copy, _last_migrations],
                         ids=["lock-taken", "tables-made", "batch-copy", "last-migrations"])
def test_a_run_killed_while_a_new_store_is_made_leaves_a_store_the_next_run_uses(
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
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    again = _start(uri, folder / "out")
    _, stderr = again.communicate(timeout=LIMIT_S)
    assert again.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    each_point_finished_once(uri)
    assert [p.name for p in _databases(folder)] == ["mlflow.db"]
