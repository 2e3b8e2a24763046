"""Reach the tracking store before anything slow, and bound every call to it after.

MLflow's own client retries an unreachable server for minutes (seven retries, doubling
back-off, two-minute timeouts) and does so only at the first call, which a run makes after
its model has loaded. :func:`reach` asks the server's ``/health`` first, with urllib3's
``Retry`` (a few quick tries, short timeouts), so ``causalab run`` and ``causalab runs`` fail
in seconds with the URI named. A SQLite store is local: a run (``writes``) checks that its
file can be made where it says (else SQLAlchemy retries for minutes), without making it;
MLflow's retired file store (``file:``) is refused.

After the start, every MLflow call carries MLflow's own HTTP deadline settings
(:data:`DEADLINES`, set where the call runs unless the user set them): a server that dies or
stops answering fails a call in under a minute, as :class:`Unanswered`.
"""
from __future__ import annotations

import os
import time
from pathlib import Path as FilePath
from typing import Mapping

from causalab import files
from causalab.errors import Path, TrackingError

TRIES = 3
TIMEOUT_S = 2.0
PAUSE_S = 0.5
# MLflow's HTTP settings for one call: 1 + 2 tries of at most 15 s each, 0-4 s of back-off
# between them, so a server that stopped answering fails a call in about 50 s (MLflow's own
# defaults: 8 tries of 120 s and minutes of back-off, about 20 minutes).
DEADLINES = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "15", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
             "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1.0"}


class Unanswered(TrackingError):
    """A store that stopped answering mid-run: MLflow's tries (:data:`DEADLINES`) ran out."""


class StoreRefused(TrackingError):
    """A store that answers but cannot take a write: a full disk, a read-only file system."""


def with_deadlines(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` (MLflow's environment variables) with :data:`DEADLINES` where unset."""
    return {**DEADLINES, **settings}


def source_of(flag: Path = ("--tracking-uri",)) -> Path:
    """Where the URI came from, for the refusal's path: the environment, else ``flag``."""
    return ("MLFLOW_TRACKING_URI",) if os.environ.get("MLFLOW_TRACKING_URI") else flag


RUN_ADVICE = ("start it, point MLFLOW_TRACKING_URI or the tracking URI elsewhere, or turn "
              "tracking off (--no-track, tracking.enabled=false)")
FETCH_ADVICE = "start it, or point MLFLOW_TRACKING_URI or --tracking-uri at the store with the run"


def reach(uri: str, at: Path = ("--tracking-uri",), tries: int = TRIES,
          timeout_s: float = TIMEOUT_S, advice: str = RUN_ADVICE, writes: bool = False) -> None:
    """Refuse at ``at`` unless the server at ``uri`` answers within ``tries`` short tries.

    Any HTTP answer counts as reached (a server behind authentication answers 401); only a
    refused connection, a timeout or a name that does not resolve is unreachable. ``advice``
    ends the refusal: what a run can do differs from what a download can.
    """
    if uri.startswith("file:"):
        raise TrackingError(at, f"{uri} is MLflow's file store, which MLflow 3 no longer writes; "
                                "give a folder (its mlflow.db) or sqlite:///<folder>/mlflow.db")
    if writes:
        _writable_database(uri, at)
    if not uri.startswith(("http://", "https://")):
        return
    import urllib3  # only for a server: about 0.1 s, and MLflow's own HTTP client uses it

    retry = urllib3.Retry(total=tries - 1, backoff_factor=PAUSE_S * 2, status_forcelist=(),
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


def _writable_database(uri: str, at: Path) -> None:
    """Refuse at ``at`` a SQLite file that cannot be made: a folder in its place, or no folder
    it could be made in (``files.cannot_write_in``)."""
    database = sqlite_file(uri)
    if database is None:
        return
    if database.exists():
        if not database.is_file():
            raise TrackingError(at, f"{uri}: {database} is not a file")
        return
    why = files.cannot_write_in(files.nearest_folder(database.parent))
    if why is not None:
        raise TrackingError(at, f"{uri}: {why}")
