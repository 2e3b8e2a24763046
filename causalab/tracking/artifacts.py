"""Files in and out of runs: log a point's files, fetch one back, resolve ``runs:/`` bundles.

A resolved bundle is an ordinary local file afterwards, checked against its stamp like any
other; downloads land in the artifact cache, fetched again on every resolve
(docs/platform.md §5).
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from causalab.document.names import runs_uri_parts
from causalab.engine.containment import inside
from causalab.errors import TrackingError, reason
from causalab.files import SAELENS_WEIGHTS, TENSOR_SUFFIX, causalab_home
from causalab.plots import curves as plots
from causalab.progress import mlflow_bars
from causalab.tracking.reach import FETCH_ADVICE, deadlines, reach, source_of
from causalab.tracking.runs import client, repository_of, resolve_uri, store_exists

_WHERE = ("file_path",)
_URI = ("uri",)


def _download(uri: str, parts: tuple[str, str], destination: Path, tracking_uri: str | None,
              at: tuple) -> Path:
    """Download ``uri`` (its checked ``parts``) into ``destination``, every failure one refusal
    at ``at``; a SQLite store that does not exist is never created."""
    import mlflow.artifacts

    store = resolve_uri(tracking_uri)
    reach(store, source_of(), advice=FETCH_ADVICE)
    if not store_exists(store):
        raise TrackingError(at, f"there is no tracking store at {store}, so no run to download "
                                f"{uri} from (give --tracking-uri or set MLFLOW_TRACKING_URI)")
    run_id, path = parts
    destination.mkdir(parents=True, exist_ok=True)
    client(store)  # a SQLite store made or finished, and rebased, as a run's client opens it
    try:
        with mlflow_bars(), deadlines():  # MLflow takes a whole run only as runs:/<id>/
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=f"runs:/{run_id}/{path}", dst_path=str(destination),
                tracking_uri=store)
    except Exception as error:
        raise TrackingError(at, _missing(parts, store)
                            or f"cannot download {uri} from {store}: {reason(error)}") from None
    return Path(local)


def _missing(parts: tuple[str, str], store: str) -> str | None:
    """What the store lacks for ``(run id, path)`` in plain words; None when both are there."""
    from mlflow.exceptions import MlflowException

    run_id, path = parts
    mlflow = client(store)
    try:
        mlflow.get_run(run_id)
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            return f"there is no run {run_id} in the store at {store}"
        return None
    if not path:
        return None
    folder = str(PurePosixPath(path).parent)
    try:
        infos = mlflow.list_artifacts(run_id, None if folder == "." else folder)
        listed = [info.path for info in infos]
    except Exception:
        return None
    if path.rstrip("/") in listed:
        return None
    shown = named([PurePosixPath(name).name for name in listed], 8)
    where = "it holds" if folder == "." else f"its folder {folder}/ holds"
    return f"run {run_id} has no artifact {path!r} ({where} {shown or 'nothing'})"


def _run_parts(uri: str, at: tuple, whole_run: bool = True) -> tuple[str, str]:
    """``runs:/<id>/<path>`` -> (id, path), each a safe name (an empty path: the whole run)."""
    try:
        return runs_uri_parts(uri, whole_run=whole_run)
    except ValueError as error:
        raise TrackingError(at, str(error)) from None


def fetch(uri: str, out_path: str | None = None, tracking_uri: str | None = None,
          convert: Callable[[str, str], object] | None = None) -> str:
    """Download ``runs:/<run_id>/<path>`` to ``out_path`` (a file, an existing folder, or None:
    its own name here) and return where it is; ``convert(source, target)`` rewrites it first
    (``fetch --basis``). A refusal leaves nothing at ``out_path``."""
    run_id, path = _run_parts(uri, _URI)
    with tempfile.TemporaryDirectory(prefix="causalab-fetch-") as staging:
        local = _download(uri, (run_id, path), Path(staging) / "download", tracking_uri, _URI)
        _verify(local, uri)
        name = Path(path).name or run_id
        target = Path(out_path) if out_path else Path(name)
        if target.is_dir():
            target = target / name
        if convert is not None:
            if local.is_dir():
                raise TrackingError(_URI, f"{uri} is a folder of artifacts, not one file")
            converted = Path(staging) / "converted"
            convert(str(local), str(converted))
            local = converted
        _place(local, target, uri)
    return str(target)


def _verify(local: Path, uri: str) -> None:
    """Check a downloaded bundle against its stamp's digest before it is placed; others pass."""
    from causalab.compile.bundles.checks import layout_header
    from causalab.compile.bundles.integrity import check_tensors

    weights = local / SAELENS_WEIGHTS if local.is_dir() else local
    if weights.suffix == TENSOR_SUFFIX and weights.is_file():
        shown = uri if weights == local else f"{uri.rstrip('/')}/{SAELENS_WEIGHTS}"
        check_tensors(str(weights), layout_header(str(weights), at=_URI), _URI, shown=shown,
                      finite=False)


def _place(local: Path, target: Path, uri: str) -> None:
    """Put a finished download at ``target`` by one rename, or merge it into a folder there."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if local.is_dir() and target.is_dir():
        shutil.copytree(local, target, dirs_exist_ok=True)
        return
    if local.is_dir() and target.exists():
        raise TrackingError(_URI, f"{uri} is a folder of artifacts and {target} is a file")
    part = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        shutil.move(local, part)
        os.replace(part, target)
    except BaseException:
        if part.is_dir():
            shutil.rmtree(part, ignore_errors=True)
        else:
            part.unlink(missing_ok=True)
        raise


def resolve_artifact(uri: str, tracking_uri: str | None = None) -> str:
    """The local path of a ``runs:/`` artifact, downloaded into the cache; else ``uri`` itself."""
    if not uri.startswith("runs:/"):
        return uri
    run_id, path = _run_parts(uri, _WHERE, whole_run=False)
    home = causalab_home() / "artifacts"
    destination = home / run_id / Path(path).parent
    inside(home, destination, _WHERE)
    local = _download(uri, (run_id, path), destination, tracking_uri, _WHERE)
    return str(inside(home, local, _WHERE))


def log_files(mlflow, run_id: str, files: list[tuple[str, str]]) -> dict[str, int]:
    """Log ``(local path, artifact path)`` pairs; returns what was sent, ``path -> size``."""
    repository = repository_of(mlflow, run_id)
    sent: dict[str, int] = {}
    for local, artifact in files:
        folder = str(Path(artifact).parent)
        folder = None if folder in ("", ".") else folder
        size = os.stat(local).st_size
        repository.log_artifact(local, folder)
        sent[str(PurePosixPath(folder or "", Path(local).name))] = size
    return sent


def log_bytes(mlflow, run_id: str, data: bytes, artifact: str) -> dict[str, int]:
    """Log in-memory bytes (a PNG) under ``artifact``; returns what was sent."""
    with tempfile.TemporaryDirectory(prefix="causalab-artifact-") as staging:
        local = Path(staging) / Path(artifact).name
        local.write_bytes(data)
        return log_files(mlflow, run_id, [(str(local), artifact)])


def download_run(mlflow, run_id: str, destination: str) -> list[str]:
    """Every file run ``run_id`` logged, copied under ``destination`` (keeping files there)."""
    with tempfile.TemporaryDirectory(prefix="causalab-reused-") as staging, mlflow_bars():
        local = Path(mlflow.download_artifacts(run_id, "", staging))
        found = []
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            relative = path.relative_to(local)
            target = Path(destination) / relative
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            found.append(relative.as_posix())
    return found


def log_loss_curve(mlflow, run_id: str, artifact: str, losses: list, evals: list, *,
                   title: str, eval_name: str) -> dict[str, int]:
    """Draw a fit's loss curve (:func:`causalab.plots.curves.loss_curve`) and log it."""
    png = plots.loss_curve(losses, evals, title=title, eval_name=eval_name)
    return log_bytes(mlflow, run_id, png, artifact)


def listing(mlflow: Any, run_id: str) -> dict[str, int]:
    """Every artifact of a run, ``path -> size`` in bytes, folders walked."""
    listed = repository_of(mlflow, run_id).list_artifacts
    found: dict[str, int] = {}
    folders: list[str | None] = [None]
    while folders:
        for info in listed(folders.pop()):
            if info.is_dir:
                folders.append(info.path)
            else:
                found[info.path] = int(info.file_size or 0)
    return found


def named(names: list[str], shown: int = 3) -> str:
    """The first ``shown`` names, then how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
