"""One background lane for MLflow calls, so a sweep's compute never waits on its bookkeeping.

Calls run in the order they were sent, on one daemon thread: a run's creation, its params,
its metrics, its files, its plots and its end stay in sequence without locks. ``wait`` blocks
until everything sent has run and re-raises the first failure; ``close`` does the same and
ends the thread, so a process that tracks many runs (a notebook, an in-process multirun) does
not keep a thread per run; an exit handler waits too, so a process that ends without ``wait``
still uploads what it wrote (and says what failed). It knows nothing of runs.

A lane can be held (``hold``/``release``, counted) while the caller computes: a call then
waits until the hold is released or until it has waited ``patience_s``. Bookkeeping done
beside a short burst of compute slows it (MLflow's calls are mostly Python, and a 2-core
machine has no core to spare), so a run shorter than that stores its runs after its
forwards, and a long one stores each point's about a second after the point sent it.
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

    def __init__(self, name: str = "causalab-tracking", patience_s: float = 1.0) -> None:
        self._calls: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._patience_s = patience_s
        self._holds = 0
        self._gate = threading.Condition()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.drain)

    def send(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``call(*args, **kwargs)`` after every call sent before it."""
        self._calls.put((time.monotonic(), call, args, kwargs))

    def hold(self) -> None:
        """Hold the calls sent (for at most ``patience_s`` each) until ``release``."""
        with self._gate:
            self._holds += 1

    def release(self) -> None:
        with self._gate:
            self._holds = max(0, self._holds - 1)
            self._gate.notify_all()

    def _await_gate(self, sent: float) -> None:
        with self._gate:
            deadline = sent + self._patience_s
            while self._holds and (left := deadline - time.monotonic()) > 0:
                self._gate.wait(left)

    def _work(self) -> None:
        while True:
            item = self._calls.get()
            try:
                if item is _STOP:
                    return
                sent, call, args, kwargs = item
                self._await_gate(sent)
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
        elif self._error is not None:  # nobody waited for the run, so nobody else says it
            print(f"causalab: tracking failed: {type(self._error).__name__}: {self._error}",
                  file=sys.stderr)
        self._calls.put(_STOP)
