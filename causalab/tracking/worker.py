"""MLflow in a process of its own, so a tracked run's main process never imports it.

Importing MLflow and opening a store take about 2.5 s of one core on a 2-core machine, and
every call after that is Python the run's main thread would otherwise share a core and the
GIL with. The worker is started when a run's tracking is set up (before compile and the
model load, which it overlaps) and serves calls in the order they come: a function of the
tracking modules by name, given the ``MlflowClient`` of a URI as its first argument, its
result (plain data: ids, dicts, bytes) or its exception sent back. One worker per process,
shared by every run of it (a notebook, an in-process multirun). It runs in a session of its
own and ignores SIGINT and SIGTERM, so what an interrupted run still sends (its runs' KILLED
ends) reaches the store, and it ends the moment its main process does (a lifeline pipe
closes), mid-call or not.
"""
from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable

_OPEN = "causalab.tracking.worker.open"  # a call naming no function: open the store now
_MIRRORED = ("MLFLOW_", "CAUSALAB_")


class WorkerGone(RuntimeError):
    """The worker process ended before it answered."""


class Worker:
    """The main process's end: ``call`` sends a function and its arguments, returns its result.

    Every message gets one answer, in order; an ``open`` is not waited for, so its answer is
    read (and dropped) by the next call. A call cut short (an interrupt mid-read) leaves the
    pipe out of step: the worker is then dropped and the next call starts a new one.
    """

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        # The lifeline: only this process holds its write end, so the worker sees it close
        # the moment this process ends (or drops it), even in the middle of a call.
        lifeline, self._lifeline = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [p for p in (_package_root(), os.environ.get("PYTHONPATH")) if p]))
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"from causalab.tracking.worker import main; "
                                   f"main({theirs.fileno()}, {lifeline})"],
            pass_fds=[theirs.fileno(), lifeline], env=env, stdin=subprocess.DEVNULL,
            stdout=2,  # a stray print never joins the run's stdout, its list of files
            # A session of its own: a Ctrl-C at the terminal, or a signal to the run's process
            # group, is the run's to handle; the lifeline ends the worker with the run.
            start_new_session=True)
        theirs.close()
        os.close(lifeline)
        self._connection = Connection(ours.detach())
        self._lock = threading.Lock()
        self._unread = 0
        self.broken = False

    def usable(self) -> bool:
        return not self.broken and self.process.poll() is None

    def open(self, uri: str) -> None:
        """Open the store at ``uri`` now, in the background."""
        with self._lock:
            self._exchange((_OPEN, uri, (), {}, _context()), wait=False)

    def call(self, uri: str | None, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(client of uri, *args, **kwargs)`` in the worker (no client when ``uri`` is
        None); raises what it raised."""
        message = (f"{function.__module__}:{function.__qualname__}", uri, args, kwargs,
                   _context())
        with self._lock:
            kind, value = self._exchange(message, wait=True)
        if kind == "error":
            raise value
        return value

    def _exchange(self, message: tuple, wait: bool) -> tuple[str, Any]:
        if self.broken:
            raise WorkerGone("the MLflow worker process was dropped")
        answer: tuple[str, Any] = ("ok", None)
        try:
            self._connection.send(message)
            self._unread += 1
            while wait and self._unread:
                answer = self._connection.recv()
                self._unread -= 1
        except BaseException as error:
            self.broken = True
            self._connection.close()
            os.close(self._lifeline)  # the dropped worker ends now, whatever it is doing
            if isinstance(error, (EOFError, OSError)):
                raise WorkerGone("the MLflow worker process ended before it answered") from None
            raise
        return answer


def _context() -> tuple[str, dict[str, str]]:
    """What a call runs in: the caller's working directory and its MLflow and causalab
    settings (a test's or a notebook's may change after the worker started)."""
    return os.getcwd(), {k: v for k, v in os.environ.items() if k.startswith(_MIRRORED)}


def _enter(context: tuple[str, dict[str, str]]) -> None:
    folder, settings = context
    if os.getcwd() != folder:
        os.chdir(folder)
    for key in [k for k in os.environ if k.startswith(_MIRRORED) and k not in settings]:
        del os.environ[key]
    os.environ.update(settings)


def _package_root() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[2])


_WORKER: Worker | None = None
_STARTING = threading.Lock()


def worker() -> Worker:
    """This process's worker, started on first use (or again, if the last one ended)."""
    global _WORKER
    with _STARTING:
        if _WORKER is None or not _WORKER.usable():
            _WORKER = Worker()
        return _WORKER


# --- the worker's end ------------------------------------------------------------------------

def _serve(connection: Connection) -> None:
    from causalab.tracking import runs

    clients: dict[str, Any] = {}

    def client(uri: str) -> Any:
        if uri not in clients:
            clients[uri] = runs.client(uri)
        return clients[uri]

    while True:
        try:
            name, uri, args, kwargs, context = connection.recv()
        except (EOFError, OSError):
            return
        try:
            _enter(context)
            if name == _OPEN:
                client(uri)
                answer: tuple[str, Any] = ("ok", None)
            else:
                module, _, qualname = name.partition(":")
                function = importlib.import_module(module)
                for part in qualname.split("."):
                    function = getattr(function, part)
                if uri is not None:
                    args = (client(uri), *args)
                answer = ("ok", function(*args, **kwargs))
        except BaseException as error:  # sent back, raised in the caller
            answer = ("error", _portable(error))
        try:
            connection.send(answer)
        except (EOFError, OSError):
            return


def _portable(error: BaseException) -> BaseException:
    """The error itself when it survives pickling, else a RuntimeError saying what it was;
    a fault (not a refusal) carries the worker's traceback as a note, for ``--debug``."""
    import traceback

    from causalab.errors import CausalabError

    if not isinstance(error, CausalabError):
        error.add_note("in the MLflow worker process:\n" + "".join(traceback.format_tb(
            error.__traceback__)).rstrip())
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _ignore_interrupts() -> None:
    """SIGINT and SIGTERM sent to this process alone are ignored too."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def _watch(lifeline: int) -> None:
    """End this process at once when the process that started it is gone: a call still
    running (a store that stopped answering) must not hold the run's stderr open."""
    while os.read(lifeline, 1):
        pass
    os._exit(0)


def main(fd: int, lifeline: int) -> None:
    _ignore_interrupts()
    threading.Thread(target=_watch, args=(lifeline,), name="lifeline", daemon=True).start()
    connection = Connection(fd)
    import mlflow  # noqa: F401  (now, while the main process compiles and loads its model)

    _serve(connection)

