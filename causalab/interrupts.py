"""SIGINT and SIGTERM as one exception: every open run ends KILLED, the process exits 130/143.

Python turns SIGINT into ``KeyboardInterrupt`` and lets SIGTERM kill the process outright, so
a terminated run would stay RUNNING. Inside :func:`interrupts` both raise
:class:`Interrupted`, a ``KeyboardInterrupt``: the pipeline ends its started points and the
tracking listener marks its runs KILLED on the way out, and the entry point prints one line
and exits with ``128 + signal``. Handlers are installed by the entry points only (never at
import) and restored on exit.
"""
from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal; ``status`` is the shell's exit status for it (130, 143)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def status(self) -> int:
        return 128 + self.signum


def exit_status(stop: KeyboardInterrupt) -> int:
    """130 for a plain Ctrl-C, ``128 + signal`` for an :class:`Interrupted`."""
    return stop.status if isinstance(stop, Interrupted) else 128 + signal.SIGINT


def one_line(stop: KeyboardInterrupt) -> str:
    """``error: interrupted (SIGTERM)``: the one line an entry point prints."""
    name = signal.Signals(stop.signum).name if isinstance(stop, Interrupted) else "SIGINT"
    return f"error: interrupted ({name})"


def _raise(signum: int, _frame) -> None:
    # Silenced before the raise: a worker thread the interrupt cuts short (nnsight's trace
    # body) may fail and print before the main thread has unwound to ``interrupts``.
    threading.excepthook = _unprinted
    raise Interrupted(signum)


def _unprinted(_args) -> None:
    """A worker thread cut short by the interrupt (nnsight's trace body): its error is the
    interrupt's, already said in one line."""


def _again(previous):
    """An unraisable-exception hook that sends a swallowed :class:`Interrupted` again.

    A signal's handler runs wherever the main thread is, a weakref callback or a finaliser
    among them (MLflow's SQLAlchemy sessions make many); an exception raised there is
    printed and dropped, and the run would go on as if never stopped. The signal is sent
    again from a thread a moment later, to land in the main thread's own code."""
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            again = threading.Timer(0.01, _thread.interrupt_main, (unraisable.exc_value.signum,))
            again.daemon = True
            again.start()
            return
        previous(unraisable)
    return hook


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread while inside; once one
    has, worker threads stopped by it print no traceback of their own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise) for signum in SIGNALS}
    unraisable, sys.unraisablehook = sys.unraisablehook, _again(sys.unraisablehook)
    try:
        yield
    except KeyboardInterrupt:
        threading.excepthook = _unprinted
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = unraisable


def leave(status: int) -> None:
    """End a process that an interrupt stopped, without finalising the interpreter: a worker
    thread still inside a forward would abort it (``terminate called …``, status -6)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


INTERRUPTED = (128 + signal.SIGINT, 128 + signal.SIGTERM)
