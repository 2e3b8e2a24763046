"""Command-line flag values, checked where they are given so that a refusal names the flag.

A value that the pipeline would only trip over later (a device map at load time, a data root
when the first dataset is opened, a tracking URI when MLflow makes its client) would be blamed
on whatever it broke: the model key, a step's rows. These checks run first and put the flag
itself in the path (``--device-map: …``). The ``argparse`` types need nothing installed;
:func:`check_device` imports torch and is called only by verbs that load weights anyway.
"""
from __future__ import annotations

import argparse
import contextlib
import re
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from causalab import files
from causalab.errors import CausalabError, Path as JsonPath, UsageError

# accelerate's placement strategies; anything else must name a device.
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_DEVICE = re.compile(r"(cpu|mps|meta|(cuda|xpu|npu)(:\d+)?|\d+)")
# Schemes MLflow's own stores understand; a plain path (no scheme) is a file store.
_TRACKING_SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql",
                     "databricks", "databricks-uc", "uc")
_DIGEST = re.compile(r"[0-9a-f]{1,64}")


def _placement_problem(text: str) -> str | None:
    if text in _STRATEGIES or _DEVICE.fullmatch(text):
        return None
    return (f"{text!r} is neither a placement ({', '.join(_STRATEGIES)}) nor a device "
            "(cpu, cuda, cuda:N, mps, xpu:N)")


def device_map(text: str) -> str:
    """``--device-map``: a placement strategy or one device (``cpu``, ``cuda:1``, ``0``)."""
    problem = _placement_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def memory(text: str) -> str:
    """``--memory``: bytes with a unit (6GiB) or a share of free memory (80%)."""
    from causalab.memory import parse

    try:
        parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def tracking_uri(text: str) -> str:
    """``--tracking-uri``: a path or a URI with a scheme MLflow stores understand."""
    scheme = urlparse(text).scheme
    if scheme and len(scheme) > 1 and scheme.split("+")[0] not in _TRACKING_SCHEMES:
        raise argparse.ArgumentTypeError(
            f"{text!r} has scheme {scheme!r}; use one of {', '.join(_TRACKING_SCHEMES)} "
            "or a directory path")
    return text


def digest(text: str) -> str:
    """``--produced-by``: a point digest or the start of one (lower-case hex)."""
    if _DIGEST.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a digest (lower-case hex, as "
                                     "'causalab runs' prints it)")


def check_device(value: str, where: JsonPath) -> None:
    """Refuse a device this machine lacks before any weight is read (imports torch, except
    for ``cpu`` and ``auto``, which every machine has)."""
    problem = _placement_problem(value)
    if problem:
        raise UsageError(where, problem)
    if value in ("cpu", "auto"):
        return
    import torch

    name = f"cuda:{value}" if value.isdigit() else value
    kind, _, index = name.partition(":")
    if kind == "cuda":
        count = torch.cuda.device_count()
        if int(index or 0) >= count:
            raise UsageError(where, f"{value!r} asks for a CUDA device but this machine has "
                                    f"{count}; use cpu or auto")
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise UsageError(where, "mps is not available on this machine; use cpu or auto")
    elif kind in ("xpu", "npu") and not _has_backend(torch, kind, int(index or 0)):
        raise UsageError(where, f"{value!r} is not a device this machine has; use cpu or auto")


def _has_backend(torch, kind: str, index: int) -> bool:
    backend = getattr(torch, kind, None)
    return backend is not None and backend.is_available() and index < backend.device_count()


def check_directory(value: str, where: JsonPath) -> None:
    """An input directory that must exist (``--data-root``, ``--config-dir``)."""
    if not Path(value).is_dir():
        raise UsageError(where, f"{value!r} is not a directory")


def check_writable(value: str, where: JsonPath, *, file_ok: bool = False) -> None:
    """An output place that can be made: named (an empty value would silently mean the working
    directory), not a file (unless ``file_ok``), under a folder that can really be written in
    (``files.cannot_write_in``); nothing is left behind."""
    if not value:
        raise UsageError(where, "is empty; name a file or a directory" if file_ok else
                         "is empty; name a directory")
    target = Path(value)
    if target.exists() and not target.is_dir() and not file_ok:
        raise UsageError(where, f"{value!r} is a file, not a directory")
    why = files.cannot_write_in(files.nearest_folder(target if target.is_dir() else target.parent))
    if why is not None:
        raise UsageError(where, f"cannot write under {value!r}: {why}")


@contextlib.contextmanager
def blamed_on(renames: dict[JsonPath, JsonPath]) -> Iterator[None]:
    """Re-place refusals raised at a document path onto the flag that supplied the value.

    ``causalab model KEY --revision R`` resolves KEY and R as a document's ``model.key`` and
    ``model.revision`` would be; on the command line they are the argument and the flag.
    """
    try:
        yield
    except CausalabError as error:
        for old, new in renames.items():
            if error.path[:len(old)] == old:
                raise type(error)(new + error.path[len(old):], error.message) from None
        raise
