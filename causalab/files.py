"""Artifact file names that more than one module writes or reads: constants, one place; the
stamp by which the process keeps what it read from a file (``stamp``); and where a path that
is not there yet would be written (``nearest_folder``, ``cannot_write_in``)."""
import os
import tempfile
from pathlib import Path

DOCUMENT = "document.json"
RUN_RECORD = "run.json"
HYDRA_CONFIG = "hydra_config.yaml"
# A fit's loss and eval curves beside its point's tables (plots/sweep_files.py); on its
# tracked run, ``plots/`` + this.
LOSS_PICTURE = "{step}_loss.png"
TENSOR_KEY = "weight"
BASIS_KEY = "basis"  # a subspace bundle's orthonormal (d, k) basis, next to its weight
TENSOR_SUFFIX = ".safetensors"
TABLE_SUFFIX = ".json"
CLAIM = ".causalab-claim.json"  # the lock a run holds on its --out (causalab/tracking/claims.py)
RESERVED = (DOCUMENT, RUN_RECORD, CLAIM)
DEFAULT_DATA_ROOT = "documents/data"
DEFAULT_OUT = "out"
SAELENS_CONFIG = "cfg.json"
SAELENS_WEIGHTS = "sae_weights.safetensors"
HOME_VARIABLE = "CAUSALAB_HOME"


def causalab_home() -> Path:
    """Where causalab keeps what it makes once and reuses: ``$CAUSALAB_HOME``, else
    ~/.cache/causalab; built-in models under ``models/``, downloaded artifacts under
    ``artifacts/`` (docs/platform.md §5)."""
    return Path(os.environ.get(HOME_VARIABLE) or Path.home() / ".cache" / "causalab")


def stamp(path: "str | os.PathLike") -> tuple | None:
    """What changes when a file is written, replaced or removed: (mtime_ns, size, inode), None
    when there is no such file. Caches of files read again and again (data tables, weight
    digests, tokenizers) are keyed by it, so a changed file is read anew."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size, found.st_ino


def nearest_folder(path: "str | os.PathLike") -> Path:
    """``path`` itself or its nearest ancestor that exists: what making it would write in."""
    found = Path(path)
    while not found.exists():
        found = found.parent
    return found


def cannot_write_in(folder: Path) -> str | None:
    """Why nothing can be made in ``folder``, found by making (and removing) a file, not by
    asking: permission bits let root through where the kernel still refuses (``/sys``,
    ``/proc``). None when it can."""
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".causalab-probe-")
    except OSError as error:
        return f"cannot write in {folder} ({error.strerror or error})"
    os.close(handle)
    os.unlink(probe)
    return None
