"""Model keys -> local directories: built-ins, local directories and hub ids from the local cache.

It never reaches the network and never reads a weight: compiling and explaining need config and
tokenizer only. A built-in (``causalab:<name>``) is built once into
``$CAUSALAB_HOME/models/<name>-<revision[:12]>`` (``CAUSALAB_HOME`` defaults to
``~/.cache/causalab``), through a temporary directory renamed into place, so parallel processes
never see half a directory; a shipped ``weekday-*`` built-in resolves to its directory in the
package; a GGUF built-in (``smollm2-135m``, ``gemma3-270m``) and a local ``.gguf`` key are
dequantized once into ``$CAUSALAB_HOME/models/gguf-<file SHA-256[:16]>`` (``gguf.py``).

A revision is the digest of a directory's tensors (``digest.py``), made where the weights are
made and recorded beside them; a record whose weight files are unchanged is the revision, and a
pin that differs is refused at ``model.revision`` naming both. Where no record is current, a
pinned digest is checked when the weights are loaded (``verify_weights``, called by the engine's
loader). A hub id resolves only when a snapshot is already in the local Hugging Face cache.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from causalab.errors import ModelError, reason
from causalab.files import causalab_home
from causalab.models.staging import publish, staging_folder
from causalab.models.revision import (directory_digest, looks_like_digest, recorded,
                                    write_record)
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
    if key.endswith(".gguf") and _is(Path.is_file, key):
        return _gguf_file(key, revision, home)
    if _is(Path.is_dir, key):
        return _directory(key, revision)
    if _HUB_ID.match(key):
        return _hub(key, revision)
    raise ModelError(_KEY, f"{key!r} is not a directory, a hub id or a built-in "
                           f"({_builtin_names()})")


def _is(test, key: str) -> bool:
    """``test`` (``Path.is_dir``…) of ``key`` as a path; False for a key no file system can
    name (a sentence past the file-name limit raises ENAMETOOLONG), so it is refused as a key."""
    try:
        return test(Path(key))
    except (OSError, ValueError):
        return False


def _builtin_names() -> str:
    """``causalab:<name>`` for tiny-llama, …: the scheme said once keeps the line short."""
    return f"{SCHEME}<name> for " + ", ".join(BUILTINS)


def _builtin(key: str, revision: str | None, home: str | None) -> Resolved:
    name = key[len(SCHEME):]
    entry = BUILTINS.get(name)
    if entry is None:
        raise ModelError(_KEY, f"unknown built-in {key!r}; built-ins are {_builtin_names()}")
    if entry["kind"] == "weekday":
        path, actual = WEIGHTS / name, entry["revision"]  # its tensors are checked at load
        if not (path / "config.json").is_file():
            raise ModelError(_KEY, f"{key} is not shipped in this install ({path} is missing); "
                                   f"run scripts/train_builtin.py {name}")
    elif entry["kind"] == "gguf":
        path, actual = _shipped_gguf(key, entry, home)
    else:
        path, actual = _materialise(name, entry, revision, home)
    if revision not in _FLOATING and revision != actual:
        raise ModelError(_REVISION, f"{key} has revision {actual}, "
                                    f"the document pins {revision!r}")
    return Resolved(key=key, path=str(path), revision=actual, builtin=True)


def _materialise(name: str, entry: dict, revision: str | None, home: str | None):
    """(directory, revision) of a tiny built-in, building it into the cache when absent."""
    wanted = entry["revision"] if revision in _FLOATING else revision
    root = models_home(home)
    if wanted:
        cached = root / f"{name}-{wanted[:12]}"
        if (cached / "config.json").is_file() and (cached / "tokenizer.json").is_file():
            _trusted(cached, wanted)
            return cached, wanted
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(root, name)
    try:
        from causalab.models.build import build

        build(entry, staging)
        actual = directory_digest(staging)
        write_record(staging, actual)
        final = root / f"{name}-{actual[:12]}"
        publish(staging, final, "tokenizer.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final, actual


def _trusted(cached: Path, revision: str) -> None:
    """Record the revision a cached built-in's name vouches for, once (a cache made before
    revisions were recorded); it is then checked at load like any record."""
    if recorded(cached) is None:
        write_record(cached, revision)


def _shipped_gguf(key: str, entry: dict, home: str | None) -> tuple[Path, str]:
    """(directory, revision) of a built-in shipped as a GGUF file in installed packages.

    The cached directory is named by the file's published SHA-256 (its RECORD, or the sums file
    of a file split into chunk packages), so finding it reads no weights; a fresh
    dequantization is hashed and checked against the registry's pin before it is kept.
    """
    from causalab.models import gguf, shipped

    if entry.get("chunks"):
        sha256 = shipped.published_sha256(entry["distribution"], entry["sums"], entry["file"])

        def source(staging: Path) -> Path:
            (staging / gguf.SOURCE_FOLDER).mkdir()
            joined = staging / gguf.SOURCE_FOLDER / entry["file"]
            shipped.join_chunks(tuple(entry["chunks"]), entry["file"], sha256, joined)
            return joined
    else:
        sha256 = shipped.recorded_sha256(entry["distribution"], entry["file"])

        def source(staging: Path) -> Path:
            return shipped.shipped_file(entry["distribution"], entry["file"])
    path, _ = gguf.materialise(sha256, models_home(home), source, entry["revision"])
    _trusted(path, entry["revision"])
    return path, entry["revision"]


def _gguf_file(key: str, revision: str | None, home: str | None) -> Resolved:
    """A local ``.gguf`` file: dequantized once into the cache, its revision the tensor digest."""
    from causalab.models.gguf import cached_directory

    path, _ = cached_directory(key, models_home(home))
    if recorded(path) is None:  # a cache entry made before revisions were recorded
        write_record(path, directory_digest(path))
    return _directory(str(path), revision, key=key)


def _directory(path: str, revision: str | None, *, key: str | None = None) -> Resolved:
    """A local Hugging Face directory; its revision is the digest of its tensors, as recorded.

    No weight is read here: a recorded digest (``digest.RECORD``) is the revision; without one,
    a pinned digest is checked when the weights are loaded (``verify_weights``) and a floating
    revision stays as given. A directory of config and tokenizer only (enough to compile and
    explain) has no tensors to pin, so pinning it by digest is refused at ``model.key``.
    """
    key = key or path
    path = str(Path(path).resolve())
    if not (Path(path) / "config.json").is_file():
        raise ModelError(_KEY, f"{key} is a directory without config.json, so not a model "
                               "directory (a Hugging Face checkpoint folder has one)")
    has_weights = any(Path(path).glob("*.safetensors"))
    if not has_weights and looks_like_digest(revision):
        raise ModelError(_KEY, f"{key} holds no *.safetensors weights, so its tensor digest "
                               "(the pinned revision) cannot be checked")
    actual = recorded(path) if has_weights else None
    if actual is None:
        if has_weights and revision not in _FLOATING and not looks_like_digest(revision):
            raise ModelError(_REVISION, f"{key} holds weights, whose revision is a tensor "
                                        f"digest; the document pins {revision!r}, "
                                        "which is not one")
        return Resolved(key=key, path=path, revision=revision or "main", builtin=False)
    if revision not in _FLOATING and revision != actual:
        raise ModelError(_REVISION, f"{key} has tensor digest {actual}, "
                                    f"the document pins {revision!r}")
    return Resolved(key=key, path=path, revision=actual, builtin=False)


def unchecked_pin(key: str, path: str, revision: str | None) -> str | None:
    """Why a local directory's pinned tensor digest is not checked before a run loads its
    weights (no current record of the digest beside them), else None: what ``explain``
    cannot check without reading every weight, and ``verify_weights`` checks at load."""
    if key.startswith(SCHEME) or not looks_like_digest(revision):
        return None
    if not any(Path(path).glob("*.safetensors")) or recorded(path) is not None:
        return None
    return (f"revision not checked: {key} has no record of its tensor digest, so the pin is "
            "checked only when a run loads its weights")


def verify_weights(key: str, path: str, revision: str | None) -> str:
    """At load: the tensor digest of the weights in ``path``, refused unless it is the pin.

    The pin is the document's digest, else a built-in's registry revision. A directory without
    a current record is hashed (its weights are about to be read anyway) and the digest
    recorded beside them where the folder may be written (never inside this package).
    """
    entry = BUILTINS.get(key[len(SCHEME):]) if key.startswith(SCHEME) else None
    expected = revision if looks_like_digest(revision) else (entry or {}).get("revision")
    if not any(Path(path).glob("*.safetensors")):
        return revision or "main"
    actual = recorded(path)
    if actual is None:
        actual = directory_digest(path)
        if not Path(path).resolve().is_relative_to(Path(__file__).resolve().parents[1]):
            write_record(path, actual)
    if expected and actual != expected:
        raise ModelError(_REVISION, f"{key}: the weights in {path} have tensor digest {actual}, "
                                    f"the {'document' if expected == revision else 'registry'} "
                                    f"pins {expected}")
    return actual


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
