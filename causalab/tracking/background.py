"""One background lane for MLflow calls, so a sweep's compute never waits on its bookkeeping.

A single-thread ``ThreadPoolExecutor``: calls run in the order they were sent, so a run's
creation, its params, its metrics, its files, its plots and its end stay in sequence without
locks, each one a future. ``wait`` blocks until everything sent has run and re-raises the
first failure; ``close`` does the same and lets the thread go, so a process that tracks many
runs (a notebook, an in-process multirun) does not keep a thread per run. At exit, before the
executors' own exit handlers, every open lane is given a minute to finish what was sent (and
says what failed or was left). It knows nothing of runs.

A lane can be held (``hold``/``release``, counted) while the caller computes: a call then
waits until the hold is released or until it has waited ``patience_s``. Bookkeeping done
beside a short burst of compute slows it (MLflow's calls are mostly Python, and a 2-core
machine has no core to spare), so a run shorter than that stores its runs after its
forwards, and a long one stores each point's about a second after the point sent it.
"""
from __future__ import annotations

import sys
import threading
import time
import weakref
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable

EXIT_LIMIT_S = 60.0
_OPEN: "weakref.WeakSet[Lane]" = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []


class Stalled(RuntimeError):
    """No call of the lane ended for the time a caller was willing to wait."""


class Lane:
    """A serial executor of calls; the first error is kept and raised by ``wait``.

    A call that fails does not stop the ones after it: a run's end still reaches the store.
    """

    def __init__(self, name: str = "causalab-tracking", patience_s: float = 1.0) -> None:
        self._pool = ThreadPoolExecutor(1, initializer=_named, initargs=(name,))
        self._sent: list[Future] = []
        self._patience_s = patience_s
        self._holds = 0
        self._gate = threading.Condition()
        _OPEN.add(self)
        _exit_hook()

    def send(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``call(*args, **kwargs)`` after every call sent before it."""
        self._sent.append(self._pool.submit(self._gated, time.monotonic(), call, args, kwargs))

    def hold(self) -> None:
        """Hold the calls sent (for at most ``patience_s`` each) until ``release``."""
        with self._gate:
            self._holds += 1

    def release(self) -> None:
        with self._gate:
            self._holds = max(0, self._holds - 1)
            self._gate.notify_all()

    def _gated(self, sent: float, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        with self._gate:
            deadline = sent + self._patience_s
            while self._holds and (left := deadline - time.monotonic()) > 0:
                self._gate.wait(left)
        return call(*args, **kwargs)

    def wait(self, stall_s: float | None = None) -> None:
        """Block until every call sent has run; raise the first one that failed. With
        ``stall_s``, raise :class:`Stalled` once no call has ended for that long."""
        sent = list(self._sent)
        pending = set(sent)
        while pending:
            done, pending = wait(pending, timeout=stall_s, return_when=FIRST_COMPLETED)
            if not done:
                raise Stalled(f"{len(pending)} call(s) waiting, none ended in {stall_s:.0f} s")
        del self._sent[:len(sent)]
        for future in sent:
            if future.exception() is not None:
                raise future.exception()

    def close(self, stall_s: float | None = None) -> None:
        """``wait``, then let the thread go (a later ``send`` is refused). When ``wait``
        raises (a call failed, an interrupt, a stall) the lane stays open, so calls sent
        after the error still run after everything before it."""
        self.wait(stall_s)
        self._pool.shutdown(wait=True)
        _OPEN.discard(self)

    def abandon(self) -> None:
        """Drop every call not yet started; the one running ends on its own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        _OPEN.discard(self)

    def drain(self, limit_s: float = EXIT_LIMIT_S) -> None:
        """At exit: finish what was sent, for at most ``limit_s`` (a store that stopped
        answering would otherwise hold the process through every call's deadline); say what
        was left, or what failed when nobody waited for the run."""
        _, pending = wait(self._sent, timeout=limit_s)
        failed = [f.exception() for f in self._sent if f.done() and not f.cancelled()
                  and f.exception() is not None]
        if pending:
            print(f"causalab: {len(pending)} MLflow call(s) not sent: the tracking store did "
                  f"not answer within {limit_s:.0f} s", file=sys.stderr)
        elif failed:
            print(f"causalab: tracking failed: {type(failed[0]).__name__}: {failed[0]}",
                  file=sys.stderr)
        self.abandon()


def _named(name: str) -> None:
    threading.current_thread().name = name


def _drain_open() -> None:
    for lane in list(_OPEN):
        lane.drain()


def _exit_hook() -> None:
    """Drain open lanes when the interpreter exits, before ``concurrent.futures`` joins its
    threads and refuses new work: Python runs these handlers (``threading._register_atexit``,
    the one concurrent.futures uses) last registered first, before ``atexit``'s."""
    if not _EXIT_HOOK:
        threading._register_atexit(_drain_open)  # type: ignore[attr-defined]
        _EXIT_HOOK.append(True)
