"""Model keys -> local directories: built-ins, local directories and hub ids from the local cache.

It never reaches the network. A built-in (``causalab:<name>``) is built once into
``$CAUSALAB_HOME/models/<name>-<revision[:12]>`` (``CAUSALAB_HOME`` defaults to
``~/.cache/causalab``), through a temporary directory renamed into place, so parallel processes
never see half a directory; a shipped ``weekday-*`` built-in resolves to its directory in the
package; a GGUF built-in (``smollm2-135m``) and a local ``.gguf`` key are dequantized once into
``$CAUSALAB_HOME/models/gguf-<file digest[:16]>`` (``gguf.py``). A built-in's revision is
its tensor digest; asking for another is refused.

A local directory's revision is the digest of its tensors too, so a document that pins one pins
the weights; any other pinned value is refused at ``model.revision`` naming both (a directory
without weights, config and tokenizer only, passes its revision through). A hub id resolves only when a snapshot is already in the local Hugging Face
cache.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from causalab.errors import ModelError, reason
from causalab.files import causalab_home
from causalab.models.staging import publish, staging_folder
from causalab.models.digest import directory_digest, looks_like_digest
from causalab.models.json_files import read_json
from causalab.models.registry import BUILTINS, SCHEME

_KEY = ("model", "key")
_REVISION = ("model", "revision")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_FLOATING = (None, "", "main")
WEIGHTS = Path(__file__).parent / "weights"


@dataclass(frozen=True)
class Resolved:
    """Where a model key lives on disk. ``revision`` is the digest for a built-in."""

    key: str
    path: str
    revision: str
    builtin: bool


def models_home(home: str | None = None) -> Path:
    """The cache folder for built-ins: ``home``, else ``$CAUSALAB_HOME``, else ~/.cache/causalab."""
    return (Path(home) if home else causalab_home()) / "models"


def resolve(key: str, revision: str | None = None, *, home: str | None = None) -> Resolved:
    """Resolve ``key`` at ``revision`` (``None`` or ``"main"``: whatever the key gives now).

    >>> resolve("causalab:tiny-llama").builtin
    True
    """
    if not key.strip():
        raise ModelError(_KEY, f"{key!r} is blank; give a built-in ({_builtin_names()}), a model "
                               "directory or a hub id")
    if key.startswith(SCHEME):
        return _builtin(key, revision, home)
    if key.endswith(".gguf") and Path(key).is_file():
        return _gguf_file(key, revision, home)
    if Path(key).is_dir():
        return _directory(key, revision)
    if _HUB_ID.match(key):
        return _hub(key, revision)
    raise ModelError(_KEY, f"{key!r} is not a directory, a hub id or a built-in "
                           f"({_builtin_names()})")


def _builtin_names() -> str:
    """``causalab:<name>`` for tiny-llama, …: the scheme said once keeps the line short."""
    return f"{SCHEME}<name> for " + ", ".join(BUILTINS)


def _builtin(key: str, revision: str | None, home: str | None) -> Resolved:
    name = key[len(SCHEME):]
    entry = BUILTINS.get(name)
    if entry is None:
        raise ModelError(_KEY, f"unknown built-in {key!r}; built-ins are {_builtin_names()}")
    if entry["kind"] == "weekday":
        path = WEIGHTS / name
        if not (path / "config.json").is_file():
            raise ModelError(_KEY, f"{key} is not shipped in this install ({path} is missing); "
                                   f"run scripts/train_builtin.py {name}")
        actual = directory_digest(path)
        if actual != entry["revision"]:
            raise ModelError(_REVISION, f"{key}: the shipped weights have revision {actual}, "
                                        f"the registry pins {entry['revision']}; reinstall")
    elif entry["kind"] == "gguf":
        path, actual = _shipped_gguf(key, entry, home)
    else:
        path, actual = _materialise(name, entry, revision, home)
    if revision not in _FLOATING and revision != actual:
        raise ModelError(_REVISION, f"{key} has revision {actual}, the document pins {revision}")
    return Resolved(key=key, path=str(path), revision=actual, builtin=True)


def _materialise(name: str, entry: dict, revision: str | None, home: str | None):
    """(directory, revision) of a tiny built-in, building it into the cache when absent."""
    wanted = entry["revision"] if revision in _FLOATING else revision
    root = models_home(home)
    if wanted:
        cached = root / f"{name}-{wanted[:12]}"
        if (cached / "config.json").is_file() and (cached / "tokenizer.json").is_file():
            return cached, wanted
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(root, name)
    try:
        from causalab.models.build import build

        build(entry, staging)
        actual = directory_digest(staging)
        final = root / f"{name}-{actual[:12]}"
        publish(staging, final, "tokenizer.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final, actual


def _shipped_gguf(key: str, entry: dict, home: str | None) -> tuple[Path, str]:
    """(directory, revision) of a built-in shipped as a GGUF file in an installed package.

    A cached directory is trusted by the file digest in its name, like any cached built-in; a
    fresh dequantization is hashed and checked against the registry's pin.
    """
    from causalab.models.gguf import cached_directory, shipped_file

    path, made = cached_directory(shipped_file(entry["distribution"], entry["file"]),
                                  models_home(home))
    if made and directory_digest(path) != entry["revision"]:
        raise ModelError(_REVISION, f"{key}: dequantizing gave revision {directory_digest(path)}"
                                    f", the registry pins {entry['revision']}; reinstall "
                                    f"{entry['distribution']}")
    return path, entry["revision"]


def _gguf_file(key: str, revision: str | None, home: str | None) -> Resolved:
    """A local ``.gguf`` file: dequantized once into the cache, its revision the tensor digest."""
    from causalab.models.gguf import cached_directory

    path, _ = cached_directory(key, models_home(home))
    return _directory(str(path), revision, key=key)


def _directory(path: str, revision: str | None, *, key: str | None = None) -> Resolved:
    """A local Hugging Face directory; its revision is the digest of its tensors.

    A directory of config and tokenizer only (enough to compile and explain) has no tensors to
    pin, so its revision passes through; pinning it by digest is refused at ``model.key``.
    """
    key = key or path
    path = str(Path(path).resolve())
    if not (Path(path) / "config.json").is_file():
        raise ModelError(_KEY, f"{key} is a directory without config.json, so not a model "
                               "directory (a Hugging Face checkpoint folder has one)")
    if not looks_like_digest(revision) and not any(Path(path).glob("*.safetensors")):
        return Resolved(key=key, path=path, revision=revision or "main", builtin=False)
    actual = directory_digest(path)
    if revision not in _FLOATING and revision != actual:
        raise ModelError(_REVISION, f"{key} has tensor digest {actual}, "
                                    f"the document pins {revision}")
    return Resolved(key=key, path=path, revision=actual, builtin=False)


def _hub(key: str, revision: str | None) -> Resolved:
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id=key, revision=revision or "main", local_files_only=True)
    except Exception as error:
        raise ModelError(_KEY, f"cannot reach the hub for {key!r} and it is not in the local "
                               f"cache ({type(error).__name__}); use causalab:tiny-llama or "
                               f"causalab:weekday-llama") from None
    return Resolved(key=key, path=path, revision=Path(path).name, builtin=False)


def load_tokenizer(path: str):
    """The tokenizer of a model directory: fast, left padding, a pad token always set.

    ``PreTrainedTokenizerFast`` rather than ``AutoTokenizer``: for a Qwen2 config the latter
    swaps in Qwen2's own tokenizer class and mangles a custom vocabulary silently. A directory
    it cannot read is refused at ``model.key``.
    """
    from transformers import PreTrainedTokenizerFast

    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    except Exception as error:
        if not (Path(path) / "tokenizer.json").is_file():
            raise ModelError(_KEY, f"{path} holds no tokenizer.json, so no tokenizer to "
                                   "read") from None
        raise ModelError(_KEY, f"cannot read the tokenizer in {path}: {reason(error)}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_config(path: str):
    """The transformers config of a model directory (no weights are read); a missing, broken
    or unknown config is refused at ``model.key`` naming the file and what is wrong."""
    file = Path(path) / "config.json"
    values = read_json(file)
    if values is None:
        raise ModelError(_KEY, f"{path} holds no config.json, so not a model directory")
    family = values.get("model_type")
    if not isinstance(family, str) or not family:
        raise ModelError(_KEY, f"{file} has no model_type, so its model family is unknown")
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if family not in CONFIG_MAPPING:
        raise ModelError(_KEY, f"{file} names model_type {family!r}, a family this "
                               "transformers does not know")
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as error:
        raise ModelError(_KEY, f"{file} is not a valid {family} config: {reason(error)}") from None
