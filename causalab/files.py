"""Artifact file names that more than one module writes or reads: constants, one place; and
the stamp by which the process keeps what it read from a file (``stamp``)."""
import os

DOCUMENT = "document.json"
RUN_RECORD = "run.json"
HYDRA_CONFIG = "hydra_config.yaml"
TENSOR_KEY = "weight"
BASIS_KEY = "basis"  # a subspace bundle's orthonormal (d, k) basis, next to its weight
TENSOR_SUFFIX = ".safetensors"
TABLE_SUFFIX = ".json"
RESERVED = (DOCUMENT, RUN_RECORD)
DEFAULT_DATA_ROOT = "documents/data"
DEFAULT_OUT = "out"
SAELENS_CONFIG = "cfg.json"
SAELENS_WEIGHTS = "sae_weights.safetensors"


def stamp(path: "str | os.PathLike") -> tuple | None:
    """What changes when a file is written, replaced or removed: (mtime_ns, size, inode), None
    when there is no such file. Caches of files read again and again (data tables, weight
    digests, tokenizers) are keyed by it, so a changed file is read anew."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size, found.st_ino
