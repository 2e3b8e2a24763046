"""A model directory's JSON files (``config.json``, ``tokenizer_config.json``) read or refused.

The lowest piece of the model readers: the transformers loaders (``resolve``) and the
file-only readers (``readers``) both read through it, so neither imports the other for it.
Knows nothing of transformers or of what the values mean.
"""
from __future__ import annotations

import json
from pathlib import Path

from causalab.errors import ModelError

_KEY = ("model", "key")


def read_json(path: Path) -> dict | None:
    """A model file's JSON object, None when absent; a broken one is refused at ``model.key``
    (the key named the directory), never left to transformers' own wording."""
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
    except UnicodeDecodeError:
        raise ModelError(_KEY, f"{path} is not UTF-8 text, so not a JSON file") from None
    except json.JSONDecodeError as error:
        raise ModelError(_KEY, f"{path} is not valid JSON ({error.msg} at line {error.lineno}, "
                               f"column {error.colno})") from None
    except RecursionError:
        raise ModelError(_KEY, f"{path} nests deeper than a model file does") from None
    except OSError as error:
        raise ModelError(_KEY, f"cannot read {path}: {error.strerror or error}") from None
    if not isinstance(values, dict):
        raise ModelError(_KEY, f"{path} holds a JSON {type(values).__name__}, not an object")
    return values
