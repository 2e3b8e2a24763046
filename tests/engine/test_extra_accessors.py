"""Accessors outside the 21 components (docs/format.md §5.4): places with no width, read as they are."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from causalab.errors import DocumentError, RunError
from causalab.models import load_tokenizer, resolve
from causalab.pipeline import run_document

PROMPTS = ["If today is Monday, tomorrow is", "If today is Friday, tomorrow is"]


def _document(site: dict, *, write: bool = False) -> dict:
    resolved = resolve("causalab:tiny-llama")
    body = {"reads": {"r": {"site": "x", "pos": -1, "input": "base"}}}
    if write:
        body["writes"] = {"w": {"site": "x", "pos": -1, "mechanism": "swap", "operand": 0.0}}
        body["models"] = {"m": {"input": "base", "writes": ["w"]}}
        body["reads"]["r"]["model"] = "m"
    return {"model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
            "roles": {"base": {"field": "input"}}, "sites": {"x": site},
            "interventions": {"i": body},
            "steps": {"s": {"kind": "observe", "interventions": "i", "rows": {"base": "rows"},
                            "outputs": {"o": "r"},
                            "saves": [{"value": "o", "file_path": "o.safetensors"}]}}}


@pytest.fixture()
def data_root(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps([{"input": p} for p in PROMPTS]))
    return str(tmp_path)


def _oracle(capture) -> torch.Tensor:
    """The last prompt token's value, from a plain transformers forward, row by row unpadded."""
    path = resolve("causalab:tiny-llama").path
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = load_tokenizer(path)
    values = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")
        values.append(capture(model, ids)[0, -1])
    return torch.stack(values)


def test_attentions_input_reads_what_the_attention_module_is_called_with(data_root, tmp_path):
    run_document(_document({"component": "attentions_input", "layers": [1]}),
                 out=str(tmp_path / "out"), data_root=data_root)
    got = load_file(str(tmp_path / "out" / "o.safetensors"))["weight"]

    def capture(model, ids):
        seen = {}

        def grab(module, args, kwargs):
            seen["x"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        hook = model.model.layers[1].self_attn.register_forward_pre_hook(grab, with_kwargs=True)
        with torch.no_grad():
            model(**ids)
        hook.remove()
        return seen["x"]

    assert torch.allclose(got.reshape(len(PROMPTS), -1), _oracle(capture), atol=1e-6)


def test_next_token_probs_are_the_softmax_of_the_logits(data_root, tmp_path):
    run_document(_document({"component": "next_token_probs"}), out=str(tmp_path / "out"),
                 data_root=data_root)
    got = load_file(str(tmp_path / "out" / "o.safetensors"))["weight"]

    def capture(model, ids):
        with torch.no_grad():
            return model(**ids).logits.softmax(-1)

    assert torch.allclose(got.reshape(len(PROMPTS), -1), _oracle(capture), atol=1e-6)


def test_next_token_probs_cannot_be_written(data_root, tmp_path):
    with pytest.raises((DocumentError, RunError)):
        run_document(_document({"component": "next_token_probs"}, write=True),
                     out=str(tmp_path / "out"), data_root=data_root)
