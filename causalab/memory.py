"""A run's memory budget: read from text, measured against the machine, set against a model's weights.

The budget is what the whole process may hold, weights included: bytes with a unit (``6GiB``,
``512MiB``) or a share of what is free when the run starts (``80%``, the default), counted on
the device the model lands on (the CPU's available memory, or the accelerator's free memory).
The weights' size is read from the safetensors headers of the model directory (no tensor is
read), converted to the dtype the model loads in. The process has a floor of its own below
which no budget holds: what it holds once the runtime a run loads is imported (Python, torch,
transformers, nnsight and nnterp, MLflow when tracking: measured, :func:`import_runtime`) plus
:func:`load_margin`, what loading a model and its smallest trace add beyond the weights
(measured on the built-ins, below), plus the stored file mapped while weights convert to
another dtype (:func:`converted_bytes`). A budget under the floor plus the weights is refused
before the model loads, in one line naming all three; one at or above it is held (the
resident set's peak within 5 % of it on every built-in, :func:`peak_bytes`), and a run whose
peak passes it anyway says so (``engine.entry``). Stdlib only at import; psutil and torch
are imported where the machine is measured.

>>> parse("6GiB")
('bytes', 6442450944)
>>> parse("80%")
('share', 0.8)
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

DEFAULT = "80%"
UNITS = {"B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
         "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}
_SPELLED = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(%|[KMGT]i?B|B)\s*")
# Bytes per element of each safetensors dtype and of each document dtype.
_STORED = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
           "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


# Tensors of at least this many bytes get pages of their own (glibc's mmap) and give them back
# when freed. Left to itself glibc raises that threshold after each large free (up to 32 MiB),
# so freed activations stay in its heap and a run's resident set climbs across traces.
MMAP_THRESHOLD = 4 * 2 ** 20
# Fixing the mmap threshold also fixes glibc's trim threshold, at 128 KiB: the heap then gave
# the smaller tensors of every trace back and faulted them in again in the next one (a tenth
# of a small sweep's time, scripts/bench/medium.py). Its free top is now trimmed only once it
# passes this much.
TRIM_THRESHOLD = 64 * 2 ** 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` and its trim threshold at
    :data:`TRIM_THRESHOLD` (a no-op off glibc): what a trace frees goes back to the machine,
    so the budget's estimate holds on the resident set. True when both were set."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def parse(text: str) -> tuple[str, float]:
    """``("bytes", n)`` or ``("share", fraction)``; anything else a ``ValueError`` saying what
    a budget looks like."""
    found = _SPELLED.fullmatch(str(text))
    if found is None:
        raise ValueError(f"{text!r} is not a memory budget: give bytes with a unit "
                         f"(6GiB, 512MiB; units {', '.join(UNITS)}) or a share of free memory (80%)")
    number, unit = float(found.group(1)), found.group(2)
    if unit == "%":
        if not 0 < number <= 100:
            raise ValueError(f"{text!r}: a share of free memory is above 0% and at most 100%")
        return "share", number / 100
    if number <= 0:
        raise ValueError(f"{text!r}: a memory budget is more than 0 bytes")
    return "bytes", int(number * UNITS[unit])


# What loading a model and running its smallest trace add to the resident set beyond what the
# process held with its runtime imported (``import_runtime``) and beyond the weights: a fixed
# part (nnterp's wrapping of the model, the model class's module, the allocator's arenas, a
# one-row trace) and a part per vocabulary entry (the tokenizer's tables, the fidelity
# receipt's and the head's logits over every column). Measured on this machine (2 CPUs, glibc;
# scripts/bench/floor.py, the corpus patching document tracked, at the least budget each
# built-in accepts): 25 MiB beyond on the tiny and weekday built-ins (804 entries), 72 MiB on
# SmolLM2-135M (49,152), 286 MiB on Gemma-3-270M (262,144): 25 MiB + ~1.0 KiB per entry,
# rounded up to the figures below. Counted on the CPU only: an accelerator's budget counts
# what torch reserves there, which starts at zero.
LOAD_MARGIN = 64 * 2 ** 20
VOCAB_MARGIN = 1280  # bytes per vocabulary entry
# How far a measured peak may pass the budget before the run says it was not held.
PEAK_SLACK = 0.05


def import_runtime() -> None:
    """Import what a run loads before its first trace (torch, transformers' model classes,
    nnsight, nnterp; MLflow is in already when the run is tracked), so the resident set
    measured next is the process's own floor, not a share of it the load adds afterwards."""
    import nnterp  # noqa: F401  (nnsight, torch and transformers come with it)
    from transformers import PreTrainedModel  # noqa: F401


def load_margin(path: str | Path | None = None, device: str = "cpu") -> int:
    """What loading the model in directory ``path`` and its smallest trace add beyond its
    weights (0 on an accelerator): :data:`LOAD_MARGIN` plus :data:`VOCAB_MARGIN` per entry of
    its vocabulary (``config.json``'s ``vocab_size``, or its ``text_config``'s)."""
    if is_accelerator(device):
        return 0
    return LOAD_MARGIN + VOCAB_MARGIN * (_vocab_size(path) if path is not None else 0)


def _vocab_size(path: str | Path) -> int:
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if isinstance(size, int) and size > 0 else 0


def floor_bytes(held: int, path: str | Path | None = None, device: str = "cpu") -> int:
    """The process's floor: ``held`` (what it holds with the runtime imported) plus what the
    model at ``path`` adds beyond its weights as it loads and runs one row
    (:func:`load_margin`)."""
    return held + load_margin(path, device)


def peak_bytes(device: str = "cpu") -> int:
    """The most this process has held on the device since it started: the resident set's
    high-water mark (Linux's ``VmHWM``, which starts afresh at ``exec``; elsewhere
    ``ru_maxrss``, which on Linux keeps a forking parent's), or the most torch has reserved
    there."""
    if is_accelerator(device):
        import torch

        return int(torch.cuda.max_memory_reserved())
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def is_accelerator(device: str) -> bool:
    """Whether ``device`` (a placement as the loader resolved it) is a CUDA device."""
    return device.startswith("cuda") or device.isdigit()


def free_bytes(device: str = "cpu") -> int:
    """What the device has free now: the CPU's available memory (page cache counts as free,
    as the kernel reclaims it), or the accelerator's free memory."""
    if is_accelerator(device):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device if not device.isdigit()
                                                        else f"cuda:{device}"))[0])
    import psutil

    return int(psutil.virtual_memory().available)


def used_bytes(device: str = "cpu") -> int:
    """What this process holds on the device now: its resident set, or what torch holds."""
    if is_accelerator(device):
        import torch

        return int(torch.cuda.memory_reserved())
    import psutil

    return int(psutil.Process().memory_info().rss)


def budget_bytes(text: str | None, device: str = "cpu") -> int:
    """The budget ``text`` (None: ``DEFAULT``) in bytes for the whole process: a share counts
    what the process holds already plus that share of what is free."""
    kind, value = parse(text or DEFAULT)
    if kind == "bytes":
        return int(value)
    return used_bytes(device) + int(value * free_bytes(device))


def weights_bytes(path: str | Path, dtype: str | None = None) -> int:
    """Bytes the weights in model directory ``path`` take once loaded in ``dtype`` (None: as
    stored), from the safetensors headers alone; 0 when the directory holds none."""
    total = 0
    for file in sorted(Path(path).glob("*.safetensors")):
        for name, entry in _header(file).items():
            if name == "__metadata__":
                continue
            count = 1
            for size in entry["shape"]:
                count *= size
            floating = entry["dtype"].startswith(("F", "BF"))
            itemsize = ITEMSIZE.get(dtype) if floating and dtype else None
            total += count * (itemsize or _STORED.get(entry["dtype"], 4))
    return total


def converted_bytes(path: str | Path, dtype: str | None) -> int:
    """Bytes of the stored weights in ``path`` that are mapped while they load in another
    ``dtype`` (the whole stored size when some floating tensor is stored in another width,
    else 0): the loader reads the file through a mapping whose pages count in the resident
    set beside the converted copy (an fp32 GGUF dequantization loaded in bf16)."""
    if dtype is None or dtype not in ITEMSIZE:
        return 0
    for file in sorted(Path(path).glob("*.safetensors")):
        for name, entry in _header(file).items():
            if name != "__metadata__" and entry["dtype"].startswith(("F", "BF")) \
                    and _STORED.get(entry["dtype"]) != ITEMSIZE[dtype]:
                return weights_bytes(path)
    return 0


def _header(file: Path) -> dict:
    """A safetensors file's JSON header (names, dtypes, shapes, offsets)."""
    with open(file, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


def gib(count: float) -> str:
    """``3.0 GiB``, ``512 MiB``: a size as a budget line says it."""
    return f"{count / 2 ** 30:.1f} GiB" if count >= 2 ** 30 else f"{count / 2 ** 20:.0f} MiB"
