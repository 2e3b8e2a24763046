"""The Gemma-2 family of built-ins: a ``Gemma2Config`` from the registry's shape, BOS prepended.

It knows the family's config class and its defaults, nothing about weights or files. Gemma-2
brings logit softcapping (attention and final), sandwich norms around each block and alternating
sliding-window layers; softcapped attention is eager-only in transformers.
"""
from __future__ import annotations

from transformers import Gemma2Config

ADD_BOS = True


def config(*, vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int,
           **shape) -> Gemma2Config:
    """A Gemma-2 config: softcapping 50 (attention) and 30 (final), tied embeddings."""
    defaults = {"max_position_embeddings": 256, "tie_word_embeddings": True,
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                "sliding_window": 128, "architectures": ["Gemma2ForCausalLM"]}
    merged = {**defaults, **shape}
    merged.setdefault("query_pre_attn_scalar", merged["head_dim"])
    return Gemma2Config(vocab_size=vocab_size, pad_token_id=pad_token_id,
                        bos_token_id=bos_token_id, eos_token_id=eos_token_id, **merged)
