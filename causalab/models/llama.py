"""The Llama family of built-ins: a ``LlamaConfig`` from the registry's shape, BOS prepended.

It knows the family's config class and its defaults, nothing about weights or files.
"""
from __future__ import annotations

from transformers import LlamaConfig

ADD_BOS = True


def config(*, vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int,
           **shape) -> LlamaConfig:
    """A Llama config: rotary positions, RMSNorm, SwiGLU MLP, untied embeddings by default."""
    defaults = {"max_position_embeddings": 256, "tie_word_embeddings": False,
                "architectures": ["LlamaForCausalLM"]}
    return LlamaConfig(vocab_size=vocab_size, pad_token_id=pad_token_id,
                       bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                       **{**defaults, **shape})
