"""Writes stay under ``--out``: real paths, symlinks followed, checked before and at each write.

Document names are single safe segments (``causalab.document.names``), so a lexical path
cannot leave the output directory; a symlink inside it still can. :func:`inside` resolves a
path the way the operating system will (existing symlinks followed, ``..`` folded) and refuses
it unless it lies under the real root. :func:`check_plan` runs that over every directory and
save a plan will write, before the model loads, so a refused run leaves nothing behind; at
each write ``causalab.engine.record`` checks again and writes through the directory as opened.
Knows no tensor and opens no file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from causalab.errors import CausalabError, Path as JsonPath, RunError

if TYPE_CHECKING:  # annotations only
    from causalab.compile.plan import Plan

OUT_FLAG: JsonPath = ("--out",)


def inside(root: str | os.PathLike, path: str | os.PathLike, at: JsonPath = OUT_FLAG,
           error: type[CausalabError] = RunError) -> Path:
    """The real path of ``path``, refused at ``at`` unless it is ``root`` or under it.

    >>> str(inside("/tmp", "/tmp/a/../b")) == os.path.realpath("/tmp/b")
    True
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if not under(real_root, real):
        raise error(at, f"{os.fspath(path)} resolves to {real}, outside {real_root} "
                        "(a symlink out of the directory?); nothing is written there")
    return Path(real)


def under(real_root: str, real: str) -> bool:
    """Whether the real path ``real`` is the real path ``real_root`` or lies below it."""
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def _saves(node: object, document: dict | None) -> Iterator[tuple[str, JsonPath]]:
    """(file path, JSON path of its save) for a step node's saves and eval saves."""
    step = ((document or {}).get("steps") or {}).get(getattr(node, "name", None)) or {}
    for attribute, where in (("saves", ("saves",)), ("eval_saves", ("eval", "saves"))):
        authored = step.get("eval", {}).get("saves", []) if where[0] == "eval" else step.get("saves", [])
        for save in getattr(node, attribute, ()) or ():
            index = next((j for j, s in enumerate(authored or [])
                          if isinstance(s, dict) and s.get("file_path") == save.file_path), 0)
            yield save.file_path, ("steps", node.name) + where + (index, "file_path")


def check_plan(plan: Plan, out: str | os.PathLike, document: dict | None = None) -> None:
    """Refuse, before any write, a plan directory or save that would resolve outside ``out``."""
    from causalab.compile.plan import Plan

    document = plan.document if plan.document is not None else document
    directory = Path(out) / plan.directory
    inside(out, directory)
    for node in plan.children:
        if isinstance(node, Plan):
            check_plan(node, out, document)
            continue
        for file_path, at in _saves(node, document):
            inside(out, directory / file_path, at)
