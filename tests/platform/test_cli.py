"""The command line: every verb's happy path, its refusals and its two output forms.

Verbs run in-process through ``main(argv)`` with captured output; one subprocess checks that the
offline verbs leave torch, nnterp and mlflow unimported and that ``python -m causalab`` is the
same program.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "documents" / "v2"
DATA = str(REPO / "documents" / "data")
TINY = "causalab:tiny-llama"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def cli_json(capsys, *argv: str) -> dict:
    status, out, err = cli(capsys, *argv, "--json")
    assert status == 0, err
    return json.loads(out)


def _broken(tmp_path: Path, edit) -> str:
    document = json.loads((CORPUS / "patching.json").read_text())
    edit(document)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_schema_prints_the_authored_json_schema_with_the_point_form_in_its_defs(capsys):
    from causalab.document.schema import Document

    status, out, _ = cli(capsys, "schema")
    assert status == 0
    schema = json.loads(out)
    assert {"model", "roles", "sites", "steps"} <= set(schema["properties"])
    point = {k: v for k, v in Document.model_json_schema().items() if k != "$defs"}
    assert schema["$defs"]["Document"] == json.loads(json.dumps(point))


def test_vocab_prints_every_table_and_its_json_payload(capsys):
    status, out, _ = cli(capsys, "vocab")
    assert status == 0
    assert "block_output" in out and "renormalize" in out and "logit_diff(a, b)" in out
    payload = cli_json(capsys, "vocab")
    assert payload["metric_kinds"]["logit_diff"] == ["a", "b"]
    assert payload["units"]["token_prob"] == {"unit": "probability",
                                              "estimand_version": "token_prob/v1"}
    assert payload["components"]["attention_probs"]["needs"] == ["attn_implementation=eager"]
    assert payload["components"]["input_ids"]["read_only"] is True


@pytest.mark.parametrize("argv", [["--json", "vocab"], ["vocab", "--json"]],
                         ids=["before the verb", "after the verb"])
def test_json_is_accepted_before_or_after_the_verb(capsys, argv):
    status, out, _ = cli(capsys, *argv)
    assert status == 0
    assert json.loads(out)["metric_kinds"]["match"] == ["expected"]


def test_model_reports_a_built_in_without_loading_its_weights(capsys):
    status, out, _ = cli(capsys, "model", TINY)
    assert status == 0
    assert "block_output" in out and "ok width=16" in out
    payload = cli_json(capsys, "model", TINY)
    assert (payload["num_layers"], payload["hidden_size"], payload["num_heads"]) == (2, 16, 4)
    assert payload["padding_side"] == "left"
    assert Path(payload["path"], "config.json").is_file()
    assert payload["components"]["mlp_activation"]["width"] == 64
    assert not payload["components"]["attention_probs"]["resolves"]
    assert "eager" in payload["components"]["attention_probs"]["why"]


def test_model_with_eager_attention_makes_the_pattern_available(capsys):
    payload = cli_json(capsys, "model", TINY, "--attn-implementation", "eager")
    assert payload["components"]["attention_probs"]["resolves"]


def test_model_refuses_a_wrong_revision_in_one_line(capsys):
    status, out, err = cli(capsys, "model", TINY, "--revision", "0" * 64)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: --revision:")


def test_tokens_counts_each_string_and_flags_the_unusable(capsys):
    payload = cli_json(capsys, "tokens", TINY, " Friday", "Friday", " one")
    counts = {t["string"]: t["count"] for t in payload["tokens"]}
    assert counts[" Friday"] == 1 and counts[" one"] == 1 and counts["Friday"] > 1
    assert payload["all_single"] is False
    status, out, _ = cli(capsys, "tokens", TINY, "Friday")
    assert status == 0 and "cannot be a metric column" in out


def test_data_describes_a_reference_and_its_split(capsys):
    payload = cli_json(capsys, "data", "weekdays/data#train", "--data-root", DATA)
    assert payload["rows"] == 2 and payload["splits"] == {"train": 2}
    assert {"input", "counterfactual_inputs", "cf_answer", "example_id"} <= set(payload["columns"])
    assert payload["empty_columns"] == []
    assert payload["sample"]["input"].startswith("If today is ")
    status, out, _ = cli(capsys, "data", "weekdays_full/data", "--data-root", DATA)
    assert status == 0 and "42 rows" in out and "train=24" in out and "valid=6" in out and "test=12" in out


def test_data_refuses_a_missing_table_in_one_line(capsys):
    status, out, err = cli(capsys, "data", "weekdays/nowhere", "--data-root", DATA)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "weekdays/nowhere" in err and "Traceback" not in err


def test_validate_says_ok_and_counts_the_points(capsys):
    document = str(CORPUS / "logit_lens.json")
    status, out, _ = cli(capsys, "validate", document)
    assert status == 0 and out == (
        f"ok: {document} is a valid document on its own (validate reads no model; causalab "
        f"explain {document} checks it against causalab:tiny-llama's config and tokenizer)\n")
    payload = cli_json(capsys, "validate", document)
    assert payload["ok"] is True and payload["points"] == 2


def test_a_broken_document_is_refused_in_one_line_naming_its_path(capsys, tmp_path):
    path = _broken(tmp_path, lambda d: d["sites"]["target"].update(layer=[0]))
    status, out, err = cli(capsys, "validate", path)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: sites.target.layer:")


def test_a_document_that_is_not_json_is_refused_in_one_line_naming_its_file(capsys, tmp_path):
    path = tmp_path / "typo.json"
    path.write_text('{"model": {"key": "causalab:tiny-llama",}}')
    status, out, err = cli(capsys, "validate", str(path))
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and str(path) in err and "line 1" in err


def test_explain_refuses_a_validate_time_error_before_compiling(capsys, tmp_path):
    path = _broken(tmp_path, lambda d: d["interventions"]["patch"]["reads"]["v_cf"].update(
        site="nowhere"))
    status, _, err = cli(capsys, "explain", path, "--data-root", DATA)
    assert status == 1
    assert err.startswith("error: interventions.patch.reads.v_cf.site:")


def test_debug_shows_the_traceback(capsys, tmp_path):
    path = _broken(tmp_path, lambda d: d["sites"]["target"].update(layer=[0]))
    status, _, err = cli(capsys, "validate", path, "--debug")
    assert status == 1
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: sites.")


@pytest.mark.parametrize("argv", [
    ["frobnicate"],
    [],
    ["validate"],
    ["run", "documents/v2/patching.json", "--batch-size", "0"],
    ["validate", "no/such/document.json"],
], ids=["an unknown verb", "no verb", "a missing argument", "a zero batch size",
        "a document that is not there"])
def test_a_usage_error_exits_two_in_one_line(capsys, argv):
    status, out, err = cli(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


@pytest.mark.parametrize("name", ["zero_ablation", "logit_lens", "steer_renormalize",
                                  "entity_patch"])
def test_explain_prints_the_compiled_plan(capsys, name):
    status, out, _ = cli(capsys, "explain", str(CORPUS / f"{name}.json"), "--data-root", DATA)
    assert status == 0 and out.startswith("<root>: Plan")
    assert "forward 'original' on " in out


def test_explain_json_lists_the_root_steps_and_the_point_labels(capsys):
    zero = cli_json(capsys, "explain", str(CORPUS / "zero_ablation.json"), "--data-root", DATA)
    assert zero["steps"] == ["clean", "zeroed"]
    assert "swap(0.0)" in zero["text"]
    lens = cli_json(capsys, "explain", str(CORPUS / "logit_lens.json"), "--data-root", DATA)
    assert lens["steps"] == ["layers=0", "layers=1"]


def test_explain_refuses_a_compile_time_error_at_its_path(capsys, tmp_path):
    path = _broken(tmp_path, lambda d: d["sites"]["target"].update(layers=[7]))
    status, _, err = cli(capsys, "explain", path, "--data-root", DATA)
    assert status == 1 and err.startswith("error: sites.target.layers")


def test_offline_verbs_import_no_heavy_library_and_module_form_is_the_same_program():
    script = f"""
import json, runpy, sys
def verb(*argv):
    sys.argv = ["causalab", *argv]
    try:
        runpy.run_module("causalab", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        assert stop.code == 0, (argv, stop.code)
verb("vocab")
verb("schema")
verb("validate", {str(CORPUS / "das.json")!r})
heavy = sorted({{"torch", "nnterp", "nnsight", "mlflow", "transformers", "hydra"}} & set(sys.modules))
print(json.dumps(heavy), file=sys.stderr)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ok: " in done.stdout and "components:" in done.stdout
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []


def test_run_prints_the_written_paths_in_order_and_nothing_else(capsys, tmp_path):
    out = tmp_path / "out"
    status, stdout, err = cli(capsys, "run", str(CORPUS / "patching.json"), "--device-map", "cpu",
                              "--no-track", "--out", str(out), "--data-root", DATA)
    assert status == 0, err
    names = ["document.json", "run.json", "iia.json", "logit_diff.json"]
    assert stdout.splitlines() == [str(out / name) for name in names]
    table = json.loads((out / "iia.json").read_text())
    assert [row["example_id"] for row in table] == ["Thu-Sat", "Fri-Sun", "Sat-Thu", "Sun-Fri"]


def test_a_refused_run_writes_nothing(capsys, tmp_path):
    path = _broken(tmp_path, lambda d: d["sites"]["target"].update(layers=[7]))
    out = tmp_path / "out"
    status, stdout, err = cli(capsys, "run", path, "--device-map", "cpu", "--no-track",
                              "--out", str(out), "--data-root", DATA)
    assert status == 1 and stdout == ""
    assert err.startswith("error: sites.target.layers") and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.slow
def test_a_tracked_run_is_listed_by_runs_and_its_tables_fetched(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    status, _, err = cli(capsys, "run", str(CORPUS / "zero_ablation.json"), "--device-map", "cpu",
                         "--tracking-uri", uri, "--out", str(out), "--data-root", DATA)
    assert status == 0, err
    produced_by = json.loads((out / "zeroed.json").read_text())[0]["produced_by"]
    runs = cli_json(capsys, "runs", "--tracking-uri", uri, "--produced-by", produced_by)["runs"]
    assert [r["status"] for r in runs] == ["FINISHED"]
    target = tmp_path / "fetched.json"
    fetched = cli_json(capsys, "fetch", f"runs:/{runs[0]['run_id']}/zeroed.json", "-o",
                       str(target), "--tracking-uri", uri)
    assert json.loads(Path(fetched["path"]).read_text()) == json.loads(
        (out / "zeroed.json").read_text())


def test_explain_notes_a_local_directory_pin_it_cannot_check_and_strict_refuses_it(
        capsys, tmp_path):
    import shutil

    from causalab.models import resolve
    from causalab.models.revision import RECORD, directory_digest

    source = Path(resolve("causalab:tiny-llama").path)
    folder = tmp_path / "model"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(RECORD))
    pin = directory_digest(source)  # the same tensors: the pin is right, only unrecorded
    document = json.loads((CORPUS / "patching.json").read_text())
    document["model"] = {**document["model"], "key": str(folder), "revision": pin}
    path = tmp_path / "pinned.json"
    path.write_text(json.dumps(document))
    status, out, err = cli(capsys, "explain", str(path), "--data-root", DATA)
    assert status == 0 and out
    assert err.startswith("note: model.revision: revision not checked: ")
    status, out, err = cli(capsys, "explain", str(path), "--data-root", DATA, "--strict")
    assert status == 1 and out == ""
    assert err.startswith("error: model.revision: revision not checked: ")
    assert not (folder / RECORD).exists()  # explain read no weight to record their digest


def test_runs_lists_its_columns_under_a_header_row_each_name_where_its_values_start(
        capsys, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("causalab")
    run = client.create_run(experiment, run_name="k=16", tags={
        "causalab.kind": "point", "causalab.produced_by": "ab" * 32,
        "causalab.model.key": "causalab:tiny-llama", "causalab.job": "experiment=das"})
    client.set_terminated(run.info.run_id)
    status, out, err = cli(capsys, "runs", "--tracking-uri", uri)
    assert status == 0, err
    header, line = out.splitlines()
    assert header.split() == ["run", "status", "model", "job", "name", "produced_by"]
    for name, value in zip(header.split(), [run.info.run_id, "FINISHED", "causalab:tiny-llama",
                                            "experiment=das", "k=16", "ab" * 6]):
        assert header.index(name) == line.index(value), name


@pytest.mark.parametrize("name", sorted(p.stem for p in CORPUS.glob("*.json")))
def test_every_corpus_document_runs_through_the_command_line(capsys, tmp_path, monkeypatch,
                                                             name):
    monkeypatch.chdir(REPO)  # bundle paths are relative to the working directory
    out = tmp_path / name
    status, stdout, err = cli(capsys, "run", f"documents/v2/{name}.json", "--device-map", "cpu",
                              "--no-track", "--out", str(out), "--data-root", DATA)
    assert status == 0, err
    written = stdout.splitlines()
    assert written[:2] == [str(out / "document.json"), str(out / "run.json")]
    assert all(Path(path).is_file() for path in written)


def test_generated_answer_shows_a_placed_a_missing_and_an_ambiguous_row(capsys, tmp_path):
    out = tmp_path / "out"
    status, _, err = cli(capsys, "run", str(CORPUS / "generated_answer.json"), "--device-map",
                         "cpu", "--no-track", "--out", str(out), "--data-root", DATA)
    assert status == 0, err
    table = json.loads((out / "p_said.json").read_text())
    assert [(row["eligible"], row["reason"]) for row in table] == [
        (True, ""), (False, "alignment_missing"), (True, ""), (False, "alignment_ambiguous")]


def test_a_rotation_fitted_on_the_random_init_control_is_tagged_and_fetch_says_so(
        capsys, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    document = json.loads((CORPUS / "das.json").read_text())
    document["model"]["control"] = "random_init"
    document["steps"]["fit"]["epochs"] = 1
    path = tmp_path / "das_control.json"
    path.write_text(json.dumps(document))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    status, _, err = cli(capsys, "run", str(path), "--device-map", "cpu", "--tracking-uri", uri,
                         "--out", str(tmp_path / "out"), "--data-root", DATA)
    assert status == 0, err
    (run,) = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("causalab").experiment_id])
    assert run.data.tags["causalab.model.control"] == "random_init"  # what the UI lists
    status, out, err = cli(capsys, "fetch", f"runs:/{run.info.run_id}/rot.safetensors", "-o",
                           str(tmp_path / "rot.safetensors"), "--tracking-uri", uri)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == str(tmp_path / "rot.safetensors")
    assert lines[1].startswith("  fitted on the random_init control of causalab:tiny-llama "
                               "(seed 0, twin revision ")
    fetched = cli_json(capsys, "fetch", f"runs:/{run.info.run_id}/rot.safetensors", "-o",
                       str(tmp_path / "again.safetensors"), "--tracking-uri", uri)
    assert fetched["control"]["model_control"] == "random_init"
