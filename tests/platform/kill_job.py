"""Fault injection for launcher tests: a Hydra callback that SIGKILLs one job's own process.

Added to a multirun with ``+hydra.callbacks.kill._target_=kill_job.KillJob
+hydra.callbacks.kill.model=<model choice>``; this folder must be on the jobs' PYTHONPATH.
In the job whose ``model`` choice matches, the process kills itself with SIGKILL right after
its first point run is opened (RUNNING in MLflow), as the OOM killer or a lost node would: no
handler, no ``finally``, nothing ends its runs. Every other job runs untouched.
"""
from __future__ import annotations

import os
import signal
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback


class KillJob(Callback):
    def __init__(self, model: str) -> None:
        self.model = model

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        if HydraConfig.get().runtime.choices.get("model") != self.model:
            return
        from causalab.tracking.listener import TrackingEvents

        opened = TrackingEvents.point_start

        def point_start(events, point):
            started = opened(events, point)
            if started:
                events.wait()  # the run is created by now; a failure would be said here
                os.kill(os.getpid(), signal.SIGKILL)
            return started

        TrackingEvents.point_start = point_start
