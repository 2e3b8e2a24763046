"""MLflow tracking: one run per point, parents for sweeps, retrieval of tracked artifacts.

The only package that imports mlflow, inside the functions that call it (its import costs
about 1.5 s). Nothing here uses MLflow's fluent active-run stack; every call names its
tracking URI and run ids.
"""
from causalab.tracking.artifacts import fetch, resolve_artifact
from causalab.tracking.listener import TrackingEvents
from causalab.tracking.runs import resolve_uri, ui_command

__all__ = ["TrackingEvents", "fetch", "resolve_artifact", "resolve_uri", "ui_command"]
