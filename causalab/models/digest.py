"""The revision of a built-in: a SHA-256 digest over its tensors, not over file bytes.

It hashes names (sorted), dtypes, shapes and raw bytes, so the same weights saved twice (with
different safetensors metadata or shard layout) have one revision. It reads safetensors only.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from causalab.errors import ModelError
from causalab.files import stamp

DIGEST_LENGTH = 64


def tensor_digest(tensors: dict) -> str:
    """SHA-256 hex of ``{name: torch.Tensor}``, independent of dict order and file layout."""
    import torch

    sha = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        sha.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def directory_digest(path: str | Path) -> str:
    """The tensor digest of every ``*.safetensors`` file in a model directory, merged.

    Remembered in this process per directory and per each file's name and ``files.stamp``, so a
    built-in resolved again (every compile) is not reloaded and rehashed; rewritten weights
    change the key. A directory without weights is a ``ModelError`` at ``model.key``.
    """
    directory = Path(path).resolve()
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(("model", "key"), f"{path} holds no *.safetensors weights, so its "
                                           "tensor digest (the pinned revision) cannot be checked")
    return _digest_of(str(directory), tuple((f.name, stamp(f)) for f in files))


@functools.lru_cache(maxsize=64)
def _digest_of(directory: str, stamps: tuple) -> str:
    from safetensors.torch import load_file

    tensors: dict = {}
    for name, _ in stamps:
        tensors.update(load_file(str(Path(directory) / name)))
    return tensor_digest(tensors)


def looks_like_digest(revision: str | None) -> bool:
    """True for a 64-digit hex string, the only revision form a tensor digest can take."""
    return (revision is not None and len(revision) == DIGEST_LENGTH
            and all(c in "0123456789abcdef" for c in revision))
