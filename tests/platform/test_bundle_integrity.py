"""A bundle whose tensors changed after it was stamped is refused, not used (docs/format.md §8.3).

The tampering is what a shared store or a careless copy does: a tensor of a shipped bundle
changed and the file saved again with its stamp left as it was (``safetensors.save_file``
with the old metadata). Each is refused by ``explain`` and by ``run`` in one line naming the
file and the tensor, before anything is written; the untouched bundle gives the same table,
value for value, as the same tensors with no digest. A stamp with no digest (one deleted key,
and a tampered tensor would go unseen) is refused unless the document trusts it
(``trust_unstamped``, the word an unstamped file needs); trusted, it runs with one ``note:``
line, and ``--strict`` refuses instead. ``causalab restamp`` gives it its digest back.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "documents" / "artifacts"
DATA = str(REPO / "documents" / "data")


def _metadata(path: Path) -> dict:
    with safe_open(str(path), "pt") as handle:
        return dict(handle.metadata())


def _edited(source: Path, target: Path, tensor: str, *, keep_digest: bool = True) -> Path:
    """``source``'s tensors with one entry of ``tensor`` moved, saved with its stamp as it was
    (or, with ``keep_digest=False``, untouched but stamped without the digest)."""
    tensors = load_file(str(source))
    metadata = _metadata(source)
    if keep_digest:
        tensors[tensor][0, 0] += 0.25
    else:
        metadata.pop("tensors_sha256")
    save_file(tensors, str(target), metadata=metadata)
    return target


def _document(tmp_path: Path, corpus: str, featurizer: str, bundle: str, *,
              trusted: bool = False) -> str:
    raw = json.loads((REPO / "documents" / "v2" / f"{corpus}.json").read_text())
    raw["featurizers"][featurizer]["file_path"] = bundle
    if trusted:
        raw["featurizers"][featurizer]["trust_unstamped"] = True
    path = tmp_path / f"{corpus}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _ours(err: str) -> list[str]:
    """stderr without MLflow's own INFO lines on opening a SQLite store."""
    return [line for line in err.splitlines() if " INFO mlflow." not in line]


def _cli(capsys, *argv) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


CASES = {
    "rotation_weight": ("das_apply", "rot", "rot.safetensors", "weight"),
    "rotation_basis": ("das_apply", "rot", "rot.safetensors", "basis"),
    "tiny_model_pca_basis": ("pca_control", "pca", "pca.safetensors", "weight"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bundle_edited_after_it_was_stamped_is_refused_by_explain_and_run_naming_the_tensor(
        case, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    corpus, featurizer, shipped, tensor = CASES[case]
    bundle = _edited(ARTIFACTS / shipped, tmp_path / shipped, tensor)
    document = _document(tmp_path, corpus, featurizer, str(bundle))
    for verb in (["explain", document], ["run", document, "--no-track", "--device-map", "cpu",
                                         "--out", str(tmp_path / "out")]):
        status, _, err = _cli(capsys, *verb, "--data-root", DATA)
        assert status == 1
        (line,) = err.splitlines()
        assert line.startswith(f"error: featurizers.{featurizer}.file_path: {bundle}: tensor "
                               f"{tensor} differs from its stamp's digest")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_untouched_bundle_scores_bit_for_bit_as_the_same_tensors_without_a_digest(
        tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    plain = _edited(ARTIFACTS / "rot.safetensors", tmp_path / "plain.safetensors", "weight",
                    keep_digest=False)
    tables = {}
    for name, bundle in (("stamped", ARTIFACTS / "rot.safetensors"), ("plain", plain)):
        document = _document(tmp_path, "das_apply", "rot", str(bundle), trusted=name == "plain")
        status, _, err = _cli(capsys, "run", document, "--no-track", "--device-map", "cpu",
                              "--out", str(tmp_path / name), "--data-root", DATA)
        assert status == 0, err
        rows = json.loads((tmp_path / name / "logit_diff.json").read_text())
        tables[name] = [(row["example_id"], row["value"]) for row in rows]
        if name == "plain":  # the digest check could not run, and says so
            assert err.splitlines() == [f"note: featurizers.rot.file_path: {plain}: tensors not "
                                        "checked: its stamp has no digest, trusted as the "
                                        "document says (re-stamp it: causalab restamp "
                                        f"{plain})"]
    assert tables["stamped"] == tables["plain"] and len(tables["plain"]) > 0


def test_a_stamp_without_a_digest_is_refused_unless_trusted_then_noted_and_strict_refuses(
        tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    plain = _edited(ARTIFACTS / "rot.safetensors", tmp_path / "rot.safetensors", "weight",
                    keep_digest=False)
    tampered = load_file(str(plain))
    tampered["weight"][0, 0] += 0.25  # the tamper a missing digest would hide
    save_file(tampered, str(plain), metadata=_metadata(plain))
    document = _document(tmp_path, "das_apply", "rot", str(plain))
    for verb in (["explain", document], ["run", document, "--no-track", "--device-map", "cpu",
                                         "--out", str(tmp_path / "out")]):
        status, _, err = _cli(capsys, *verb, "--data-root", DATA)
        (line,) = err.splitlines()
        assert status == 1 and line.startswith(f"error: featurizers.rot.file_path: {plain}: "
                                               "its stamp has no tensor digest"), err
        assert "trust_unstamped" in line and "causalab restamp" in line
    assert not (tmp_path / "out").exists()
    trusted = _document(tmp_path, "das_apply", "rot", str(plain), trusted=True)
    status, _, err = _cli(capsys, "explain", trusted, "--data-root", DATA)
    assert status == 0 and err.startswith("note: featurizers.rot.file_path: ")
    status, _, err = _cli(capsys, "explain", trusted, "--data-root", DATA, "--strict")
    assert status == 1 and err.startswith("error: featurizers.rot.file_path: ")
    status, out, _ = _cli(capsys, "restamp", str(plain))
    assert status == 0 and out.strip() == f"restamped {plain}: basis, weight"
    status, _, err = _cli(capsys, "explain", document, "--data-root", DATA)
    assert status == 0 and err == ""


def test_restamp_gives_an_intended_edit_its_digest_and_explain_then_compiles(
        tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    bundle = _edited(ARTIFACTS / "rot.safetensors", tmp_path / "rot.safetensors", "weight")
    document = _document(tmp_path, "das_apply", "rot", str(bundle))
    assert _cli(capsys, "explain", document, "--data-root", DATA)[0] == 1
    status, out, _ = _cli(capsys, "restamp", str(bundle))
    assert status == 0 and out.strip() == f"restamped {bundle}: basis, weight"
    status, _, err = _cli(capsys, "explain", document, "--data-root", DATA)
    assert status == 0 and err == ""


def test_explain_says_a_tracked_bundle_was_not_checked_without_a_store_and_strict_refuses(
        tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./mlflow.db here
    uri = "runs:/0123abcd/rot.safetensors"
    document = _document(tmp_path, "das_apply", "rot", uri)
    status, _, err = _cli(capsys, "explain", document, "--data-root", DATA)
    assert status == 0
    assert err.splitlines() == [f"note: featurizers.rot.file_path: {uri} not checked: no tracking "
                                "store known (give --tracking-uri or set MLFLOW_TRACKING_URI)"]
    status, _, err = _cli(capsys, "explain", document, "--data-root", DATA, "--strict")
    assert status == 1
    assert err.splitlines() == [f"error: featurizers.rot.file_path: {uri} not checked: no "
                                "tracking store known (give --tracking-uri or set "
                                "MLFLOW_TRACKING_URI)"]


def test_a_tracking_uri_overruled_by_the_environment_is_said_in_one_line(
        tmp_path, capsys, monkeypatch):
    used, given = f"sqlite:///{tmp_path}/env.db", f"sqlite:///{tmp_path}/flag.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", used)
    status, _, err = _cli(capsys, "runs", "--tracking-uri", given)
    assert status == 0
    assert err.splitlines() == [f"note: tracking store {used} (MLFLOW_TRACKING_URI is set and "
                                f"wins over --tracking-uri {given})"]


@pytest.fixture
def tampered_store(tmp_path):
    """(tracking URI, runs:/ URI) of the shipped rotation logged to a SQLite store, then its
    weight changed in the store's artifact folder with the stamp left as it was."""
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(store)
    experiment = client.create_experiment("tampered", artifact_location=str(tmp_path / "art"))
    run_id = client.create_run(experiment).info.run_id
    client.log_artifact(run_id, str(ARTIFACTS / "rot.safetensors"))
    client.set_terminated(run_id)
    (stored,) = (tmp_path / "art").rglob("rot.safetensors")
    shutil.copyfile(_edited(ARTIFACTS / "rot.safetensors", tmp_path / "edited.safetensors",
                            "weight"), stored)
    return store, f"runs:/{run_id}/rot.safetensors"


def test_a_tracked_bundle_changed_in_the_store_is_refused_by_explain_run_and_fetch(
        tmp_path, capsys, monkeypatch, tampered_store):
    store, uri = tampered_store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("CAUSALAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    monkeypatch.chdir(tmp_path)
    document = _document(tmp_path, "das_apply", "rot", uri)
    for verb in (["explain", document], ["run", document, "--no-track", "--device-map", "cpu",
                                         "--out", str(tmp_path / "out")]):
        status, _, err = _cli(capsys, *verb, "--data-root", DATA, "--tracking-uri", store)
        assert status == 1
        (line,) = _ours(err)
        assert line.startswith(f"error: featurizers.rot.file_path: {uri}: tensor weight differs "
                               "from its stamp's digest")
    status, _, err = _cli(capsys, "fetch", uri, "-o", str(tmp_path / "fetched.safetensors"),
                          "--tracking-uri", store)
    assert status == 1 and not (tmp_path / "fetched.safetensors").exists()
    assert _ours(err) == [f"error: uri: {uri}: tensor weight differs from its stamp's "
                                "digest (changed after it was saved); if the change is meant, "
                                "re-stamp it (causalab restamp FILE)"]
