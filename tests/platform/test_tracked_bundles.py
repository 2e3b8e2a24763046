"""``runs:/`` bundles are checked at compile time whenever a tracking store is known.

The session's real MLflow server (tests/platform/conftest.py) holds the shipped rotation (stamped for
tiny-llama, block_output[0]) as a run's artifact; ``causalab explain`` of das_apply pointed at
that URI compiles at layer 0 and is refused at layer 1, naming the featurizer's file_path.
An unreachable store and a URI with no store at all are refused in one line.
"""
from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import pytest
import torch

from causalab.cli.main import main
from causalab.errors import CompileError
from causalab.pipeline import compile_only

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
AT = "featurizers.rot.file_path"


@pytest.fixture(scope="module")
def tracked(mlflow_server) -> tuple[str, str]:
    """(tracking URI, runs:/ URI of the shipped rotation logged to the session's server)."""
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server)
    experiment = client.create_experiment(f"bundles-{uuid.uuid4().hex[:8]}")
    run = client.create_run(experiment)
    client.log_artifact(run.info.run_id, str(REPO / "documents" / "artifacts" / "rot.safetensors"))
    client.set_terminated(run.info.run_id)
    return mlflow_server, f"runs:/{run.info.run_id}/rot.safetensors"


def _document(tmp_path: Path, file_path: str, layer: int) -> str:
    raw = json.loads((REPO / "documents" / "v2" / "das_apply.json").read_text())
    raw["featurizers"]["rot"]["file_path"] = file_path
    raw["sites"]["target"]["layers"] = [layer]
    path = tmp_path / "apply.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _explain(capsys, monkeypatch, tmp_path, document: str, uri: str) -> tuple[int, str]:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("CAUSALAB_HOME", str(tmp_path / "home"))  # the artifact cache
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    status = main(["explain", document, "--data-root", DATA, "--tracking-uri", uri])
    out, err = capsys.readouterr()
    return status, err


def test_explain_compiles_a_tracked_rotation_at_the_layer_it_was_fitted_at(capsys, monkeypatch, tmp_path, tracked):
    uri, bundle = tracked
    status, err = _explain(capsys, monkeypatch, tmp_path, _document(tmp_path, bundle, 0), uri)
    assert status == 0, err


def test_explain_refuses_a_tracked_rotation_fitted_at_another_layer_naming_its_file_path(
        capsys, monkeypatch, tmp_path, tracked):
    uri, bundle = tracked
    status, err = _explain(capsys, monkeypatch, tmp_path, _document(tmp_path, bundle, 1), uri)
    assert status == 1
    assert err.count("\n") == 1 and f"{AT}: layer:" in err


def test_an_unreachable_tracking_store_is_refused_in_one_line(capsys, monkeypatch, tmp_path, tracked):
    _, bundle = tracked
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    status, err = _explain(capsys, monkeypatch, tmp_path, _document(tmp_path, bundle, 0),
                           f"http://127.0.0.1:{port}")
    assert status == 1
    assert err.count("\n") == 1 and f"{AT}: cannot reach the tracking server" in err


def test_a_run_with_a_tracked_bundle_and_no_store_is_refused_at_compile_time(monkeypatch, tmp_path):
    from causalab.engine.events import Events

    raw = json.loads(Path(_document(tmp_path, "runs:/0123abcd/rot.safetensors", 0)).read_text())
    with pytest.raises(CompileError) as refused:
        compile_only(raw, DATA, resolver=Events().resolve)
    assert refused.value.path == ("featurizers", "rot", "file_path")


def test_fetch_basis_gives_the_orthonormal_matrix_a_hook_takes(capsys, monkeypatch, tmp_path, tracked):
    from safetensors.torch import load_file

    uri, bundle = tracked
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    target = tmp_path / "Q.safetensors"
    status = main(["fetch", bundle, "-o", str(target), "--basis", "--tracking-uri", uri])
    assert status == 0, capsys.readouterr().err
    fetched = load_file(str(target))
    shipped = load_file(str(REPO / "documents" / "artifacts" / "rot.safetensors"))
    assert set(fetched) == {"basis"} and torch.equal(fetched["basis"], shipped["basis"])


def test_the_basis_of_a_bundle_that_stores_only_its_weight_is_its_cayley_map(tmp_path):
    from safetensors.torch import load_file, save_file

    from causalab.engine.featurizers.subspace import export_basis

    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(0)) / 4
    save_file({"weight": w}, str(tmp_path / "old.safetensors"), metadata={"kind": "subspace"})
    q = load_file(export_basis(str(tmp_path / "old.safetensors"), str(tmp_path / "q.safetensors")))["basis"]
    w64, eye = w.double(), torch.eye(16, dtype=torch.float64)
    a = w64 @ eye[:, :4].T - eye[:, :4] @ w64.T
    want = torch.linalg.solve(eye - a, (eye + a) @ eye[:, :4])  # the Cayley map, written out
    assert torch.allclose(q.double(), want, atol=1e-5)  # float32 Woodbury solve vs float64 dense
