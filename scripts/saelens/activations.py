"""Weekday-llama residual activations for the SAELens fixtures (run in causalab's venv).

    .venv/bin/python scripts/saelens/activations.py documents/artifacts/saelens/inputs.safetensors

A plain transformers forward (no causalab engine): the output of block LAYER (hidden state
LAYER + 1, which is SAELens's ``blocks.LAYER.hook_resid_post``) at every position of the
first PROMPTS one-step weekday prompts, as ``x`` (n, 64) float32, with the prompts' token
ids (``input_ids``, padded with -1) so a test can rebuild them. The second half of the
recipe, scripts/saelens/write_fixtures.py, runs in SAELens's own venv.
"""
from __future__ import annotations

import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from causalab.models import load_tokenizer
from causalab.models.resolve import resolve
from causalab.models.weekday import one_step_rows

LAYER = 1
PROMPTS = 4


def main(out: str) -> None:
    path = resolve("causalab:weekday-llama").path
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [prompt for prompt, _ in one_step_rows()[:PROMPTS]]
    rows, ids = [], []
    for prompt in prompts:
        tokens = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            hidden = model(tokens, output_hidden_states=True).hidden_states[LAYER + 1]
        rows.append(hidden[0])
        ids.append(tokens[0])
    width = max(len(t) for t in ids)
    padded = torch.full((len(ids), width), -1, dtype=torch.int64)
    for i, t in enumerate(ids):
        padded[i, : len(t)] = t
    save_file({"x": torch.cat(rows).contiguous(), "input_ids": padded}, out,
              metadata={"model": "causalab:weekday-llama", "hook_name": f"blocks.{LAYER}.hook_resid_post"})
    print(f"{out}: x {tuple(torch.cat(rows).shape)} from {len(prompts)} prompts")


if __name__ == "__main__":
    main(sys.argv[1])
