"""A write whose numbers stay finite but square past float32 fails its point at the write.

``add_scaled`` by 1e30 or 1e38 and ``lerp`` at t = 3e38 on block 0's output leave finite
values, so the write's own check passes; the next norm (Llama's and Qwen2's RMSNorm, GPT-2's
LayerNorm, Gemma-2's sandwich RMSNorms) takes the mean of their squares, gets infinity and
multiplies by rsqrt(inf) = 0. The oracle is plain transformers with one forward hook doing the
same write: it shows what the point would otherwise score (all-zero logits, every row the same
logits, or NaN), and the engine must refuse exactly the writes the oracle shows broken, on the
tiny and weekday model of every family, and run the ones it shows meaningful (``lerp`` at
t = 1e20 on the tiny Llama, GPT-2 and Qwen2, whose counterfactual differs little from the base).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from causalab.cli.main import main
from causalab.errors import RunError
from causalab.models import load_tokenizer, resolve
from causalab.models.registry import BUILTINS
from causalab.pipeline import run_document

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
ROWS = json.loads((REPO / "documents" / "data" / "weekdays" / "train.json").read_text())
MODELS = [f"{kind}-{family}" for family in ("llama", "gpt2", "qwen2", "gemma2")
          for kind in ("tiny", "weekday")]
# name -> the write's mechanism and parameter: the cases, and one that stays a number.
WRITES = {"add_scaled_1e38": ("add_scaled", {"scale": 1e38}),
          "add_scaled_1e30": ("add_scaled", {"scale": 1e30}),
          "lerp_3e38": ("lerp", {"t": 3e38}),
          "lerp_1e20": ("lerp", {"t": 1e20})}
BROKEN_EVERYWHERE = ("add_scaled_1e38", "add_scaled_1e30", "lerp_3e38")
WRITE_PATH = ("interventions", "patch", "writes", "patch")


def _document(model: str, write: str) -> dict:
    mechanism, params = WRITES[write]
    document = json.loads((REPO / "documents" / "v2" / "patching.json").read_text())
    document["model"].update(key=f"causalab:{model}", revision=BUILTINS[model]["revision"])
    document["interventions"]["patch"]["writes"]["patch"] = {
        "site": "target", "pos": -1, "mechanism": mechanism, "operand": "v_cf", "params": params}
    return document


def _oracle_logits(model_key: str, write: str) -> torch.Tensor:
    """Plain transformers: block 0's output at each base prompt's last column replaced by the
    write of the counterfactual's (left-padded, as the engine feeds them); the last column's
    logits ``(rows, vocab)``."""
    from transformers import AutoModelForCausalLM

    mechanism, params = WRITES[write]
    folder = resolve(f"causalab:{model_key}").path
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(folder)

    def inputs(texts: list[str]) -> dict:
        encoded = tokenizer(texts, return_tensors="pt", padding=True)
        mask = encoded["attention_mask"]
        return {"input_ids": encoded["input_ids"], "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}

    with torch.no_grad():
        counterfactual = model(**inputs([row["counterfactual_inputs"][0] for row in ROWS]),
                               output_hidden_states=True).hidden_states[1][:, -1]

    def hook(module, args, output):
        tensor = (output[0] if isinstance(output, tuple) else output).clone()
        base = tensor[:, -1]
        tensor[:, -1] = (base + params["scale"] * counterfactual if mechanism == "add_scaled"
                         else (1.0 - params["t"]) * base + params["t"] * counterfactual)
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    blocks = model.model.layers if hasattr(model, "model") else model.transformer.h
    handle = blocks[0].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(**inputs([row["input"] for row in ROWS])).logits[:, -1]
    finally:
        handle.remove()


def _meaningful(logits: torch.Tensor) -> bool:
    """Finite, no row a constant, and the rows (four different prompts) not all one row."""
    if not torch.isfinite(logits).all():
        return False
    if (logits.amax(-1) == logits.amin(-1)).any():
        return False
    return not torch.equal(logits, logits[:1].expand_as(logits))


@pytest.mark.parametrize("model", MODELS)
def test_a_write_that_a_norm_cannot_square_fails_at_the_write_as_the_oracle_shows(model, tmp_path):
    verdicts = {}
    for write in WRITES:
        meaningful = _meaningful(_oracle_logits(model, write))
        try:
            run_document(_document(model, write), out=str(tmp_path / write), data_root=DATA)
            verdicts[write] = ("ran", meaningful)
        except RunError as refused:
            assert refused.path == WRITE_PATH
            message = str(refused)
            assert "\n" not in message and WRITES[write][0] in message
            assert "block_output[0]" in message
            assert not (tmp_path / write / "logit_diff.json").exists()
            verdicts[write] = ("refused", meaningful)
    for write, (outcome, meaningful) in verdicts.items():
        assert outcome == ("ran" if meaningful else "refused"), (write, verdicts)
    assert all(verdicts[write] == ("refused", False) for write in BROKEN_EVERYWHERE), verdicts


def test_lerp_at_1e20_still_runs_where_the_oracle_keeps_its_logits_numbers(tmp_path):
    """The check is no threshold on the parameter: the same t = 1e20 is meaningful on the tiny
    Llama (the written residual's squares stay under float32's limit) and is scored."""
    assert _meaningful(_oracle_logits("tiny-llama", "lerp_1e20"))
    run_document(_document("tiny-llama", "lerp_1e20"), out=str(tmp_path), data_root=DATA)
    rows = json.loads((tmp_path / "logit_diff.json").read_text())
    assert len(rows) == len(ROWS) and all(row["eligible"] for row in rows)


def test_the_run_verb_fails_the_tracked_point_in_one_line_naming_the_write(tmp_path, capsys,
                                                                         monkeypatch):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(_document("weekday-gemma2", "add_scaled_1e30")))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "norm-overflow")
    status = main(["run", str(path), "--tracking-uri", uri, "--out", str(tmp_path / "out"),
                   "--data-root", DATA])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 1 and len(lines) == 1, err
    assert lines[0].startswith("error: interventions.patch.writes.patch: the add_scaled write ")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("norm-overflow")
    runs = client.search_runs([experiment.experiment_id])
    assert runs and all(run.info.status == "FAILED" for run in runs)
    assert not any(key.startswith("logit_diff") for run in runs for key in run.data.metrics)
