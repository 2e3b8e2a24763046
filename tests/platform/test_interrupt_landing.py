"""A signal that lands in a weakref callback is not lost: Python prints and drops an exception
raised there, so ``causalab.interrupts`` sends it again to land in the main thread's own code
(a Ctrl-C during a multirun once exited 0 this way, the run going on)."""
from __future__ import annotations

import signal
import time
import weakref

import pytest

from causalab.interrupts import Interrupted, _raise, interrupts


class _Finalised:
    """Any object: its weakref callback is where the signal lands."""


def test_an_interrupt_raised_inside_a_weakref_callback_still_stops_the_main_thread():
    landed = []
    with pytest.raises(Interrupted) as stopped:
        with interrupts():
            thing = _Finalised()
            keep = weakref.ref(thing, lambda _: landed.append(1) or _raise(signal.SIGINT, None))
            del thing  # the callback raises Interrupted; Python drops it there
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
    assert landed == [1] and keep() is None
    assert stopped.value.signum == signal.SIGINT and stopped.value.status == 130


def test_outside_interrupts_the_unraisable_hook_is_the_one_before():
    import sys

    before = sys.unraisablehook
    with interrupts():
        assert sys.unraisablehook is not before
    assert sys.unraisablehook is before
