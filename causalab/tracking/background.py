"""One background lane for MLflow calls, so a sweep's compute never waits on its bookkeeping.

Calls run in the order they were sent, on one daemon thread: a run's creation, its params,
its metrics, its files, its plots and its end stay in sequence without locks. ``wait`` blocks
until everything sent has run and re-raises the first failure; ``close`` does the same and
ends the thread, so a process that tracks many runs (a notebook, an in-process multirun) does
not keep a thread per run; an exit handler waits too, so a process that ends without ``wait``
still uploads what it wrote. It knows nothing of runs.
"""
from __future__ import annotations

import atexit
import queue
import sys
import threading
import time
from typing import Any, Callable

_STOP = object()


class Lane:
    """A serial queue of calls on one thread; the first error is kept and raised by ``wait``.

    A call that fails does not stop the ones after it: a run's end still reaches the store.
    """

    def __init__(self, name: str = "causalab-tracking") -> None:
        self._calls: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.drain)

    def send(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``call(*args, **kwargs)`` after every call sent before it."""
        self._calls.put((call, args, kwargs))

    def _work(self) -> None:
        while True:
            item = self._calls.get()
            try:
                if item is _STOP:
                    return
                call, args, kwargs = item
                call(*args, **kwargs)
            except BaseException as error:  # kept for wait(): the sender is on another thread
                self._error = self._error or error
            finally:
                self._calls.task_done()

    def wait(self) -> None:
        """Block until every call sent has run; raise the first one that failed."""
        self._calls.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """``wait``, then end the thread and its exit handler (a later ``send`` is not run).
        When ``wait`` raises (a call failed, an interrupt) the lane stays open, so calls sent
        after the error still run after everything before it."""
        self.wait()
        self._calls.put(_STOP)
        self._thread.join()
        atexit.unregister(self.drain)

    def drain(self, limit_s: float = 60.0) -> None:
        """At exit: finish what was sent, for at most ``limit_s`` (a store that stopped
        answering would otherwise hold the process through every retry); say what was left."""
        deadline = time.monotonic() + limit_s
        while self._calls.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._calls.unfinished_tasks:
            print(f"causalab: {self._calls.unfinished_tasks} MLflow call(s) not sent: the "
                  f"tracking store did not answer within {limit_s:.0f} s", file=sys.stderr)
        self._calls.put(_STOP)
