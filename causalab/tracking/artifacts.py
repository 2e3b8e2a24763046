"""Files in and out of runs: log a point's files, fetch one back, resolve ``runs:/`` bundles.

A ``runs:/<run_id>/<path>`` URI is resolved against the same tracking URI runs are logged to
(``MLFLOW_TRACKING_URI``, else the one given, else ./mlflow.db). A resolved bundle is an
ordinary local file afterwards: the engine checks its stamp exactly as for any other path.
Downloads land in ``$CAUSALAB_HOME/artifacts/<run_id>/`` (``~/.cache/causalab`` by default).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from causalab.document.names import runs_uri_parts
from causalab.engine.containment import inside
from causalab.errors import TrackingError
from causalab.tracking.reach import reach, source_of
from causalab.tracking.runs import artifact_location_of, resolve_uri

_WHERE = ("file_path",)


def artifact_home() -> Path:
    root = os.environ.get("CAUSALAB_HOME") or Path.home() / ".cache" / "causalab"
    return Path(root) / "artifacts"


def _download(uri: str, destination: Path, tracking_uri: str | None) -> Path:
    import mlflow.artifacts

    destination.mkdir(parents=True, exist_ok=True)
    try:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=str(destination), tracking_uri=resolve_uri(tracking_uri))
    except Exception as error:
        raise TrackingError(_WHERE, f"cannot download {uri}: {type(error).__name__}: "
                                    f"{str(error).splitlines()[0] if str(error) else ''}") from None
    return Path(local)


def _run_parts(uri: str, whole_run: bool = True) -> tuple[str, str]:
    """``runs:/<id>/<path>`` -> (id, path), each part a safe name (the path may be empty:
    the whole run), before anything is downloaded or created."""
    try:
        return runs_uri_parts(uri, whole_run=whole_run)
    except ValueError as error:
        raise TrackingError(_WHERE, str(error)) from None


def fetch(uri: str, out_path: str | None = None, tracking_uri: str | None = None) -> str:
    """Download one artifact (``runs:/<run_id>/<path>``) to ``out_path`` and return where it is.

    ``out_path`` may be a file name, an existing directory, or None (the artifact's own file
    name in the working directory).
    """
    run_id, path = _run_parts(uri)
    reach(resolve_uri(tracking_uri), source_of())
    with tempfile.TemporaryDirectory(prefix="causalab-fetch-") as staging:
        local = _download(uri, Path(staging), tracking_uri)
        name = Path(path).name or run_id
        target = Path(out_path) if out_path else Path(name)
        if target.is_dir():
            target = target / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if local.is_dir():
            shutil.copytree(local, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(local, target)
    return str(target)


def resolve_artifact(uri: str, tracking_uri: str | None = None) -> str:
    """The local path of a tracked artifact, downloaded into the artifact cache.

    The featurizer loader calls this for a ``file_path`` that is a ``runs:/`` URI; any other
    string is returned unchanged.
    """
    if not uri.startswith("runs:/"):
        return uri
    run_id, path = _run_parts(uri, whole_run=False)
    home = artifact_home()
    destination = home / run_id / Path(path).parent
    inside(home, destination, _WHERE)
    local = _download(uri, destination, tracking_uri)
    return str(inside(home, local, _WHERE))


def resolver(tracking_uri: str | None = None):
    """A one-argument ``uri -> local path`` function bound to a tracking URI, for the engine."""
    def _resolve(uri: str) -> str:
        return resolve_artifact(uri, tracking_uri)
    return _resolve


def log_files(mlflow, run_id: str, files: list[tuple[str, str]]) -> None:
    """Log ``(local path, artifact path)`` pairs; a directory part becomes the artifact folder."""
    repository = _repository(run_id)
    for local, artifact in files:
        folder = str(Path(artifact).parent)
        folder = None if folder in ("", ".") else folder
        if repository is None:
            mlflow.log_artifact(run_id, local, folder)
        else:
            repository.log_artifact(local, folder)


def _repository(run_id: str):
    """The artifact repository of a run this process created (no store lookup), else None."""
    location = artifact_location_of(run_id)
    if location is None:
        return None
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    return get_artifact_repository(location[0], tracking_uri=location[1])


def log_bytes(mlflow, run_id: str, data: bytes, artifact: str) -> None:
    """Log in-memory bytes (a PNG) under ``artifact``."""
    with tempfile.TemporaryDirectory(prefix="causalab-artifact-") as staging:
        local = Path(staging) / Path(artifact).name
        local.write_bytes(data)
        log_files(mlflow, run_id, [(str(local), artifact)])

