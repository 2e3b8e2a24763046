"""Numbers past the model's dtype never come back as results: a write's parameter past fp32 is
refused before anything runs, and a forward that overflows anyway leaves no row scored, no
table of nulls marked eligible and no nan in the tracking store."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from causalab.errors import RunError
from causalab.pipeline import run_document
from causalab.tracking import TrackingEvents

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
EXPERIMENT = "overflow"


def _patching(write: dict) -> dict:
    """The corpus patching document with its one write at block_output[0] replaced."""
    document = json.loads((REPO / "documents" / "v2" / "patching.json").read_text())
    patch = document["interventions"]["patch"]
    patch["writes"]["patch"] = {"site": "target", "pos": -1, **write}
    if write.get("operand") != "v_cf":
        del patch["reads"]["v_cf"]
    return document


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs([found.experiment_id], max_results=100) if found else []


def test_lerp_t_1e308_is_refused_in_one_line_before_anything_is_written_or_tracked(tmp_path):
    path = tmp_path / "lerp.json"
    path.write_text(json.dumps(_patching({"mechanism": "lerp", "operand": "v_cf",
                                          "params": {"t": 1e308}})))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_EXPERIMENT_NAME=EXPERIMENT,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "causalab", "run", str(path), "--tracking-uri",
                           uri, "--out", str(tmp_path / "out"), "--data-root", DATA],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and done.stdout == ""
    assert len(lines) == 1
    assert lines[0].startswith("error: interventions.patch.writes.patch.params.t: ")
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "mlflow.db").exists() or _runs(uri) == []


def _oracle(rows: list[dict], added: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain transformers with one hook: ``added`` put onto block 0's output at the last column
    of each base prompt (left-padded, as the engine feeds them). Returns what the hook wrote
    there ``(rows, d)`` and the last column's logits ``(rows, vocab)``."""
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer, resolve

    folder = resolve("causalab:tiny-llama").path
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(folder)
    encoded = tokenizer([row["input"] for row in rows], return_tensors="pt", padding=True)
    mask = encoded["attention_mask"]
    written = []

    def add(module, args, output):
        tensor = (output[0] if isinstance(output, tuple) else output).clone()
        tensor[:, -1] += added
        written.append(tensor[:, -1].clone())
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    handle = model.model.layers[0].register_forward_hook(add)
    try:
        with torch.no_grad():
            logits = model(input_ids=encoded["input_ids"], attention_mask=mask,
                           position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
    finally:
        handle.remove()
    return written[0], logits


# 3e38 and 3e38 each fit fp32 (so V15 lets them through); their product is inf.
OVERFLOWING = {"mechanism": "add_scaled", "operand": 3e38, "params": {"scale": 3e38}}
WRITE_PATH = ("interventions", "patch", "writes", "patch")


def _train_rows() -> list[dict]:
    return json.loads((REPO / "documents" / "data" / "weekdays" / "train.json").read_text())


def test_a_write_that_overflows_inside_the_forward_fails_its_point_at_the_write_with_no_nan_logged(
        tmp_path):
    rows = _train_rows()
    written, logits = _oracle(rows, 3e38 * 3e38)
    assert not torch.isfinite(written).all(-1).any()  # the write itself left no row finite
    assert torch.isnan(logits).any(-1).all()  # and no row has a number at the head
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "out"
    with pytest.raises(RunError) as refused:
        with TrackingEvents(tracking_uri=uri, experiment=EXPERIMENT, out=str(out)) as events:
            run_document(_patching(OVERFLOWING), out=str(out), data_root=DATA, events=events)
    assert refused.value.path == WRITE_PATH
    message = str(refused.value)
    assert "\n" not in message and "add_scaled" in message and "block_output[0]" in message
    assert f"{len(rows)} of {len(rows)} rows" in message
    assert not (out / "iia.json").exists() and not (out / "logit_diff.json").exists()
    runs = _runs(uri)
    assert runs and all(run.info.status == "FAILED" for run in runs)
    logged = [value for run in runs for value in run.data.metrics.values()]
    assert not any(math.isnan(value) for value in logged)


def test_the_cli_prints_the_overflowing_write_in_one_line_and_exits_1(tmp_path):
    path = tmp_path / "overflow.json"
    path.write_text(json.dumps(_patching(OVERFLOWING)))
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_EXPERIMENT_NAME=EXPERIMENT,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "causalab", "run", str(path), "--tracking-uri",
                           f"sqlite:///{tmp_path / 'mlflow.db'}", "--out", str(tmp_path / "out"),
                           "--data-root", DATA],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and done.stdout == ""
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: interventions.patch.writes.patch: the add_scaled write ")
