"""A checkpoint's config and tokenizer read from their files, without importing transformers.

Compiling needs a handful of config numbers and the token ids of each prompt; importing
transformers for them costs seconds. ``read_config`` serves ``config.json`` as attributes and
``read_tokenizer`` encodes with the ``tokenizers`` library from ``tokenizer.json``. Each takes
this path only where it gives what transformers would: a config whose family and keys are
listed below (so no class default is missing), a tokenizer whose ``tokenizer_config.json``
holds nothing that changes encoding. Anything else falls back to transformers
(``load_config``, ``load_tokenizer``). Chat templates render through transformers, loaded on
first use, so a template is never re-implemented here.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from causalab.errors import ModelError, reason
from causalab.files import stamp
from causalab.models.json_files import read_json
from causalab.models.resolve import load_config, load_tokenizer, resolve

# Keys a family's config class would otherwise fill from a class default that differs from
# what ``compile.addresses.facts`` assumes when the key is absent.
_REQUIRED = {
    "llama": ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
              "vocab_size"),
    "qwen2": ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size"),
    "gemma2": ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size"),
    "gpt2": ("n_layer", "n_embd", "n_head", "vocab_size"),
    "gemma3_text": ("num_hidden_layers", "hidden_size", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"),
}
# tokenizer_config.json keys that leave encoding exactly as tokenizer.json says.
_SAFE_KEYS = frozenset({
    "backend", "tokenizer_class", "bos_token", "eos_token", "pad_token", "unk_token",
    "sep_token", "cls_token", "mask_token", "added_tokens_decoder", "chat_template",
    "clean_up_tokenization_spaces", "model_max_length", "padding_side", "truncation_side",
    "model_input_names",
    # How the directory was opened when it was saved (a GGUF's dequantized copy has them);
    # they change nothing about tokenization.
    "is_local", "local_files_only",
})
_KEY = ("model", "key")
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
            "mask_token")
_TOKEN_FLAGS = ("content", "lstrip", "rstrip", "normalized", "single_word", "special")


class FileConfig:
    """``config.json`` as attributes; a key it lacks reads as None, like ``getattr(c, k, None)``."""

    def __init__(self, values: dict):
        self._values = values

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = self._values.get(name)
        return FileConfig(value) if isinstance(value, dict) and name.endswith("_config") else value


def read_config(path: str) -> Any:
    """The config of a model directory, from its file when every fact compile needs is there."""
    values = read_json(Path(path) / "config.json")
    required = _REQUIRED.get((values or {}).get("model_type"))
    if required and all(values.get(key) is not None for key in required):
        return FileConfig(values)
    return load_config(path)


class FileTokenizer:
    """Encodes as ``load_tokenizer``'s tokenizer does: same ids, left padding, pad = eos if unset."""

    padding_side = "left"

    def __init__(self, core, specials: dict[str, str], chat_template: str | None, path: str):
        self._core = core
        self._path = path
        self._full = None
        self.chat_template = chat_template
        self.cleans_up = False
        self.bos_token = specials.get("bos_token")
        self.bos_token_id = self._id(specials.get("bos_token"))
        self.eos_token_id = self._id(specials.get("eos_token"))
        self.pad_token_id = self._id(specials.get("pad_token") or specials.get("eos_token"))

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._core.token_to_id(token)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self._core.encode(text, add_special_tokens=add_special_tokens).ids}

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> Any:
        """Rendered by transformers itself (loaded once, on the first chat row)."""
        return self._transformers().apply_chat_template(messages, **kwargs)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """As transformers decodes (what the engine places a scoped position against): the
        file's own decoder, special tokens kept unless skipped. Transformers cleans up spaces
        only on a non-BPE model whose config asks, and is asked itself then."""
        if self.cleans_up:
            return self._transformers().decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self._core.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _transformers(self) -> Any:
        if self._full is None:
            self._full = load_tokenizer(self._path)
        return self._full


def _specials(config: dict, added: dict[str, dict]) -> dict[str, str] | None:
    """Named special tokens, or None when one is not already an added token of the file."""
    specials = {}
    for name in _SPECIAL:
        value = config.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or value not in added:
            return None
        specials[name] = value
    return specials


def _same_added_tokens(config: dict, added: dict[str, dict]) -> bool:
    """tokenizer_config's added tokens are tokenizer.json's own (else transformers adds them)."""
    for index, token in (config.get("added_tokens_decoder") or {}).items():
        mine = added.get(token.get("content")) if isinstance(token, dict) else None
        if mine is None or mine["id"] != int(index):
            return False
        if any(mine.get(flag) != token.get(flag) for flag in _TOKEN_FLAGS):
            return False
    return True


def _chat_template(folder: Path, config: dict) -> tuple[bool, str | None]:
    """(readable here, template): a ``chat_template.jinja`` wins over the config's string."""
    if (folder / "chat_template.json").is_file():
        return False, None
    if (folder / "chat_template.jinja").is_file():
        return True, (folder / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    return template is None or isinstance(template, str), template


def _added_tokens(core) -> dict[str, dict]:
    return {token.content: {"id": index, **{flag: getattr(token, flag) for flag in _TOKEN_FLAGS}}
            for index, token in core.get_added_tokens_decoder().items()}


def _file_tokenizer(path: str) -> FileTokenizer | None:
    folder = Path(path)
    config = read_json(folder / "tokenizer_config.json") or {}
    if not (folder / "tokenizer.json").is_file() or not set(config) <= _SAFE_KEYS:
        return None
    if (folder / "added_tokens.json").is_file() or (
            (folder / "special_tokens_map.json").is_file() and "added_tokens_decoder" not in config):
        return None
    readable, template = _chat_template(folder, config)
    if not readable:
        return None
    from tokenizers import Tokenizer

    try:
        core = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as error:  # the tokenizers library raises plain Exception
        raise ModelError(_KEY, f"{folder / 'tokenizer.json'} is not a tokenizer file: "
                               f"{reason(error)}") from None
    added = _added_tokens(core)
    specials = _specials(config, added)
    if specials is None or not _same_added_tokens(config, added) or core.post_processor is None:
        return None
    core.no_padding()
    core.no_truncation()
    tokenizer = FileTokenizer(core, specials, template, path)
    tokenizer.cleans_up = (bool(config.get("clean_up_tokenization_spaces"))
                           and type(core.model).__name__ != "BPE")
    return tokenizer


# The files that decide what ``_file_tokenizer`` reads and whether it may.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "added_tokens.json",
                    "special_tokens_map.json", "chat_template.json", "chat_template.jinja")


@functools.lru_cache(maxsize=8)
def _kept_file_tokenizer(folder: str, stamp: tuple) -> FileTokenizer | None:
    """``_file_tokenizer`` once per folder while its files are unchanged (``stamp``)."""
    return _file_tokenizer(folder)


def read_tokenizer(path: str) -> Any:
    """The tokenizer of a model directory: from ``tokenizer.json`` where that is exact.

    The file tokenizer is read once per folder while its files are unchanged (SmolLM2's takes
    ~100 ms to read, and every compile asks for it again)."""
    folder = os.path.realpath(path)
    found = _kept_file_tokenizer(folder, tuple(stamp(Path(folder) / name)
                                               for name in _TOKENIZER_FILES))
    if found is not None:
        return found
    return load_tokenizer(path)


# Llama-3.2-1B's shape: a document written for it compiles and explains on a stand-in of it.
LLAMA_3_2_1B_SHAPE = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64}


def shape_stand_in(folder: str | Path, shape: dict, base: str = "causalab:tiny-llama") -> str:
    """A weightless directory: ``base``'s tokenizer and config with ``shape`` laid over it,
    enough to compile and explain a document at that shape without its checkpoint."""
    source, folder = Path(resolve(base).path), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            (folder / item.name).write_bytes(item.read_bytes())
    config = {**json.loads((source / "config.json").read_text()), **shape}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)
