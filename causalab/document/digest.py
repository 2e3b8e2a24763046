"""A point's identity (``produced_by``): SHA-256 of the point without ``header`` (docs/format.md §2).

Pure stdlib. The point is the lowered document as a dict; the digest never sees the run's
settings (device, batch size, output directory), which are not part of the document.
"""
from __future__ import annotations

import hashlib
import json


def canonical(point_doc: dict) -> str:
    """Compact JSON, keys sorted, no whitespace, ``header`` removed."""
    body = {key: value for key, value in point_doc.items() if key != "header"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def digest(point_doc: dict) -> str:
    """The 64-hex-digit SHA-256 digest of one point.

    >>> digest({"header": {"description": "x"}, "steps": {}}) == digest({"steps": {}})
    True
    """
    return hashlib.sha256(canonical(point_doc).encode("utf-8")).hexdigest()

