"""Cache entries appear whole or not at all: built in a staging folder, then one rename.

A first use killed half-way leaves only a dot-named staging folder, which no lookup trusts.
Knows nothing of what is built inside.
"""
from __future__ import annotations

import os
from pathlib import Path


def publish(staging: Path, final: Path, marker: str) -> None:
    """Rename a finished ``staging`` folder to ``final``. A concurrent first use that got there
    first (``final/marker`` present) wins quietly; any other failure is raised."""
    try:
        os.rename(staging, final)
    except OSError:
        if not (final / marker).is_file():
            raise
