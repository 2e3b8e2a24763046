"""MLflow in a process of its own, so a tracked run's main process never imports it.

Importing MLflow and opening a store take about 2.5 s of one core on a 2-core machine, and
every call after that is Python the run's main thread would otherwise share a core and the
GIL with. The worker is a ``ProcessPoolExecutor`` of one spawned process, started when a
run's tracking is set up (before compile and the model load, which it overlaps). It runs
calls in the order they come: a function of the tracking modules, given the ``MlflowClient``
of a URI as its first argument; its result (plain data: ids, dicts, bytes) or its exception
comes back through the executor's future, and the process's death as ``BrokenProcessPool``
(:class:`WorkerGone` here). One worker per process, shared by every run of it (a notebook,
an in-process multirun).

It is born with SIGINT and SIGTERM blocked and then ignores them, so what an interrupted run
still sends (its runs' KILLED ends) reaches the store; it ends the moment its main process
does (multiprocessing's parent sentinel), mid-call or not. Each call runs in the caller's
working directory and MLflow and causalab settings, with MLflow's HTTP deadlines
(:data:`causalab.tracking.reach.DEADLINES`) unless the caller set its own; a store that stops
answering fails the call as :class:`~causalab.tracking.reach.Unanswered`.
"""
from __future__ import annotations

import contextlib
import errno
import multiprocessing
import multiprocessing.util
import os
import pickle
import re
import signal
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator

_MIRRORED = ("MLFLOW_", "CAUSALAB_")
_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# multiprocessing's resource tracker (a process every spawning pool shares) warns of "leaked
# semaphores" on the run's stderr when the run leaves by os._exit or is killed; it unlinks
# them itself, and the run has already said its one line.
_QUIET_TRACKER = "ignore:resource_tracker:UserWarning"


class WorkerGone(RuntimeError):
    """The worker process ended before it answered."""


class Worker:
    """The main process's end: ``call`` runs a function in the worker and returns its result.

    Calls are submitted in order under one lock, and the one worker process runs them in that
    order. An interrupt while a call is awaited leaves the call running; the ones sent after
    it still run after it. ``drop`` ends the process at once, whatever it is doing.
    """

    def __init__(self) -> None:
        _quiet_tracker()
        _standard_start_method()
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_start)
        # A process that is itself a multiprocessing child (a joblib job) joins its children
        # before the executors' own exit hook runs: the worker is shut down first, or that
        # join waits forever on a worker waiting for its parent. Before the call queue's own
        # finalizer (priority 10) closes the queue the shutdown is sent on.
        multiprocessing.util.Finalize(None, self._leave, exitpriority=100)
        # ... and before the executors' own exit hook, which would wait for it (the hooks
        # concurrent.futures registers this way run last registered, first).
        threading._register_atexit(self._leave)
        self._lock = threading.Lock()
        self._sent: list[Future] = []
        self.broken = False

    def submit(self, uri: str | None, function: Callable[..., Any] | None, *args: Any,
               **kwargs: Any) -> Future:
        """``function(client of uri, *args, **kwargs)`` in the worker, as a future (no client
        when ``uri`` is None; no function: open the store only)."""
        try:
            with self._lock, _signals_blocked():  # a process it starts inherits the mask
                future = self._pool.submit(_serve, uri, function, args, kwargs, _context())
                self._sent = [f for f in self._sent if not f.done()] + [future]
                return future
        except (BrokenProcessPool, RuntimeError):
            self.broken = True
            raise WorkerGone("the MLflow worker process has ended") from None

    def open(self, uri: str) -> None:
        """Open the store at ``uri`` now, in the background."""
        self.submit(uri, None)

    def call(self, uri: str | None, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(client of uri, *args, **kwargs)`` in the worker; raises what it raised."""
        future = self.submit(uri, function, *args, **kwargs)
        wait([future])
        try:
            return future.result()
        except BrokenProcessPool:
            self.broken = True
            raise WorkerGone("the MLflow worker process ended before it answered") from None

    def _leave(self) -> None:
        """At the process's exit: a worker with no call left is ended at once (its
        interpreter's own teardown, with MLflow, SQLAlchemy and matplotlib loaded, took a
        second of every run's exit); one still in a call is waited for, as ever."""
        if not any(not future.done() for future in self._sent):
            for process in list((getattr(self._pool, "_processes", None) or {}).values()):
                with contextlib.suppress(OSError):
                    process.kill()
        self._pool.shutdown(wait=True)

    def drop(self) -> None:
        """End the worker process now, mid-call or not (a store that stopped answering); the
        calls it had are answered ``WorkerGone`` and the next call starts a new worker."""
        self.broken = True
        # ProcessPoolExecutor keeps its processes by pid and, before Python 3.14's
        # kill_workers(), has no public way to end one that is inside a call.
        for process in list((getattr(self._pool, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError):
                process.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held in this thread (a pending one is delivered on leaving)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _standard_start_method() -> None:
    """A spawned child sets the parent's default start method first; inside a joblib (loky)
    worker that is loky's own, which the child cannot find, so the worker would die at birth.
    Such a process gets multiprocessing's own ``spawn`` as its default."""
    known = multiprocessing.get_all_start_methods()
    if multiprocessing.get_start_method(allow_none=True) not in known:
        multiprocessing.set_start_method("spawn", force=True)


def _quiet_tracker() -> None:
    """Start multiprocessing's resource tracker with its leak warning off (``_QUIET_TRACKER``)."""
    from multiprocessing import resource_tracker

    sys.warnoptions.append(_QUIET_TRACKER)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(_QUIET_TRACKER)


def _context() -> tuple[str, dict[str, str]]:
    """What a call runs in: the caller's working directory and its MLflow and causalab
    settings (a test's or a notebook's may change after the worker started)."""
    return os.getcwd(), {k: v for k, v in os.environ.items() if k.startswith(_MIRRORED)}


_WORKER: Worker | None = None
_STARTING = threading.Lock()


def worker() -> Worker:
    """This process's worker, started on first use (or again, if the last one ended)."""
    global _WORKER
    with _STARTING:
        if _WORKER is None or _WORKER.broken:
            _WORKER = Worker()
        return _WORKER


# --- the worker's end ------------------------------------------------------------------------

_CLIENTS: dict[str, Any] = {}


def _start() -> None:
    """The worker process's start: interrupts ignored, stdout onto stderr (a stray print never
    joins the run's stdout, its list of files), ended with its parent, MLflow imported now
    (while the main process compiles and loads its model)."""
    import logging

    for signum in _SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    os.dup2(2, 1)
    threading.Thread(target=_end_with_parent, name="parent", daemon=True).start()
    # MLflow's tries are its own (reach.DEADLINES); what failed is said once, by the run.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    # A store's database errors are raised to the run as well as logged with their traceback
    # (a full disk wrote hundreds of lines): the raised one is the one said.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    import mlflow  # noqa: F401


def _end_with_parent() -> None:
    """End this process at once when the process that started it is gone: a call still
    running (a store that stopped answering) must not hold the run's stderr open."""
    multiprocessing.parent_process().join()
    os._exit(0)


def _serve(uri: str | None, function: Callable[..., Any] | None, args: tuple, kwargs: dict,
           context: tuple[str, dict[str, str]]) -> Any:
    from causalab.tracking import runs
    from causalab.tracking.reach import with_deadlines

    folder, settings = context
    if os.getcwd() != folder:
        os.chdir(folder)
    for key in [k for k in os.environ if k.startswith(_MIRRORED) and k not in settings]:
        del os.environ[key]
    os.environ.update(with_deadlines(settings))
    try:
        if uri is not None:
            if uri not in _CLIENTS:
                _CLIENTS[uri] = runs.client(uri)
            if function is None:
                return None
            args = (_CLIENTS[uri], *args)
        return function(*args, **kwargs)
    except BaseException as error:  # raised in the caller
        raise _portable(error, uri) from None


def _portable(error: BaseException, uri: str | None) -> BaseException:
    """The error as the caller should see it: a store that stopped answering as ``Unanswered``;
    else the error itself when it survives pickling (a RuntimeError saying what it was when
    not); a fault (not a refusal) carries the worker's traceback as a note, for ``--debug``."""
    import traceback

    from causalab.errors import CausalabError
    from causalab.tracking.reach import StoreRefused, Unanswered

    if not isinstance(error, CausalabError):
        why = _unanswered(error, uri)
        if why is not None:
            return Unanswered((), f"the tracking store at {uri} stopped answering ({why})")
        why = _refused(error)
        if why is not None:
            return StoreRefused((), f"the tracking store at {uri} is not usable ({why})")
        error.add_note("in the MLflow worker process:\n" + "".join(traceback.format_tb(
            error.__traceback__)).rstrip())
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


# A server behind authentication (``mlflow server --app-name basic-auth``) without a login.
_LOGIN = re.compile(r"error code (401|403)\b")
_REFUSING = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM}


def _refused(error: BaseException) -> str | None:
    """Why the store cannot take a write, when that is what ``error`` says: its SQLite file
    (full, read-only, corrupt), its artifact folder (no space, no permission) or a server
    that asks for a login."""
    seen: BaseException | None = error
    while seen is not None:
        if _LOGIN.search(str(seen)) and type(seen).__name__ == "MlflowException":
            return ("it asks for a login (HTTP 401/403): set MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD, e.g. from `causalab server --auth`'s "
                    "admin_password")
        if type(seen).__module__ == "sqlite3" or isinstance(seen, OSError) and seen.errno in _REFUSING:
            lines = [line.strip() for line in str(seen).splitlines() if line.strip()]
            return (lines[0] if lines else type(seen).__name__)[:200]
        seen = seen.__cause__ or seen.__context__
    return None


_HOST_PREFIX = re.compile(r"^\w+\([^)]*\):\s*")


def _unanswered(error: BaseException, uri: str | None) -> str | None:
    """Why the store did not answer, when that is what ``error`` says: MLflow's tries at an
    HTTP server ran out (refused, dropped, timed out, or a 5xx every time: ``mlflow server``
    answers 503 once its database is gone), or a database server is gone."""
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
