"""The Qwen2 family of built-ins: a ``Qwen2Config`` from the registry's shape, no BOS.

It knows the family's config class and its defaults, nothing about weights or files. Qwen2 has
biases on the query, key and value projections and grouped-query attention.
"""
from __future__ import annotations

from transformers import Qwen2Config

ADD_BOS = False


def config(*, vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int,
           **shape) -> Qwen2Config:
    """A Qwen2 config: rotary positions, RMSNorm, SwiGLU MLP, tied embeddings."""
    defaults = {"max_position_embeddings": 256, "tie_word_embeddings": True,
                "architectures": ["Qwen2ForCausalLM"]}
    return Qwen2Config(vocab_size=vocab_size, pad_token_id=pad_token_id,
                       bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                       **{**defaults, **shape})
