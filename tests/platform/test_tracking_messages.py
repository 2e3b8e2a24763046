"""A tracking failure the user can cause (the MLflow worker killed, a store that stopped
answering) is one line naming the store and where the files are, once; never the internal
fault form (``error: WorkerGone: … (run with --debug …)``)."""
from __future__ import annotations

import os

import pytest

from causalab.cli.main import _error_line
from causalab.errors import TrackingError
from causalab.tracking import TrackingEvents
from causalab.tracking import worker as workers


def _end_the_worker(client) -> None:
    """Runs in the MLflow worker process: it dies as an OOM kill would end it."""
    os._exit(9)


def test_a_worker_killed_before_the_first_point_is_one_user_facing_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    events = TrackingEvents(tracking_uri=uri, experiment="messages", out=str(tmp_path / "out"))
    try:
        with pytest.raises(TrackingError) as stopped:
            events.call(_end_the_worker)
        line = _error_line(stopped.value)
        assert "\n" not in line and line.startswith("error: ")
        assert "WorkerGone" not in line and "--debug" not in line
        assert line.count("files are in") == 1 and str(tmp_path / "out") in line
        with pytest.raises(TrackingError):  # every later call says the same, at once
            events.call(_end_the_worker)
    finally:
        workers.worker().drop()
