"""Reach the tracking store before anything slow, open it, and bound every call to it after.

MLflow's client retries an unreachable server for minutes, and only at its first call, after
the model has loaded; :func:`reach` asks first and refuses in seconds with the URI named.
Deadlines (scoped to causalab's own calls), a SQLite store's first use and a moved store's
rebase (:mod:`causalab.tracking.sqlite_store`) and the refusals: docs/platform.md §5.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import threading
import time
from pathlib import Path as FilePath
from typing import TYPE_CHECKING, Any, Iterator

from causalab import files
from causalab.errors import Path, TrackingError
from causalab.progress import mlflow_notes
from causalab.tracking import sqlite_store

if TYPE_CHECKING:
    from mlflow import MlflowClient

# MLflow's HTTP settings for one of causalab's calls: 1 + 2 tries of at most 15 s each, 0-4 s
# of back-off between them, so a server that stopped answering fails a call in about 50 s
# (MLflow's own defaults: 8 tries of 120 s and minutes of back-off, about 20 minutes).
DEADLINES = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "15", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
             "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1.0"}


class Unanswered(TrackingError):
    """A store that stopped answering mid-run: MLflow's tries (:data:`DEADLINES`) ran out."""


class StoreRefused(TrackingError):
    """A store that answers but cannot take a write: a full disk, a read-only file system."""


def source_of(flag: Path = ("--tracking-uri",)) -> Path:
    """Where the URI came from, for the refusal's path: the environment, else ``flag``."""
    return ("MLFLOW_TRACKING_URI",) if os.environ.get("MLFLOW_TRACKING_URI") else flag


RUN_ADVICE = ("start it, point MLFLOW_TRACKING_URI or the tracking URI elsewhere, or turn "
              "tracking off (--no-track, tracking.enabled=false)")
FETCH_ADVICE = "start it, or point MLFLOW_TRACKING_URI or --tracking-uri at the store with the run"


def reach(uri: str, at: Path = ("--tracking-uri",), tries: int = 3, timeout_s: float = 2.0,
          advice: str = RUN_ADVICE, writes: bool = False) -> None:
    """Refuse at ``at`` unless the server at ``uri`` answers within ``tries`` short tries
    (any HTTP answer counts: a server behind a login answers 401), or a run's SQLite file
    (``writes``) cannot be made where it says (else SQLAlchemy retries for minutes): a folder
    in its place, or no folder it could be made in. ``advice`` ends the refusal."""
    if uri.startswith("file:"):
        raise TrackingError(at, f"{uri} is MLflow's file store, which MLflow 3 no longer writes; "
                                "give a folder (its mlflow.db) or sqlite:///<folder>/mlflow.db")
    database = sqlite_file(uri) if writes else None
    if database is not None and database.exists() and not database.is_file():
        raise TrackingError(at, f"{uri}: {database} is not a file")
    if database is not None and not database.exists():
        why = files.cannot_write_in(files.nearest_folder(database.parent))
        if why is not None:
            raise TrackingError(at, f"{uri}: {why}")
    if not uri.startswith(("http://", "https://")):
        return
    import urllib3  # only for a server: about 0.1 s, and MLflow's own HTTP client uses it

    retry = urllib3.Retry(total=tries - 1, backoff_factor=1.0, status_forcelist=(),
                          redirect=False, raise_on_redirect=False, raise_on_status=False)
    started = time.monotonic()
    try:
        urllib3.request("GET", uri.rstrip("/") + "/health", retries=retry,
                        timeout=urllib3.Timeout(timeout_s), preload_content=False).release_conn()
        return
    except urllib3.exceptions.MaxRetryError as error:
        last = str(error.reason)
    except (urllib3.exceptions.HTTPError, ValueError) as error:
        last = str(error)
    raise TrackingError(at, f"cannot reach the tracking server at {uri} ({tries} tries in "
                            f"{time.monotonic() - started:.1f} s: {last}); {advice}")


def sqlite_file(uri: str) -> FilePath | None:
    """The database file of a ``sqlite:///`` URI (None for any other store, or in memory)."""
    if not uri.startswith("sqlite:///"):
        return None
    name = uri[len("sqlite:///"):].split("?", 1)[0]
    return None if name in ("", ":memory:") else FilePath(name)


# The SQLite stores this process has opened once (made or finished first, rebased if moved).
_OPENED: set[str] = set()


def client(uri: str) -> "MlflowClient":
    """A client of the store at ``uri``, opened here: a SQLite store made or finished in place
    first, and rebased when it was moved (:mod:`causalab.tracking.sqlite_store`). Its calls,
    and its artifact repositories', carry :data:`DEADLINES` (:func:`deadlines`)."""
    from mlflow import MlflowClient

    database = sqlite_file(uri)
    first = database is not None and uri not in _OPENED
    with mlflow_notes(), deadlines():
        if first and not sqlite_store.made(sqlite_store.look(database)):
            sqlite_store.make(uri, database)
        found = MlflowClient(tracking_uri=uri)
        if first:
            _open(found, uri, database)
    _OPENED.add(uri)
    return Bounded(found)


def _open(found: "MlflowClient", uri: str, database: FilePath) -> None:
    """MLflow opens the store now; one it finds at an older revision that holds no run (a
    first use that stopped after the last of its tables) is finished first. A moved store is
    rebased before anything reads where its files are."""
    try:
        found.search_experiments(max_results=1)
    except Exception as error:
        if not sqlite_store.out_of_date(error) or sqlite_store.holds_runs(database):
            raise
        sqlite_store.make(uri, database, stale=True)
        found.search_experiments(max_results=1)
    moved = sqlite_store.moved(found, database)
    if moved:
        sqlite_store.rebase(uri, database, moved)


# How many tracking calls are under way in this process, and the settings they put in place.
_DEADLINE_LOCK = threading.Lock()
_UNDER_WAY = 0
_PUT: dict[str, str] = {}


@contextlib.contextmanager
def deadlines() -> Iterator[None]:
    """:data:`DEADLINES` in the environment (where MLflow reads them, at each request) for as
    long as a causalab call to a store is under way, each one the process set itself left
    alone; put back as they were once the last call ends. MLflow's client takes no timeout of
    its own, and a notebook's own MLflow calls outside this keep MLflow's settings."""
    global _UNDER_WAY
    with _DEADLINE_LOCK:
        if _UNDER_WAY == 0:
            _PUT.update({k: v for k, v in DEADLINES.items() if k not in os.environ})
            os.environ.update(_PUT)
        _UNDER_WAY += 1
    try:
        yield
    finally:
        with _DEADLINE_LOCK:
            _UNDER_WAY -= 1
            if _UNDER_WAY == 0:
                for key, value in _PUT.items():
                    if os.environ.get(key) == value:
                        del os.environ[key]
                _PUT.clear()


class Bounded:
    """An object (an ``MlflowClient``, an artifact repository) whose every method call runs
    under :func:`deadlines`; its other attributes read through."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found):
            return found

        @functools.wraps(found)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            with deadlines():
                return found(*args, **kwargs)

        return bounded


def said_once() -> None:
    """A run's store errors are said once, by the run: MLflow's logged copy of an error it
    raises (a full disk's traceback was hundreds of lines) is left out."""
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def translated(error: BaseException, uri: str,
               experiment: str | None = None) -> TrackingError | None:
    """``error`` as :class:`Unanswered` or :class:`StoreRefused`, at no path; else None.
    ``experiment``: the one the run writes to, which a refused permission names."""
    why = unanswered(error, uri)
    if why is not None:
        return Unanswered((), f"the tracking store at {uri} stopped answering ({why})")
    why = refused(error, experiment)
    if why is not None:
        return StoreRefused((), f"the tracking store at {uri} is not usable ({why})")
    return None


# A server behind authentication (``mlflow server --app-name basic-auth``) without a login.
_LOGIN = re.compile(r"error code (401|403)\b")
_REFUSING = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM}


def refused(error: BaseException, experiment: str | None = None) -> str | None:
    """Why the store cannot take a write, when that is what ``error`` says: its SQLite file or
    artifact folder (full, read-only, corrupt, no permission), a server that asks for a login,
    or one that refuses the login the permission (403) on ``experiment``."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sqlite_store.HalfMade):
            return str(seen)
        login = _LOGIN.search(str(seen)) if type(seen).__name__ == "MlflowException" else None
        user = os.environ.get("MLFLOW_TRACKING_USERNAME", "").strip()
        if login and login.group(1) == "403" and user:
            where = f"experiment {experiment!r}" if experiment else "this experiment"
            return (f"HTTP 403: user {user!r} has no permission on {where}, which another "
                    "user made: ask its owner or an admin for it, or write to an experiment "
                    "of your own (unnamed, a login's runs go to "
                    f"'causalab-{user}'; MLFLOW_EXPERIMENT_NAME or tracking.experiment "
                    "names one)")
        if login:
            return ("it asks for a login (HTTP 401/403): set MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD, e.g. from `causalab server --auth`'s "
                    "admin_password")
        if type(seen).__module__ == "sqlite3" or \
                isinstance(seen, OSError) and seen.errno in _REFUSING:
            first = next((line.strip() for line in str(seen).splitlines() if line.strip()), None)
            return (first or type(seen).__name__)[:200]
        seen = seen.__cause__ or seen.__context__
    return None


_HOST_PREFIX = re.compile(r"^\w+\([^)]*\):\s*")


def unanswered(error: BaseException, uri: str | None) -> str | None:
    """Why the store did not answer, when ``error`` says so: MLflow's tries at a server ran out
    (``mlflow server`` answers 503 once its database is gone), or a database server is gone."""
    import requests

    seen: BaseException | None = error
    while seen is not None:
        # RetryError: every one of MLflow's tries met a status it retries (408, 429, 5xx).
        if isinstance(seen, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                             requests.exceptions.RetryError)):
            inner = seen.args[0] if seen.args else seen
            text = str(getattr(inner, "reason", None) or inner)
            return _HOST_PREFIX.sub("", text)[:200]
        database = type(seen).__module__.startswith(("sqlalchemy", "psycopg2"))
        if database and type(seen).__name__ in ("OperationalError", "InterfaceError") \
                and uri and not uri.startswith("sqlite"):
            return str(seen).splitlines()[0][:200]
        seen = seen.__cause__ or seen.__context__
    return None
