"""The background lane that orders a run's MLflow calls: held while the run computes, bounded
by its patience, drained at exit."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from causalab.tracking.background import Lane

ROOT = Path(__file__).resolve().parents[2]


def test_a_held_lane_runs_nothing_until_released_then_everything_in_order():
    lane, ran = Lane(patience_s=60.0), []
    lane.hold()
    for index in range(3):
        lane.send(ran.append, index)
    time.sleep(0.3)
    assert ran == []
    lane.release()
    lane.close()
    assert ran == [0, 1, 2]


def test_a_call_waits_no_longer_than_the_lanes_patience():
    lane, ran = Lane(patience_s=0.2), []
    lane.hold()
    start = time.monotonic()
    lane.send(lambda: ran.append(time.monotonic() - start))
    lane.close()  # never released
    assert len(ran) == 1 and 0.2 <= ran[0] < 5.0


def test_a_failed_call_is_raised_by_wait_and_the_calls_after_it_still_run():
    lane, ran = Lane(), []

    def fail():
        raise ValueError("boom")

    lane.send(fail)
    lane.send(ran.append, "after")
    with pytest.raises(ValueError, match="boom"):
        lane.wait()
    assert ran == ["after"]
    lane.close()


def test_a_process_that_exits_without_waiting_still_runs_its_calls_and_says_what_failed(
        tmp_path):
    marker = tmp_path / "ran"
    script = (
        "from pathlib import Path\n"
        "from causalab.tracking.background import Lane\n"
        "lane = Lane(patience_s=0.2)\n"
        "lane.hold()\n"
        "def fail():\n"
        "    raise ValueError('the store said no')\n"
        "lane.send(fail)\n"
        f"lane.send(Path({str(marker)!r}).write_text, 'x')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0
    assert marker.read_text() == "x"
    assert done.stderr.strip() == "causalab: tracking failed: ValueError: the store said no"
