"""GGUF checkpoints as model sources: one ``.gguf`` file -> an ordinary Hugging Face directory.

transformers reads GGUF and dequantizes it to a float32 model but refuses to save what it read
("quantized with gguf, not serializable"); this module rebuilds the model from a config without
``quantization_config``, copies the weights in and saves it with the tokenizer into a folder of the
cache (renamed into place, so nothing half-written is ever trusted). Where the file comes from
(a path, a distribution's file, chunks joined: ``shipped.py``) is the caller's business.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from causalab.errors import ModelError
from causalab.models import bars
from causalab.models.revision import directory_digest, write_record
from causalab.models.staging import publish, staging_folder

_KEY = ("model", "key")
_CHUNK = 1 << 22
# A staging directory this old was left by a killed build (a live one takes minutes, not hours).
_STALE_SECONDS = 3600
PREFIX = "gguf-"
# Where a staging folder holds a GGUF file joined from chunks while it is dequantized.
SOURCE_FOLDER = ".source"
# The local GGUF files (path, size, mtime) a cached directory was made from or matched.
SOURCES = "causalab-sources.json"


def cached_directory(path: str | Path, root: Path) -> tuple[Path, bool]:
    """(directory, made now) of the local GGUF file ``path``, dequantized once per file digest.

    A file met before (same path, size and modification time) is found through the sources
    its directory lists, so it is not read again; a new one is hashed once.
    """
    source = Path(path).resolve()
    known = _known(source, root)
    if known is not None:
        return known, False
    found = materialise(file_digest(source), root, lambda staging: source)
    _remember(source, found[0])
    return found


def materialise(digest: str, root: Path, source: Callable[[Path], Path],
                expected: str | None = None) -> tuple[Path, bool]:
    """(directory, made now) of the GGUF file whose SHA-256 is ``digest``, under ``root``.

    ``source(staging)`` gives the file (it may write it inside ``staging``, which is removed).
    The directory is written into a hidden staging folder, its tensor digest recorded beside
    the weights (and refused at ``model.revision`` unless it is ``expected``), and renamed into
    place, so a build killed half-way leaves only a hidden folder that no later call trusts
    (and that is removed once stale).
    """
    final = root / f"{PREFIX}{digest[:16]}"
    if (final / "config.json").is_file():
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, final.name)
    staging = staging_folder(root, final.name)
    try:
        dequantize(source(staging), staging)
        shutil.rmtree(staging / SOURCE_FOLDER, ignore_errors=True)
        actual = directory_digest(staging)
        if expected and actual != expected:
            raise ModelError(("model", "revision"), f"dequantizing {final.name} gave revision "
                                                    f"{actual}, the registry pins {expected}")
        write_record(staging, actual)
        publish(staging, final, "config.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final, True


def _fingerprint(source: Path) -> dict:
    info = source.stat()
    return {"path": str(source), "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def _known(source: Path, root: Path) -> Path | None:
    """The cached directory that lists ``source`` (unchanged) among the files it came from."""
    mark = _fingerprint(source)
    for listed in root.glob(f"{PREFIX}*/{SOURCES}"):
        try:
            if mark in json.loads(listed.read_text(encoding="utf-8")):
                return listed.parent
        except (OSError, ValueError):
            continue
    return None


def _remember(source: Path, directory: Path) -> None:
    """Add ``source`` to the files ``directory`` lists as its origin (best effort)."""
    listed = directory / SOURCES
    try:
        marks = json.loads(listed.read_text(encoding="utf-8")) if listed.is_file() else []
        marks = [m for m in marks if m.get("path") != str(source)] + [_fingerprint(source)]
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{SOURCES}-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(marks, out)
        os.chmod(temporary, 0o644)
        os.replace(temporary, listed)
    except (OSError, ValueError, AttributeError):
        return


def _remove_stale(root: Path, name: str) -> None:
    for left in root.glob(f".{name}-*"):
        if time.time() - left.stat().st_mtime > _STALE_SECONDS:
            shutil.rmtree(left, ignore_errors=True)


def file_digest(path: str | Path) -> str:
    """SHA-256 hex of a file's bytes (a GGUF file is ~100 MB), remembered per size and mtime."""
    stat = Path(path).stat()
    return _file_digest(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _file_digest(path: str, size: int, mtime: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


def dequantize(path: str | Path, directory: str | Path) -> None:
    """Write the float32 Hugging Face directory of the GGUF file ``path`` into ``directory``.

    A file transformers cannot read (truncated, not GGUF, an architecture it does not know) is a
    ``ModelError`` at ``model.key`` in one line; ``directory`` may then hold partial files, which
    is why callers write into a temporary directory.
    """
    source = Path(path)
    with bars.quiet():
        model, tokenizer = _read(source)
        plain = _unquantized(model)
        plain.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def _read(source: Path):
    """(model, tokenizer) transformers reads from a GGUF file, refused in one line if it cannot."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                     dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise ModelError(_KEY, f"{source} is not a GGUF checkpoint transformers can read "
                               f"({type(error).__name__}: {first})") from None
    return model.eval(), tokenizer


def _unquantized(model):
    """The same weights in a model whose config carries no ``quantization_config``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = model.config.to_dict()
    fields.pop("quantization_config", None)
    config = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.tie_weights()
    return plain.eval()
