"""A tracking failure the user can cause (a store that stopped answering) is one line naming
the store and where the files are, once; never the internal fault form
(``error: ConnectionError: … (run with --debug …)``)."""
from __future__ import annotations

import pytest
import requests

from causalab.cli.main import _error_line
from causalab.errors import TrackingError
from causalab.tracking import TrackingEvents


def _unanswered(client) -> None:
    """What MLflow raises once its tries at a server that went away ran out."""
    raise requests.exceptions.ConnectionError("Connection refused")


def test_a_store_that_stopped_answering_is_one_user_facing_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    events = TrackingEvents(tracking_uri=uri, experiment="messages", out=str(tmp_path / "out"))
    with pytest.raises(TrackingError) as stopped:
        events.call(_unanswered)
    line = _error_line(stopped.value)
    assert "\n" not in line and line.startswith("error: ")
    assert "ConnectionError" not in line and "--debug" not in line
    assert "stopped answering (Connection refused)" in line
    assert line.count("files are in") == 1 and str(tmp_path / "out") in line
    with pytest.raises(TrackingError):  # every later call says the same, at once
        events.call(lambda client: None)
