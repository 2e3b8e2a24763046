"""Materialise a ``tiny`` built-in: registry entry -> Hugging Face directory, deterministically.

It builds the config (family module), the tokenizer (``tokenizer.py``) and random weights from the
entry's seed, inside a forked RNG so the caller's random state is untouched. It writes into the
directory it is given and knows nothing of caches or revisions pinned elsewhere.
"""
from __future__ import annotations

import threading
from pathlib import Path

from causalab.models import bars, gemma2, gpt2, llama, qwen2
from causalab.models.tokenizer import build_tokenizer

FAMILIES = {"llama": llama, "gpt2": gpt2, "gemma2": gemma2, "qwen2": qwen2}
# Weight init draws from torch's one global generator; two threads seeding it at once would
# interleave their draws and give two different "deterministic" models.
_SEEDED = threading.Lock()


def family_tokenizer(family: str):
    """The built-in tokenizer as the family spells it (BOS or not)."""
    return build_tokenizer(add_bos=FAMILIES[family].ADD_BOS)


def family_config(family: str, shape: dict, tokenizer):
    """The family's transformers config for ``shape``, sized to ``tokenizer``."""
    return FAMILIES[family].config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **shape)


def build_model(entry: dict):
    """(model, tokenizer) for a registry entry, weights drawn from ``entry["seed"]``, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = family_tokenizer(entry["family"])
    config = family_config(entry["family"], entry["config"], tokenizer)
    with _SEEDED, torch.random.fork_rng(devices=[]):
        torch.manual_seed(entry["seed"])
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval(), tokenizer


def write_directory(model, tokenizer, directory: str | Path) -> None:
    """Save config, safetensors weights and tokenizer files into ``directory``."""
    with bars.quiet():
        model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def build(entry: dict, directory: str | Path) -> None:
    """Write the built-in described by ``entry`` into ``directory`` (which must exist)."""
    model, tokenizer = build_model(entry)
    write_directory(model, tokenizer, directory)
