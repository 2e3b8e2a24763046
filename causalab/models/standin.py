"""Stand-ins of real size: random weights in a named real model's shape, as an ordinary local directory.

A stand-in measures what a model of that size costs (memory, time) offline, where the real
weights cannot be fetched; its outputs mean nothing. Each is made once per (shape, seed, dtype)
under ``$CAUSALAB_HOME/standins/`` through a staging folder renamed into place, and never
shipped. Tensors are drawn one at a time from a generator seeded per tensor and written shard by
shard, so writing an 8B shape holds one shard and one tensor, never the model. The tokenizer is
the built-in one (a small vocabulary inside the shape's, which only wastes rows of the embedding).

    python -m causalab.models.standin llama-3.2-1b            # prints the directory
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from causalab.files import causalab_home
from causalab.models.revision import directory_digest, write_record
from causalab.models.staging import publish, staging_folder

# Real configurations, as their config.json spells them (Meta's Llama 3.2 1B and 3.1 8B).
_LLAMA3 = {"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "vocab_size": 128256,
           "max_position_embeddings": 131072, "hidden_act": "silu", "attention_bias": False,
           "mlp_bias": False,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
SHAPES = {
    "llama-3.2-1b": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
                     "rope_scaling": {**_LLAMA3["rope_scaling"], "factor": 32.0}},
    "llama-3.1-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False},
    # Small members of the family, for tests and dry runs of the scripts that use the others.
    "llama-small": {**_LLAMA3, "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1408,
                    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 64, "tie_word_embeddings": False},
    "llama-tiny": {**_LLAMA3, "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 16, "tie_word_embeddings": False},
}
SHARD_BYTES = 2 * 2 ** 30
_DTYPES = ("bf16", "fp16", "fp32")


def standin(name: str, *, seed: int = 0, dtype: str = "bf16", home: str | Path | None = None,
            generator_device: str = "cpu") -> Path:
    """The directory of stand-in ``name`` (a key of ``SHAPES``), written on first use; its
    weights drawn on ``generator_device`` (an accelerator draws an 8B model in seconds, other
    numbers than the CPU's from the same seed, so its stand-in is another directory)."""
    if name not in SHAPES:
        raise ValueError(f"unknown stand-in {name!r}; stand-ins are {', '.join(SHAPES)}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    root = Path(home) if home else causalab_home() / "standins"
    drawn = "" if generator_device == "cpu" else f"-{generator_device.split(':')[0]}"
    final = root / f"{name}-seed{seed}-{dtype}{drawn}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(root, final.name)
    try:
        write_standin(name, staging, seed=seed, dtype=dtype, generator_device=generator_device)
        publish(staging, final, "config.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _config(name: str):
    from causalab.models.build import family_config, family_tokenizer

    tokenizer = family_tokenizer("llama")
    fields = {key: value for key, value in SHAPES[name].items() if key != "vocab_size"}
    config = family_config("llama", fields, tokenizer)
    config.vocab_size = SHAPES[name]["vocab_size"]
    return config, tokenizer


def write_standin(name: str, directory: str | Path, *, seed: int = 0, dtype: str = "bf16",
                  generator_device: str = "cpu") -> None:
    """Write stand-in ``name`` into ``directory``: config, tokenizer, sharded safetensors."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    config, tokenizer = _config(name)
    target = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(config, dtype=target)
    shard, size, number = {}, 0, 1
    for index, (key, meta) in enumerate(shell.state_dict().items()):
        if config.tie_word_embeddings and key == "lm_head.weight":
            continue
        tensor = _drawn(key, tuple(meta.shape), seed * 1_000_003 + index, target,
                        generator_device)
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > SHARD_BYTES:
            save_file(shard, str(directory / f"model-{number:05d}.safetensors"), {"format": "pt"})
            shard, size, number = {}, 0, number + 1
        shard[key] = tensor
        size += nbytes
    save_file(shard, str(directory / f"model-{number:05d}.safetensors"), {"format": "pt"})
    _index(directory)
    config.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    write_record(directory, directory_digest(directory))  # its revision, read tensor by tensor


def _drawn(key: str, shape: tuple, seed: int, dtype, device: str = "cpu"):
    """One tensor: a norm's weight is ones, any other drawn from N(0, 0.02²) with its own seed."""
    import torch

    if key.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    generator = torch.Generator(device).manual_seed(seed)
    tensor = torch.empty(shape, dtype=dtype)
    rows = max(1, (2 ** 24) // max(shape[-1], 1))
    flat = tensor.view(-1, shape[-1]) if len(shape) > 1 else tensor.view(1, -1)
    for start in range(0, flat.shape[0], rows):  # float32 draws a block at a time, not the tensor
        block = flat[start:start + rows]
        block.copy_(torch.randn(block.shape, generator=generator, device=device) * 0.02)
    return tensor


def _index(directory: Path) -> None:
    """``model.safetensors.index.json``: each tensor's shard, as transformers reads it."""
    from safetensors import safe_open

    weights, total = {}, 0
    for file in sorted(directory.glob("model-*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():
                weights[key] = file.name
                piece = handle.get_slice(key)
                count = 1
                for extent in piece.get_shape():
                    count *= extent
                total += count * (2 if piece.get_dtype() in ("BF16", "F16") else 4)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weights}, indent=1))


if __name__ == "__main__":
    print(standin(sys.argv[1], seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0))
