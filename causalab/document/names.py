"""Names that become file or directory names or MLflow keys: one safe path segment each, or refused.

Every name an author gives a node (a role, site, featurizer, intervention, step, read, write,
model, metric, output), a sweep axis's ``as``, a sweep point's label and each part of a save's
``file_path`` names a directory or file under ``--out`` or a part of an MLflow key (``iia/test``,
a swept coordinate ``sites.<t>.layers``; MLflow refuses a key that a path would resolve to
another, ``../../evil/test``). A safe segment is non-empty, is not ``.`` or ``..``, holds no
``/``, ``\\`` or control character, and is at most ``MAX_SEGMENT_BYTES`` long in UTF-8 (the
common file-system limit), so no name in a document can leave ``--out``, fail the operating
system or be refused by the store after its point has run. A save path holds no shell form
(``~``, ``$HOME``, a backtick): nothing expands one, so ``~/x.json`` would be a folder named
``~`` under ``--out``. Pure string rules: this module never touches a disk.

>>> unsafe_segment("train") is None
True
>>> unsafe_segment("../x")
"holds '/'"
"""
from __future__ import annotations

import re

MAX_SEGMENT_BYTES = 255
_CONTROL = {chr(c) for c in range(32)} | {"\x7f"}


def unsafe_segment(name: str) -> str | None:
    """Why ``name`` is not one safe path segment, or None when it is."""
    if name in ("", ".", ".."):
        return "is empty" if not name else f"is {name!r}"
    for bad in ("/", "\\"):
        if bad in name:
            return f"holds {bad!r}"
    if any(ch in _CONTROL for ch in name):
        return "holds a control character"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_SEGMENT_BYTES:
        return f"is {size} bytes long, more than {MAX_SEGMENT_BYTES}"
    return None


def shell_form(path: str) -> str | None:
    """Why ``path`` holds a form only a shell expands (a leading ``~`` of a part, ``$``, a
    backtick), or None. Nothing in causalab expands one, so it would be taken literally.

    >>> shell_form("~/x.json")
    "starts a part with '~' (a shell's home folder)"
    >>> shell_form("sub/x.json") is None
    True
    """
    if any(part.startswith("~") for part in path.split("/")):
        return "starts a part with '~' (a shell's home folder)"
    for mark, what in (("$", "a shell variable"), ("`", "a shell command")):
        if mark in path:
            return f"holds {mark!r} ({what})"
    return None


def unreadable_name(name: str) -> str | None:
    """Why ``name`` cannot be shown as a name (in explain, MLflow, a table), or None.

    A name is non-empty, printable (no newline, NUL or other control character, which would
    forge lines in explain's output) and has no leading or trailing space.

    >>> unreadable_name("  ")
    'is blank'
    >>> unreadable_name("a\\nb")
    'holds a control or other unprintable character'
    """
    if not name.strip():
        return "is blank" if name else "is empty"
    if not name.isprintable():
        return "holds a control or other unprintable character"
    if name != name.strip():
        return "has a leading or trailing space"
    return None


# MLflow's limits and key characters (mlflow.utils.validation, checked against it in the
# tests), here so that the document room names keys as MLflow will without importing it.
MAX_ENTITY_KEY_LENGTH = 250
_UNSAFE_KEY = re.compile(r"[^\w\-. /:]")


def mlflow_key(key: str) -> str:
    """A key MLflow accepts: its character set, its length. ``s🔥`` and ``s💧`` both become
    ``s_``, so the document refuses two names that would.

    >>> mlflow_key("iia/s🔥")
    'iia/s_'
    """
    return _UNSAFE_KEY.sub("_", str(key))[:MAX_ENTITY_KEY_LENGTH]


def sanitised_label(label: str) -> str:
    """A sweep label as a directory name: ``/``, ``\\`` and control characters become ``_``."""
    return "".join("_" if ch in _CONTROL or ch in "/\\" else ch for ch in label)


RUNS_SCHEME = "runs:/"
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def is_uri(text: str) -> bool:
    """A string with a scheme (``runs:/…``, ``http://…``) rather than a local path."""
    return _URI.match(text) is not None


def runs_uri_parts(uri: str, *, whole_run: bool = False) -> tuple[str, str]:
    """``runs:/<run_id>/<path>`` -> (run_id, path), every part one safe segment.

    Parsed before anything touches a disk: the parts name folders of the artifact cache.
    ``whole_run`` allows an empty path (``runs:/<run_id>``). Raises ValueError saying what
    is wrong.

    >>> runs_uri_parts("runs:/0a1b/rot.safetensors")
    ('0a1b', 'rot.safetensors')
    """
    if not uri.startswith(RUNS_SCHEME):
        scheme = uri.split(":", 1)[0] if is_uri(uri) else "no scheme"
        raise ValueError(f"{uri!r} is not a runs:/<run_id>/<path> URI ({scheme}); a bundle is "
                         "a local path or a tracked artifact")
    run_id, _, path = uri[len(RUNS_SCHEME):].lstrip("/").partition("/")
    for part in [run_id] + (path.split("/") if path or not whole_run else []):
        why = unsafe_segment(part)
        if why is not None:
            raise ValueError(f"{uri!r}: part {part!r} {why}; a runs:/ URI is "
                             "runs:/<run_id>/<path> of safe names")
    return run_id, path
