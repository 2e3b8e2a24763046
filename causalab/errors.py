"""The one error family: every refusal carries the JSON path at fault as data.

A path is a tuple of keys and list indices; the message prints as
``steps.fit.objective.1.0: <message>``. Library exceptions (pydantic, nnsight,
safetensors) are translated into these at one boundary each, so the CLI can print
one line and exit non-zero without a traceback.
"""
from __future__ import annotations

import re
from typing import Iterable

PathPart = str | int
Path = tuple[PathPart, ...]

QUOTE_LIMIT = 80  # characters of one user string a refusal quotes; longer ones are cut
# A quoted string in a message (a repr or a JSON string): opened and closed off a word, so an
# apostrophe inside prose ("the bundle's") never opens one.
_QUOTED = re.compile(r"""(?<!\w)(['"])((?:(?!\1)[^\\\n]|\\.){%d,})\1(?!\w)""" % (QUOTE_LIMIT + 1))
# An unquoted run of twice that (a name in a "declared: …" list); a long path stays whole.
_LONG_WORD = re.compile(r"\S{%d,}" % (2 * QUOTE_LIMIT + 1))


def shorten(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, its middle given up to one ellipsis, so the end
    of a long name (a file's name, a key's suffix) still shows.

    >>> shorten("x" * 100 + ".json", 12)
    'xxxxxx….json'
    """
    if len(text) <= limit:
        return text
    tail = (limit - 1) // 2
    return text[:limit - 1 - tail] + "…" + text[len(text) - tail:]


def _quoted_cut(message: str) -> str:
    """Every quoted string in ``message`` longer than QUOTE_LIMIT, and every unquoted word
    longer than twice that, cut (``shorten``)."""
    message = _QUOTED.sub(lambda m: m.group(1) + shorten(m.group(2)) + m.group(1), message)
    return _LONG_WORD.sub(lambda m: shorten(m.group(0)), message)


def _printable(part: str) -> str:
    """A key as one line of text: control characters and lone surrogates escaped, cut to
    QUOTE_LIMIT characters."""
    if not (part.isprintable()
            and part.encode("utf-8", "surrogatepass") == part.encode("utf-8", "ignore")):
        part = part.encode("unicode_escape").decode("ascii")
    return shorten(part)


def format_path(path: Iterable[PathPart]) -> str:
    """``("steps", "fit", "objective", 1, 0)`` -> ``"steps.fit.objective.1.0"``."""
    parts = [_printable(str(p)) for p in path]
    return ".".join(parts) if parts else "<root>"


def reason(error: BaseException) -> str:
    """A library error's own sentence, without its class name: the innermost cause's first line
    (transformers wraps a config's complaint in a dataclass validation error)."""
    while error.__cause__ is not None and type(error.__cause__).__name__ != "_RemoteTraceback":
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if any(c.isalpha() for c in line)]
    return lines[0] if lines else type(error).__name__


def fault_line(error: BaseException, hint: str) -> str:
    """A fault that is not a refusal, still one line on stderr, with the way to see more."""
    return f"error: {type(error).__name__}: {' '.join(str(error).split())} ({hint})"


def not_set_up(error: ModuleNotFoundError, command: str) -> str | None:
    """The one line a front door (``python -m causalab``, ``python -m causalab.run``) prints
    when a library it needs is not installed in the interpreter running it: the checkout's
    set-up was not made, or another Python runs it. None for a module of causalab's own (a
    bug, not a set-up), which keeps its traceback.

    >>> line = not_set_up(ModuleNotFoundError("No module", name="hydra"), "causalab.run")
    >>> line.startswith("error: no module named 'hydra': ") and "`make setup`" in line
    True
    """
    name = (error.name or "").split(".")[0]
    if not name or name in ("causalab", "hydra_plugins"):
        return None
    return (f"error: no module named {name!r}: this Python is not causalab's set-up; run "
            f"`make setup` in the checkout (it makes .venv), then "
            f".venv/bin/python -m {command} ...")


class CausalabError(Exception):
    """Base of every error causalab raises on purpose. ``path`` is where it is (kept whole);
    the message's quoted user strings are cut to QUOTE_LIMIT characters, once, here."""

    stage = "run"

    def __init__(self, path: Iterable[PathPart], message: str):
        self.path: Path = tuple(path)
        self.message = _quoted_cut(message)
        super().__init__(f"{format_path(self.path)}: {message}")

    def __reduce__(self):
        """Pickled as its path and message (a refusal raised in a launcher's job process
        crosses back whole)."""
        return type(self), (self.path, self.message)


class DocumentError(CausalabError):
    """Refused offline: schema, sweeps, names and references (docs/format.md §14.1)."""

    stage = "validate"


class CompileError(CausalabError):
    """Refused against config, tokenizer and data, before any weight (docs/format.md §14.2)."""

    stage = "compile"


class RunError(CausalabError):
    """Refused while running, with weights and activations (docs/format.md §14.3)."""

    stage = "run"


class ModelError(CausalabError):
    """A model key that cannot be resolved, a revision mismatch, an unreachable hub."""

    stage = "compile"


class TrackingError(CausalabError):
    """MLflow could not be reached or an artifact URI could not be resolved."""

    stage = "run"


class UsageError(CausalabError):
    """Bad command-line use; exits with status 2."""

    stage = "usage"
