"""The GPT-2 family of built-ins: a ``GPT2Config`` from the registry's shape, no BOS.

It knows the family's config class and its defaults, nothing about weights or files. GPT-2 has
absolute position embeddings, so left-padded batches need explicit ``position_ids``.
"""
from __future__ import annotations

from transformers import GPT2Config

ADD_BOS = False


def config(*, vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int,
           **shape) -> GPT2Config:
    """A GPT-2 config: learned absolute positions, LayerNorm, GELU MLP, tied embeddings."""
    defaults = {"n_positions": 256, "tie_word_embeddings": True,
                "architectures": ["GPT2LMHeadModel"]}
    return GPT2Config(vocab_size=vocab_size, pad_token_id=pad_token_id,
                      bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                      **{**defaults, **shape})
