"""transformers' own progress bars off while a checkpoint is read or written.

Loading a model, writing a built-in's shards and dequantizing a GGUF file each draw a bar of
their own ("Loading weights", "Writing model shards") that no flag of causalab turns off, in
logs, in tests and under ``CAUSALAB_QUIET``. A run shows its own progress (``causalab.progress``).
"""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' bars off inside, put back as they were after."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
