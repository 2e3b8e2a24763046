"""A SQLite store made, migrated and moved through MLflow's own definitions, in place.

A new store is made where it is, never aside and renamed over a path another client may have
open: MLflow's initial tables and its alembic migrations (``mlflow.store.db_migrations``), run
by alembic's public ``command.upgrade`` on one connection in one SQLite transaction (``BEGIN
IMMEDIATE``, SQLAlchemy's pysqlite recipe, that engine's alone). MLflow's own way commits each
migration apart and SQLite's Python driver runs DDL outside transactions, so a process killed
in it left a store no one could open, and a second client opening the store meanwhile ran its
own migrations between them. Here a reader sees no store or a whole one, a kill leaves none,
and a plain MLflow client that starts making the same store meanwhile waits on SQLite's lock
and then finds its tables there. Runs starting at once wait on a lock in the temporary folder
(never beside the store or in the working folder), removed when released. A store another
client is still migrating its own way is waited for until it is made, or stays unchanged.

MLflow has no public way to move a store's artifact locations, which it writes absolute: the
rebase writes them through MLflow's own ORM models, and docs/platform.md §5 names it with the
test that fails when the pinned MLflow changes.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.resources
import os
import re
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

# The folder a SQLite store causalab made was made in (an experiment tag), and its artifacts'.
ROOT_TAG = "causalab.store_root"
ARTIFACTS = "mlartifacts"
# How long a first use waits for a store another process is making, and how long that store
# must stay unchanged before it counts as left half-made (a dead maker's).
WAIT_S = 300.0
QUIET_S = 10.0
# What a migration meeting another process's migration of the same store says: tried again.
_CONFLICTS = ("locked", "already exists", "duplicate column", "no such table",
              "no such column", "expected to match one row")


def lock_path(database: Path) -> Path:
    """The lock a first use of ``database`` holds: in the temporary folder, by its path."""
    key = hashlib.sha256(str(database.resolve()).encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"causalab-store-{key}.lock"


def look(database: Path) -> tuple[frozenset[str], str | None, int] | None:
    """``(tables, alembic revision, schema cookie)`` of ``database``; None with no file, or an
    empty one. A file that is not a database raises SQLite's own error."""
    if not database.is_file() or database.stat().st_size == 0:
        return None
    with contextlib.closing(sqlite3.connect(f"{database.resolve().as_uri()}?mode=rw",
                                            uri=True, timeout=30)) as db:
        tables = frozenset(name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"))
        revision = db.execute("SELECT max(version_num) FROM alembic_version").fetchone()[0] \
            if "alembic_version" in tables else None
        cookie = db.execute("PRAGMA schema_version").fetchone()[0]
    return tables, revision, cookie


def made(state: tuple | None) -> bool:
    """Whether a store in ``state`` is one MLflow opens without making anything: migrated
    (its revision MLflow checks), no migration's copy table left, every table of MLflow's."""
    if state is None or state[1] is None:
        return False
    tables = state[0]
    return not any(t.startswith("_alembic_tmp_") for t in tables) and _tables() <= tables


def _tables() -> set[str]:
    """Every table of MLflow's models (what MLflow checks before it makes a store's tables)."""
    import mlflow.store.model_registry.dbmodels.models  # noqa: F401  (their tables, in Base)
    import mlflow.store.tracking.dbmodels.models  # noqa: F401
    import mlflow.store.workspace.dbmodels.models  # noqa: F401
    from mlflow.store.db.base_sql_model import Base

    return set(Base.metadata.tables)


class HalfMade(Exception):
    """A store left part-way through a migration that MLflow cannot carry on from."""


def make(uri: str, database: Path, *, stale: bool = False) -> None:
    """Make or finish the store at ``database`` unless it is made (``stale``: MLflow found it
    made but not at its revision, and it holds no run), under the store's lock. A store some
    other client is migrating its own way (a revision, a copy table) is waited for until it is
    made or stays unchanged :data:`QUIET_S`; a migration that failed on a store that changed
    meanwhile is tried again, one that fails on a store that did not is :class:`HalfMade`."""
    database.parent.mkdir(parents=True, exist_ok=True)
    with _lock(database):
        deadline = time.monotonic() + WAIT_S
        while True:
            state = look(database)
            if made(state) and not stale:
                return
            if _begun(state):
                state = _settled(database, deadline, stale)
                if made(state) and not stale:
                    return
            try:
                _migrate(uri, database, state)
                return
            except Exception as error:
                if not _conflict(error):
                    raise
                if look(database) != state and time.monotonic() < deadline:
                    continue  # another client changed it meanwhile: looked at again
                if "locked" in str(error):
                    raise  # held by a writer all along: SQLite's own words
                raise _half_made(database, state, error) from error


def _begun(state: tuple | None) -> bool:
    """Migrated part-way: alembic's version table there (its revision, or none yet while the
    first migration runs), or a batch migration's copy table."""
    return state is not None and any(t == "alembic_version" or t.startswith("_alembic_tmp_")
                                     for t in state[0])


def _half_made(database: Path, state: tuple | None, error: BaseException) -> HalfMade:
    first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
    first = re.sub(r"^\([\w.]+\)\s*", "", first.strip())[:200]
    revision = f" at revision {state[1]}" if state and state[1] else ""
    lost = f"; it holds no run, so removing {database} loses nothing" \
        if not holds_runs(database) else ""
    return HalfMade(f"MLflow cannot carry on migrating it{revision} ({first}): a process "
                    f"stopped part-way through one of MLflow's migrations{lost}")


def holds_runs(database: Path) -> bool:
    """Whether the store holds any run (read only): a store of someone's work is never
    migrated here, MLflow's refusal stands."""
    with contextlib.closing(sqlite3.connect(f"{database.resolve().as_uri()}?mode=rw",
                                            uri=True, timeout=30)) as db:
        try:
            return db.execute("SELECT 1 FROM runs LIMIT 1").fetchone() is not None
        except sqlite3.OperationalError:  # no runs table: nothing in it
            return False


def out_of_date(error: BaseException) -> bool:
    """MLflow's refusal of a store whose tables are there but not at its revision."""
    return type(error).__name__ == "MlflowException" and \
        "out-of-date database schema" in str(error)


# alembic's env.py for MLflow's migrations on the connection it is handed, inside the
# transaction that connection is in (MLflow's own env.py opens a connection of its own).
_ENV = """
from alembic import context
from mlflow.store.db.base_sql_model import Base

context.configure(connection=context.config.attributes["connection"],
                  target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
"""


class _Changed(Exception):
    """The store changed between its look and this process's write lock on it."""


def _migrate(uri: str, database: Path, judged: tuple | None) -> None:
    """MLflow's initial tables, then its migrations to its head revision, in one SQLite
    transaction: committed whole, or not at all; and only on the store as it was ``judged``
    (a client that began its own migrations while this one waited to write is left to them)."""
    import sqlalchemy
    from alembic import command
    from alembic.config import Config
    from mlflow.store.tracking.dbmodels.initial_models import Base as Initial
    from sqlalchemy import event

    engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool,
                                      connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def driver_transactions_off(driver: Any, _: Any) -> None:
        driver.isolation_level = None  # the transactions are the BEGIN below, DDL inside

    @event.listens_for(engine, "begin")
    def begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    versions = importlib.resources.files("mlflow.store.db_migrations") / "versions"
    try:
        with tempfile.TemporaryDirectory(prefix="causalab-migrations-") as folder, \
                engine.begin() as connection:
            (Path(folder) / "env.py").write_text(_ENV)
            config = Config()
            config.set_main_option("script_location", folder)
            config.set_main_option("path_separator", "os")  # a folder's spaces kept
            config.set_main_option("version_locations", str(versions))
            config.attributes["connection"] = connection
            if look(database) != judged:  # the write lock held: nothing changes it now
                raise _Changed("the store changed while this process waited to write it")
            Initial.metadata.create_all(connection)
            command.upgrade(config, "heads")
    finally:
        engine.dispose()


def _settled(database: Path, deadline: float, stale: bool = False) -> tuple | None:
    """The store's state once it is made (``stale``: never enough) or has stayed unchanged,
    with no write under way, for :data:`QUIET_S` (its maker gone), or at ``deadline``."""
    journal = database.with_name(database.name + "-journal")
    state, since = look(database), time.monotonic()
    while time.monotonic() < deadline and (stale or not made(state)):
        time.sleep(0.1)
        now = look(database)
        if now != state or journal.exists():  # a journal: a write under way (or one died)
            state, since = now, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            break
    return state


def _conflict(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, _Changed) or any(word in str(seen) for word in _CONFLICTS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def _lock(database: Path) -> Iterator[None]:
    """Hold the store's lock (``flock`` on :func:`lock_path`), removed when released. A lock
    that cannot be made (another user's file) is done without: the store is made whole anyway."""
    path = lock_path(database)
    while True:
        try:
            handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError:
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(handle).st_ino:
                break
        os.close(handle)  # released and removed while this process waited: take a new one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(handle)


def moved(mlflow: Any, database: Path) -> list[tuple[str, str]]:
    """``(experiment id, folder it was made in)`` of each experiment causalab made in this
    store elsewhere than where the store now is (a moved or copied store)."""
    from mlflow.entities import ViewType

    here = str(database.resolve().parent)
    tagged = mlflow.search_experiments(view_type=ViewType.ALL, max_results=50000,
                                       filter_string=f"tags.`{ROOT_TAG}` IS NOT NULL")
    return [(e.experiment_id, e.tags[ROOT_TAG]) for e in tagged if e.tags[ROOT_TAG] != here]


def rebase(uri: str, database: Path, experiments: list[tuple[str, str]]) -> None:
    """Point ``experiments``' artifact locations, and their runs', at the ``mlartifacts``
    beside ``database``, in one transaction through MLflow's ORM models (MLflow has no public
    call for it: docs/platform.md §5)."""
    from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlExperimentTag, SqlRun
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from sqlalchemy import String, func, literal

    here = database.resolve().parent
    new = (here / ARTIFACTS).as_uri()
    opened = SqlAlchemyStore(uri, new)
    with opened.ManagedSessionMaker(read_only=False) as session:
        for experiment, was in experiments:
            old = (Path(was) / ARTIFACTS).as_uri()
            for model, column in ((SqlExperiment, SqlExperiment.artifact_location),
                                  (SqlRun, SqlRun.artifact_uri)):
                moved_here = literal(new, String).concat(func.substr(column, len(old) + 1))
                session.query(model).filter(
                    model.experiment_id == int(experiment),
                    func.substr(column, 1, len(old)) == old,
                ).update({column: moved_here}, synchronize_session=False)
            session.query(SqlExperimentTag).filter(
                SqlExperimentTag.experiment_id == int(experiment),
                SqlExperimentTag.key == ROOT_TAG,
            ).update({SqlExperimentTag.value: str(here)}, synchronize_session=False)
