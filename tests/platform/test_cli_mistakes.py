"""User mistakes an exploratory tester found, each now one line naming its place.

A model key that is no model, a string that is not text, an output folder that cannot be
written, an artifact that is not a bundle or not there, a store that does not exist and one
that does not answer: each is refused on stderr in one line that names the argument, flag or
file, exits non-zero, leaves nothing behind, and never prints a library's exception in place
of the refusal.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "documents" / "v2"
DATA = str(REPO / "documents" / "data")
TINY = "causalab:tiny-llama"
RUN_ID = "0123456789abcdef0123456789abcdef"
# A library's exception standing in for a refusal: ``ValueError: …``, ``MlflowException: …``.
RAW = re.compile(r"\b[A-Z]\w*(Error|Exception)\b")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def one_refusal(err: str, place: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {place}: "), err
    assert not RAW.search(lines[0]), lines[0]
    return lines[0]


def _not_a_model(tmp_path: Path, kind: str) -> str:
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "broken_json":
        (folder / "config.json").write_text("{")
    elif kind == "impossible_config":
        (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 16}')
    return str(folder)


@pytest.mark.parametrize("verb", ["model", "tokens"])
@pytest.mark.parametrize("kind, said", [("no_config", "config.json"),
                                        ("broken_json", "not valid JSON"),
                                        ("impossible_config", "not a multiple")])
def test_a_directory_that_is_not_a_model_is_refused_at_the_key(capsys, tmp_path, verb, kind,
                                                               said):
    folder = _not_a_model(tmp_path, kind)
    argv = [verb, folder] + (["x"] if verb == "tokens" else [])
    status, out, err = cli(capsys, *argv)
    assert status == 1 and out == ""
    line = one_refusal(err, "key")
    assert said in line or "tokenizer.json" in line


def test_model_names_what_is_wrong_with_the_config(capsys, tmp_path):
    status, _, err = cli(capsys, "model", _not_a_model(tmp_path, "impossible_config"))
    assert status == 1
    assert "config.json is not a valid llama config" in one_refusal(err, "key")


@pytest.mark.parametrize("verb", ["model", "tokens"])
def test_an_empty_model_key_is_refused_not_read_as_the_working_directory(capsys, verb):
    status, _, err = cli(capsys, verb, "", *(["x"] if verb == "tokens" else []))
    assert status == 1
    assert "blank" in one_refusal(err, "key")


def test_explain_refuses_a_model_directory_with_broken_json_at_model_key(capsys, tmp_path):
    document = json.loads((CORPUS / "patching.json").read_text())
    document["model"].update(key=_not_a_model(tmp_path, "broken_json"), revision="main")
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))
    status, _, err = cli(capsys, "explain", str(path), "--data-root", DATA)
    assert status == 1
    assert "not valid JSON" in one_refusal(err, "model.key")


def test_a_string_that_is_not_utf8_is_refused_naming_the_argument(capsys):
    undecodable = os.fsdecode(b"\xff")  # what argv holds for a byte that is not UTF-8
    status, out, err = cli(capsys, "tokens", TINY, " Friday", undecodable)
    assert status == 2 and out == ""
    assert "string 2" in one_refusal(err, "strings")


# --- output places --------------------------------------------------------------------------

@pytest.mark.parametrize("out", ["/sys/causalab-x/y", "/proc/causalab-x", ""])
def test_run_refuses_an_output_folder_it_cannot_make_before_any_work(capsys, tmp_path,
                                                                     monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    status, stdout, err = cli(capsys, "run", str(CORPUS / "patching.json"), "--no-track",
                              "--device-map", "cpu", "--data-root", DATA, "--out", out)
    assert status == 2 and stdout == ""
    one_refusal(err, "--out")
    assert list(tmp_path.iterdir()) == []
    assert time.monotonic() - started < 5  # refused before the model loads


def test_fetch_refuses_an_output_it_cannot_write_and_creates_no_store(capsys, tmp_path,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, err = cli(capsys, "fetch", f"runs:/{RUN_ID}/iia.json", "-o", "/sys/causalab-x/y")
    assert status == 2
    one_refusal(err, "-o/--output")
    assert list(tmp_path.iterdir()) == []


def test_an_output_folder_that_can_be_made_is_left_as_it_was(tmp_path):
    from causalab.flags import check_writable

    check_writable(str(tmp_path / "a" / "b"), ("--out",))
    assert list(tmp_path.iterdir()) == []


# --- fetch from a store -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, str]:
    """(directory of a SQLite store, id of a FINISHED run holding iia.json), made directly."""
    from causalab.tracking import runs

    folder = tmp_path_factory.mktemp("store")
    uri = _sqlite(str(folder))
    mlflow = runs.client(uri)
    experiment = runs.experiment_id(mlflow, "mistakes", uri)
    run_id = runs.create_run(mlflow, experiment, "point", {})
    table = folder / "iia.json"
    table.write_text(json.dumps([{"example_id": "a", "value": 1.0}]))
    mlflow.log_artifact(run_id, str(table))
    table.unlink()
    runs.terminate(mlflow, run_id, "FINISHED")
    return str(folder), run_id


def _sqlite(folder: str) -> str:
    return f"sqlite:///{Path(folder) / 'mlflow.db'}"


def test_fetch_basis_of_a_json_artifact_is_refused_and_leaves_nothing(capsys, tmp_path, store):
    folder, run_id = store
    target = tmp_path / "b.safetensors"
    status, _, err = cli(capsys, "fetch", f"runs:/{run_id}/iia.json", "--basis", "-o",
                         str(target), "--tracking-uri", _sqlite(folder))
    assert status == 2
    assert "not a safetensors bundle" in one_refusal(err, "--basis")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri, said", [(f"runs:/{RUN_ID}/iia.json", f"no run {RUN_ID}"),
                                       ("runs:/{run}/nope.json", "no artifact 'nope.json'")])
def test_fetch_of_what_the_store_lacks_names_the_uri_and_what_is_missing(capsys, tmp_path,
                                                                         store, uri, said):
    folder, run_id = store
    status, _, err = cli(capsys, "fetch", uri.format(run=run_id), "-o", str(tmp_path / "x"),
                         "--tracking-uri", _sqlite(folder))
    assert status == 1
    assert said in one_refusal(err, "uri")
    assert list(tmp_path.iterdir()) == []


def test_fetch_under_quiet_draws_no_mlflow_bar(capsys, tmp_path, monkeypatch, store):
    folder, run_id = store
    monkeypatch.setenv("CAUSALAB_QUIET", "1")
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    target = tmp_path / "iia.json"
    status, out, err = cli(capsys, "fetch", f"runs:/{run_id}/iia.json", "-o", str(target),
                           "--tracking-uri", _sqlite(folder))
    assert status == 0, err
    assert out.strip() == str(target) and json.loads(target.read_text())[0]["example_id"] == "a"
    assert "Downloading" not in err
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ


def test_a_directory_tracking_uri_is_the_sqlite_store_in_it(capsys, tmp_path, store):
    folder, run_id = store
    target = tmp_path / "iia.json"
    status, _, err = cli(capsys, "fetch", f"runs:/{run_id}/iia.json", "-o", str(target),
                         "--tracking-uri", folder)
    assert status == 0, err
    assert target.is_file()
    status, out, err = cli(capsys, "runs", "--tracking-uri", folder)
    assert status == 0, err
    assert run_id in out


# --- stores that are not there or do not answer ---------------------------------------------

@pytest.mark.parametrize("form", ["sqlite", "directory"])
def test_runs_of_a_store_that_is_not_there_creates_nothing(capsys, tmp_path, form):
    missing = tmp_path / "nowhere"
    uri = f"sqlite:///{missing / 'x.db'}" if form == "sqlite" else str(missing)
    status, out, err = cli(capsys, "runs", "--tracking-uri", uri)
    assert status == 0, err
    assert "no tracking store" in out
    assert not missing.exists()


def test_fetch_from_a_store_that_is_not_there_creates_nothing(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    status, _, err = cli(capsys, "fetch", f"runs:/{RUN_ID}/iia.json", "-o", str(tmp_path / "x"),
                         "--tracking-uri", str(missing))
    assert status == 1
    assert "no tracking store" in one_refusal(err, "uri")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def dead_port():
    """A port on 127.0.0.1 held bound and not listening: every connection is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.mark.parametrize("through", ["flag", "environment"])
def test_explain_refuses_an_unreachable_store_in_seconds(tmp_path, dead_port, through):
    raw = json.loads((CORPUS / "das_apply.json").read_text())
    raw["featurizers"]["rot"]["file_path"] = f"runs:/{RUN_ID}/rot.safetensors"
    document = tmp_path / "apply.json"
    document.write_text(json.dumps(raw))
    server = f"http://127.0.0.1:{dead_port}"
    argv = [sys.executable, "-m", "causalab", "explain", str(document), "--data-root", DATA]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    if through == "flag":
        argv += ["--tracking-uri", server]
    else:
        env["MLFLOW_TRACKING_URI"] = server
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=60)
    assert done.returncode == 1
    line = one_refusal(done.stderr, "featurizers.rot.file_path")
    assert f"cannot reach the tracking server at {server}" in line
    assert time.monotonic() - started < 30  # MLflow's own retries take about four minutes


@pytest.mark.parametrize("where", ["proc", "under_a_file", "file_store"])
def test_run_refuses_a_local_store_it_cannot_make_in_seconds_and_writes_nothing(
        capsys, tmp_path, monkeypatch, where):
    # SQLAlchemy retried /proc for two minutes; a file where a folder should be and MLflow's
    # retired file store were raw FileExistsError / MlflowException lines after compiling.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "a_file").write_text("")
    uri = {"proc": "sqlite:////proc/causalab-x/mlflow.db",
           "under_a_file": f"sqlite:///{tmp_path / 'a_file' / 'mlflow.db'}",
           "file_store": (tmp_path / "mlruns").as_uri()}[where]
    started = time.monotonic()
    status, _, err = cli(capsys, "run", str(CORPUS / "patching.json"), "--tracking-uri", uri,
                         "--device-map", "cpu", "--data-root", DATA, "--out",
                         str(tmp_path / "out"))
    assert status == 1
    assert uri in one_refusal(err, "--tracking-uri")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("override, place", [("steps.fit.epochs=abc", "steps.fit.epochs"),
                                             ("+x=1", "x")])
def test_render_refuses_a_composition_that_is_no_valid_document(capsys, override, place):
    # render printed these with exit 0: "epochs": "abc", and an unknown top-level key.
    status, stdout, err = cli(capsys, "render", "experiment=das", override)
    assert status == 1 and stdout == ""
    one_refusal(err, place)


def test_runs_finds_a_point_by_the_digest_start_it_shows_and_refuses_what_is_no_digest(
        capsys, tmp_path, monkeypatch):
    # `causalab runs` shows 12 characters of produced_by; --produced-by took only all 64.
    from mlflow import MlflowClient

    from causalab.tracking import runs as store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow = MlflowClient(uri)
    experiment = mlflow.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    digest, other = "ab" * 32, "ac" * 32
    for produced_by in (digest, other):
        mlflow.create_run(experiment, tags={store.PRODUCED_BY: produced_by})
    for given in (digest, digest[:12]):
        status, out, _ = cli(capsys, "--json", "runs", "--produced-by", given, "--tracking-uri", uri)
        assert status == 0
        assert [r["produced_by"] for r in json.loads(out)["runs"]] == [digest]
    status, _, err = cli(capsys, "runs", "--produced-by", "ab' or '1", "--tracking-uri", uri)
    assert status == 2 and "--produced-by" in err and "not a digest" in err


def test_a_subspace_bundle_that_is_a_folder_is_refused_as_one_not_as_a_missing_sae_file(
        capsys, tmp_path, monkeypatch):
    # The message was "bundle not found: <folder>/sae_weights.safetensors", an SAE's file.
    monkeypatch.chdir(REPO)
    document = json.loads((CORPUS / "das_apply.json").read_text())
    document["featurizers"]["rot"]["file_path"] = str(tmp_path)
    (tmp_path / "doc.json").write_text(json.dumps(document))
    status, _, err = cli(capsys, "explain", str(tmp_path / "doc.json"), "--data-root", DATA)
    assert status == 1
    line = one_refusal(err, "featurizers.rot.file_path")
    assert "is a folder; a subspace bundle is one .safetensors file" in line
