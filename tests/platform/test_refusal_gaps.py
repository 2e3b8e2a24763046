"""The inputs that used to escape, crash or pass silently, each now refused at its place.

Each case is a corpus document changed in one way and read the way ``causalab explain``
reads it (the file's bytes, then lower, validate and compile); the refusal's path is
asserted, never its wording. Writes are checked on a real run directory with a real symlink,
and a NaN bundle on a real load of the tiny Llama.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from causalab.cli import main as cli
from causalab.errors import CausalabError, RunError, TrackingError
from causalab.pipeline import run_document

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "documents" / "v2"
DATA = str(REPO / "documents" / "data")


def _corpus(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.json").read_text())


def _explain(path: Path) -> CausalabError:
    args = cli.build_parser().parse_args(["explain", str(path), "--data-root", DATA])
    with pytest.raises(CausalabError) as refused:
        cli.VERBS["explain"][0](args)
    line = cli._error_line(refused.value)
    assert "\n" not in line and "Traceback" not in line
    return refused.value


def _step_renamed(doc):
    doc["steps"] = {"../../x": doc["steps"]["patch"]}


def _intervention_renamed(doc):
    doc["interventions"] = {"a/b": doc["interventions"]["patch"]}
    doc["steps"]["patch"]["interventions"] = "a/b"


def _swept_head_past_the_count(doc):
    doc["sites"]["head_out"]["heads"] = {"sweep": [[0], [1], [2], [99]]}


def _long_label(doc):
    doc["sites"]["head_out"]["heads"] = {"sweep": [[0], list(range(120))]}


def _set(path: tuple, value):
    def change(doc):
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return change


PATCH = ("interventions", "patch")
CASES = {
    "step_escaping_out": ("patching", _step_renamed, ("steps", "../../x")),
    "intervention_with_a_slash": ("patching", _intervention_renamed, ("interventions", "a/b")),
    "save_with_a_nul": ("patching", _set(("steps", "patch", "saves", 0, "file_path"), "a\x00.json"),
                        ("steps", "patch", "saves", 0, "file_path")),
    "save_with_a_too_long_name": ("patching", _set(("steps", "patch", "saves", 0, "file_path"),
                                                   "x" * 300 + ".json"),
                                  ("steps", "patch", "saves", 0, "file_path")),
    "field_a_dot_dot_b": ("patching", _set(("roles", "base", "field"), "a..b"),
                          ("roles", "base", "field")),
    "misspelt_lm_head": ("patching", _set(("sites", "head", "component"), "lm_haed"),
                         ("sites", "head", "component")),
    "empty_features": ("sae_feature_ablation",
                       _set(("interventions", "ablate", "writes", "ablate", "features"), []),
                       ("interventions", "ablate", "writes", "ablate", "features")),
    "decode_past_the_context": ("generate_probe", _set(("interventions", "probe", "decode"), 10 ** 9),
                                ("interventions", "probe", "decode")),
    "url_featurizer": ("das_apply", _set(("featurizers", "rot", "file_path"), "http://example.com/rot"),
                       ("featurizers", "rot", "file_path")),
    "runs_uri_escaping_the_cache": ("das_apply", _set(("featurizers", "rot", "file_path"),
                                                      "runs:/../../x/rot.safetensors"),
                                    ("featurizers", "rot", "file_path")),
    "swept_value_at_its_authored_path": ("head_patching", _swept_head_past_the_count,
                                         ("sites", "head_out", "heads", "sweep", 3)),
    "label_too_long_for_a_directory": ("head_patching", _long_label,
                                       ("sites", "head_out", "heads")),
    "range_too_long_to_count": ("head_patching", _set(("sites", "head_out", "layers"),
                                                      {"sweep": {"range": [0, 10 ** 15]}}),
                                ("sites", "head_out", "layers")),
    "fit_of_ten_million_epochs": ("das", _set(("steps", "fit", "epochs"), 10 ** 7),
                                  ("steps", "fit", "epochs")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_document_that_used_to_escape_or_crash_is_refused_at_its_path(case, tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(REPO)
    name, change, path = CASES[case]
    doc = _corpus(name)
    change(doc)
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    assert _explain(tmp_path / "doc.json").path == path


TEXTS = {
    "not_utf8": lambda text: text.encode()[:40] + b"\xff" + text.encode()[40:],
    "nested_too_deep": lambda text: b'{"a": ' * 100 + b"1" + b"}" * 100,
    "nested_past_the_recursion_limit": lambda text: b"[" * 100_000 + b"]" * 100_000,
    "too_large": lambda text: b" " * (16 * 1024 * 1024 + 1) + text.encode(),
}


@pytest.mark.parametrize("case", list(TEXTS))
def test_input_that_is_no_json_tree_is_refused_naming_the_file(case, tmp_path):
    (tmp_path / "doc.json").write_bytes(TEXTS[case](json.dumps(_corpus("patching"))))
    refused = _explain(tmp_path / "doc.json")
    assert refused.path == () and refused.message.startswith(f"{tmp_path / 'doc.json'}: ")


@pytest.mark.parametrize("literal, path", [("9" * 5000, ("steps", "patch", "x")),
                                           ('"\\ud800"', ("steps", "patch", "x"))],
                         ids=["five_thousand_digits", "lone_surrogate"])
def test_a_scalar_json_holds_but_python_cannot_is_refused_at_its_path(literal, path, tmp_path):
    text = json.dumps(_corpus("patching")).replace('"kind": "observe"',
                                                   f'"kind": "observe", "x": {literal}')
    (tmp_path / "doc.json").write_text(text)
    assert _explain(tmp_path / "doc.json").path == path


def test_a_save_through_a_symlink_out_of_out_is_refused_and_nothing_is_written(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "link").symlink_to(elsewhere)
    doc = _corpus("patching")
    doc["steps"]["patch"]["saves"][1]["file_path"] = "link/logit_diff.json"
    with pytest.raises(RunError) as refused:
        run_document(doc, out=str(out), device_map="cpu", data_root=DATA)
    assert refused.value.path == ("steps", "patch", "saves", 1, "file_path")
    assert sorted(os.listdir(out)) == ["link"] and os.listdir(elsewhere) == []


def test_a_point_directory_that_is_a_symlink_out_of_out_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "heads=1").symlink_to(elsewhere)
    with pytest.raises(RunError) as refused:
        run_document(_corpus("head_patching"), out=str(out), device_map="cpu", data_root=DATA)
    assert refused.value.path == ("--out",)
    assert sorted(os.listdir(out)) == ["heads=1"] and os.listdir(elsewhere) == []


def test_a_directory_swapped_for_a_symlink_after_its_check_carries_no_write_out(
        tmp_path, monkeypatch):
    """The race the path checks alone lose: the point's directory passes them, then becomes
    a symlink out of ``--out`` before the file is written. The write goes through the
    directory as opened and checked, so it is refused and nothing lands outside."""
    from causalab.engine import record

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    checked = record.inside

    def swapping(root, path, *args, **kwargs):
        found = checked(root, path, *args, **kwargs)
        folder = Path(path).parent
        if Path(path).name == "table.json" and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
            folder.symlink_to(elsewhere)
        return found
    monkeypatch.setattr(record, "inside", swapping)
    with pytest.raises(RunError) as refused:
        record.write_json(out / "point" / "table.json", [{"value": 1}], root=out)
    assert refused.value.path == ("--out",)
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(out)) == ["point"]


def test_a_runs_uri_out_of_the_artifact_cache_is_refused_before_any_folder_is_made(
        tmp_path, monkeypatch):
    from causalab.tracking import resolve_artifact

    monkeypatch.setenv("CAUSALAB_HOME", str(tmp_path / "home"))
    with pytest.raises(TrackingError):
        resolve_artifact("runs:/../../escaped/rot.safetensors", f"sqlite:///{tmp_path}/m.db")
    assert sorted(os.listdir(tmp_path)) == []


def test_a_bundle_holding_nan_is_refused_by_explain_and_run_naming_the_tensor(tmp_path, monkeypatch):
    from causalab.engine.bundle_files import restamp
    from causalab.errors import CompileError

    shipped = REPO / "documents" / "artifacts" / "rot.safetensors"
    with safe_open(str(shipped), "pt") as handle:
        metadata = handle.metadata()
    weight = load_file(str(shipped))["weight"].clone()
    weight[3, 2] = float("nan")
    save_file({"weight": weight}, str(tmp_path / "rot.safetensors"), metadata=metadata)
    restamp(str(tmp_path / "rot.safetensors"))  # its digest now says NaN on purpose
    doc = _corpus("das_apply")
    doc["featurizers"]["rot"]["file_path"] = str(tmp_path / "rot.safetensors")
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    explained = _explain(tmp_path / "doc.json")  # at compile, where explain reads the tensors
    with pytest.raises(CompileError) as refused:
        run_document(doc, out=str(tmp_path / "out"), device_map="cpu", data_root=DATA)
    for error in (explained, refused.value):
        assert error.path == ("featurizers", "rot", "file_path")
        assert "tensor weight holds 1 NaN or Inf" in error.message
    assert not (tmp_path / "out" / "logit_diff.json").exists()


def test_a_fault_in_a_hydra_job_is_one_line_and_exit_one_unless_its_traceback_is_asked_for(
        monkeypatch, capsys):
    # Hydra prints a fault's whole traceback and its HYDRA_FULL_ERROR hint; a job says one
    # line, as the CLI does, and HYDRA_FULL_ERROR=1 still shows the traceback.
    import importlib

    entry = importlib.import_module("causalab.run")

    def faulty(config):
        raise ValueError("an internal\n   fault")
    monkeypatch.setattr(entry, "_run", faulty)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop:
        entry.job(None)
    assert stop.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: ValueError: an internal fault (set HYDRA_FULL_ERROR=1 for the traceback)"]
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError):
        entry.job(None)


@pytest.mark.parametrize("key", ["enabled", "rerun"])
@pytest.mark.parametrize("value", ["no", "maybe", 0])
def test_a_tracking_switch_that_is_not_true_or_false_is_refused_naming_it(key, value, tmp_path):
    # `tracking.enabled=no` used to be the string "no", read as true: tracked regardless.
    from omegaconf import OmegaConf

    from causalab.errors import UsageError
    from causalab.run import tracking_events

    config = OmegaConf.create({"tracking": {"enabled": True, "rerun": False, key: value}})
    with pytest.raises(UsageError) as refused:
        tracking_events(config, str(tmp_path))
    assert refused.value.path == ("tracking", key) and repr(value) in refused.value.message


def test_an_empty_tracking_experiment_is_refused_not_read_as_the_default(tmp_path):
    from omegaconf import OmegaConf

    from causalab.errors import UsageError
    from causalab.run import tracking_events

    config = OmegaConf.create({"tracking": {"enabled": True, "rerun": False, "experiment": " "}})
    with pytest.raises(UsageError) as refused:
        tracking_events(config, str(tmp_path))
    assert refused.value.path == ("tracking", "experiment")


def test_a_refusal_quotes_a_five_thousand_character_name_cut_to_eighty_with_an_ellipsis(
        tmp_path, capsys):
    doc = _corpus("patching")
    long_name = "r" * 5000
    doc["interventions"]["patch"]["reads"]["v_cf"]["input"] = long_name
    # The longest role a name may be (255 bytes), so the declared roles the refusal lists are long.
    doc["roles"]["r" * 255] = doc["roles"]["base"]
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    assert cli.main(["validate", str(tmp_path / "doc.json")]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: interventions.patch.reads.v_cf.input: ")
    assert len(line) < 300 and "…" in line and long_name not in line


def test_a_long_key_in_a_refusal_path_is_cut_and_the_path_kept_whole_as_data():
    from causalab.errors import DocumentError, format_path

    error = DocumentError(("steps", "x" * 500, "rows"), "refused")
    assert len(format_path(error.path)) < 100 and error.path[1] == "x" * 500


def test_a_failed_multirun_job_is_reported_on_a_line_that_starts_with_error(monkeypatch):
    import importlib

    entry = importlib.import_module("causalab.run")
    monkeypatch.setattr(entry, "_multirun", lambda: True)
    monkeypatch.setattr(entry, "_which_job", lambda: "job 1 (site.layer=99): ")
    with pytest.raises(entry.JobFailed) as failed:
        entry._fail()
    assert str(failed.value).startswith("error: job 1 (site.layer=99) failed")


def test_a_tracked_bundle_of_another_rank_through_the_hydra_entry_is_one_error_line(tmp_path):
    import subprocess
    import sys

    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(store)
    experiment = client.create_experiment("bundles", artifact_location=str(tmp_path / "art"))
    run_id = client.create_run(experiment).info.run_id
    client.log_artifact(run_id, str(REPO / "documents" / "artifacts" / "rot.safetensors"))
    client.set_terminated(run_id)
    command = [sys.executable, "-m", "causalab.run", "experiment=das_apply", "model=tiny_llama",
               f"featurizers.rot.file_path=runs:/{run_id}/rot.safetensors", "featurizers.rot.k=4",
               f"tracking.uri={store}", f"run.out={tmp_path / 'out'}",
               f"hydra.run.dir={tmp_path / 'hydra'}", f"run.data_root={DATA}"]
    env = dict(os.environ, CAUSALAB_HOME=str(tmp_path / "home"), MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "error: featurizers.rot.file_path: k: bundle says 8, document says 4"]
