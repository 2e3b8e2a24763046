"""SIGINT and SIGTERM as one exception: every open run ends KILLED, the process exits 130/143.

Python turns SIGINT into ``KeyboardInterrupt`` and lets SIGTERM kill the process outright, so
a terminated run would stay RUNNING. Inside :func:`interrupts` both raise
:class:`Interrupted`, a ``KeyboardInterrupt``: the pipeline ends its started points and the
tracking listener marks its runs KILLED on the way out, and the entry point prints one line
and exits with ``128 + signal``. Handlers are installed by the entry points only (never at
import) and restored on exit.
"""
from __future__ import annotations

import contextlib
import signal
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
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
