"""The overflow rule, one for every mechanism, against a plain hook making the same write.

``add_scaled`` by 1e30 or 1e38 and ``lerp`` at t = 3e38 on block 0's output leave finite
values, so the write's own check passes; the next norm (Llama's and Qwen2's RMSNorm, GPT-2's
LayerNorm, Gemma-2's sandwich RMSNorms) takes the mean of their squares, gets infinity and
multiplies by rsqrt(inf) = 0. ``lerp`` at t = 1e20 and ``add_scaled`` by 1e15 stay finite and
square finite on some models, but leave the residual more than 2**23 times its norm: whatever
the model adds after it rounds away in float32 and the next norm divides the number out, so
doubling t or the scale gives the same logits bit for bit (docs/format.md §7.9). The oracle is
plain transformers with one forward hook doing the same write: it shows what the point would
otherwise score (all-zero logits, every row the same logits, NaN, or logits the write's
number no longer moves), and the engine must refuse exactly the writes the oracle shows
broken, on the tiny and weekday model of every family, whatever the mechanism (``swap`` of a
literal, ``gaussian`` noise and ``clamp`` to a bound of 1e15 alike), run the ones it shows
meaningful (``lerp`` at t = 0.5, ``add_scaled`` by 2, noise of 0.01) and score those as the
hook does.
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
def _add_scaled(scale: float):
    return ({"mechanism": "add_scaled", "operand": "v_cf", "params": {"scale": scale}},
            lambda base, cf, k: base + scale * k * cf)


def _lerp(t: float):
    return ({"mechanism": "lerp", "operand": "v_cf", "params": {"t": t}},
            lambda base, cf, k: (1.0 - t * k) * base + t * k * cf)


def _swap(value: float):
    return ({"mechanism": "swap", "operand": value},
            lambda base, cf, k: torch.full_like(base, value * k))


def _gaussian(scale: float):
    return ({"mechanism": "gaussian", "params": {"seed": 0, "scale": scale}},
            lambda base, cf, k: base + scale * k * torch.randn(
                base.shape, generator=torch.Generator().manual_seed(0)))


def _clamp(lo: float):
    return ({"mechanism": "clamp", "params": {"lo": lo}},
            lambda base, cf, k: base.clamp(min=lo * k))


# name -> (the write as the document gives it, the same write in plain torch on the last
# column's ``(rows, d)`` value with its number multiplied by ``k``): the cases, the
# extreme scales of every mechanism, and writes that stay numbers.
WRITES = {"add_scaled_1e38": _add_scaled(1e38),
          "add_scaled_1e30": _add_scaled(1e30),
          "add_scaled_1e15": _add_scaled(1e15),
          "lerp_3e38": _lerp(3e38),
          "lerp_1e20": _lerp(1e20),
          "swap_1e15": _swap(1e15),
          "gaussian_1e15": _gaussian(1e15),
          "clamp_1e15": _clamp(1e15),
          "lerp_0.5": _lerp(0.5),
          "add_scaled_2": _add_scaled(2.0),
          "gaussian_0.01": _gaussian(0.01)}
BROKEN_EVERYWHERE = ("add_scaled_1e38", "add_scaled_1e30", "add_scaled_1e15", "lerp_3e38",
                     "lerp_1e20", "swap_1e15", "gaussian_1e15", "clamp_1e15")
MEANINGFUL_EVERYWHERE = ("lerp_0.5", "add_scaled_2", "gaussian_0.01")
WRITE_PATH = ("interventions", "patch", "writes", "patch")


def _document(model: str, write: str) -> dict:
    body, _ = WRITES[write]
    document = json.loads((REPO / "documents" / "v2" / "patching.json").read_text())
    document["model"].update(key=f"causalab:{model}", revision=BUILTINS[model]["revision"])
    patch = document["interventions"]["patch"]
    patch["writes"]["patch"] = {"site": "target", "pos": -1, **body}
    if body.get("operand") != "v_cf":
        del patch["reads"]["v_cf"]
    return document


def _oracle_logits(model_key: str, write: str, times: float = 1.0,
                   restore: bool = False) -> torch.Tensor:
    """Plain transformers: block 0's output at each base prompt's last column replaced by the
    write (of the counterfactual's value there, left-padded as the engine feeds them), its
    number multiplied by ``times`` and, with ``restore``, scaled back to the norm the column
    had; the last column's logits ``(rows, vocab)``."""
    from transformers import AutoModelForCausalLM

    _, edit = WRITES[write]
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
        written = edit(base, counterfactual, times)
        if restore:
            written = written * (base.norm(dim=-1, keepdim=True)
                                 / written.norm(dim=-1, keepdim=True))
        tensor[:, -1] = written
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    blocks = model.model.layers if hasattr(model, "model") else model.transformer.h
    handle = blocks[0].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(**inputs([row["input"] for row in ROWS])).logits[:, -1]
    finally:
        handle.remove()


def _meaningful(model_key: str, write: str) -> bool:
    """Finite, no row a constant, the rows (four different prompts) not all one row, and the
    write's number still moving them: doubling it changes the logits."""
    logits = _oracle_logits(model_key, write)
    if not torch.isfinite(logits).all():
        return False
    if (logits.amax(-1) == logits.amin(-1)).any():
        return False
    if torch.equal(logits, logits[:1].expand_as(logits)):
        return False
    return not torch.equal(logits, _oracle_logits(model_key, write, times=2.0))


@pytest.mark.parametrize("model", MODELS)
def test_a_write_that_a_norm_cannot_square_fails_at_the_write_as_the_oracle_shows(model, tmp_path):
    verdicts = {}
    for write in WRITES:
        meaningful = _meaningful(model, write)
        try:
            run_document(_document(model, write), out=str(tmp_path / write), data_root=DATA)
            verdicts[write] = ("ran", meaningful)
        except RunError as refused:
            assert refused.path == WRITE_PATH
            message = str(refused)
            assert "\n" not in message and WRITES[write][0]["mechanism"] in message
            assert "block_output[0]" in message
            assert not (tmp_path / write / "logit_diff.json").exists()
            verdicts[write] = ("refused", meaningful)
    for write, (outcome, meaningful) in verdicts.items():
        assert outcome == ("ran" if meaningful else "refused"), (write, verdicts)
    assert all(verdicts[write] == ("refused", False) for write in BROKEN_EVERYWHERE), verdicts
    assert all(verdicts[write] == ("ran", True) for write in MEANINGFUL_EVERYWHERE), verdicts


def _token(tokenizer, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _hooked_logit_diff(model: str, logits: torch.Tensor) -> list[float]:
    """Per row, the hook's logit of the counterfactual answer minus the base answer's, as the
    metric reads them at ``lm_head``: before Gemma-2's final softcap, which the hook's logits
    have been through."""
    folder = resolve(f"causalab:{model}").path
    logits = logits.double()
    cap = json.loads((Path(folder) / "config.json").read_text()).get("final_logit_softcapping")
    if cap:
        logits = torch.atanh(logits / cap) * cap
    tokenizer = load_tokenizer(folder)
    return [float(logits[i, _token(tokenizer, row["cf_answer"])]
                  - logits[i, _token(tokenizer, row["base_answer"])])
            for i, row in enumerate(ROWS)]


@pytest.mark.parametrize("model", [m for m in MODELS if m.startswith("weekday-")])
def test_a_write_the_rule_accepts_scores_what_the_hook_scores(model, tmp_path):
    """The rule refuses no write the model still reads: ``lerp`` at t = 0.5 runs and its
    logit_diff is the hook's, row by row."""
    run_document(_document(model, "lerp_0.5"), out=str(tmp_path), data_root=DATA)
    rows = json.loads((tmp_path / "logit_diff.json").read_text())
    expected = _hooked_logit_diff(model, _oracle_logits(model, "lerp_0.5"))
    assert all(row["eligible"] for row in rows)
    assert [row["value"] for row in rows] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("model", [m for m in MODELS if m.startswith("weekday-")])
def test_lerp_at_1e20_fails_the_point_in_one_line_on_every_weekday_model(model, tmp_path,
                                                                        capsys):
    """The issue's case through the command line: the oracle shows t = 1e20 meaningless (its
    logits are no longer numbers, or t = 2e20 gives the same ones), and ``causalab run``
    exits 1 with one line naming the write, its mechanism, its site and its number."""
    assert not _meaningful(model, "lerp_1e20")
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(_document(model, "lerp_1e20")))
    status = main(["run", str(path), "--no-track", "--out", str(tmp_path / "out"),
                   "--data-root", DATA])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 1 and len(lines) == 1, err
    assert lines[0].startswith("error: interventions.patch.writes.patch: the lerp write ")
    assert "block_output[0]" in lines[0] and "t 1e+20" in lines[0]
    assert not (tmp_path / "out" / "logit_diff.json").exists()


@pytest.mark.parametrize("write", ["add_scaled_1e15", "swap_1e15"])
def test_a_renormalize_after_a_grown_write_at_its_site_runs_and_scores_as_the_hook(write,
                                                                                  tmp_path):
    """The growth check's one exemption: a ``renormalize`` later at the same site brings the
    value back to the norm it had, so the pair is a direction patch the model still reads,
    and its logit_diff is the hook's doing the same two writes."""
    model = "weekday-llama"
    document = _document(model, write)
    patch = document["interventions"]["patch"]
    patch["writes"]["restore"] = {"site": "target", "pos": -1, "mechanism": "renormalize"}
    patch["models"]["patched"]["writes"].append("restore")
    run_document(document, out=str(tmp_path), data_root=DATA)
    rows = json.loads((tmp_path / "logit_diff.json").read_text())
    expected = _hooked_logit_diff(model, _oracle_logits(model, write, restore=True))
    assert all(row["eligible"] for row in rows)
    assert [row["value"] for row in rows] == pytest.approx(expected, abs=1e-3)


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
