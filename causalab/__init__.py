"""causalab: declarative causal interventions on transformer language models, tracked in MLflow.

A document (JSON, or a composed Hydra config) says which activations to read, which to
overwrite and how, and which metrics to score. causalab checks and compiles it without
loading weights, runs it on nnterp, and logs every point to MLflow.

Importing this package imports nothing heavy: each public name is loaded on first use, so
``import causalab.document`` never pulls in torch.

>>> import causalab
>>> plan = causalab.compile_document(causalab.load_json("documents/v2/patching.json"),
...                                  data_root="documents/data")  # doctest: +SKIP
>>> print(causalab.explain(plan))  # doctest: +SKIP
>>> result = causalab.run("documents/v2/patching.json")  # doctest: +SKIP
>>> result.table("iia.json")  # doctest: +SKIP
"""
from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_PUBLIC = {
    "load_json": "causalab.document",
    "lower": "causalab.document",
    "validate": "causalab.document",
    "digest": "causalab.document",
    "Document": "causalab.document",
    "compile_document": "causalab.compile",
    "compile_point": "causalab.compile",
    "explain": "causalab.compile",
    "run_document": "causalab.pipeline",
    "run": "causalab.results",
    "Result": "causalab.results",
    "read_table": "causalab.results",
    "search_points": "causalab.results",
    "resolve_model": "causalab.models",
    "Events": "causalab.engine.events",
    "TrackingEvents": "causalab.tracking",
    "fetch": "causalab.tracking",
    "list_runs": "causalab.results.listing",
    "render": "causalab.hydra.rendering",
    "CausalabError": "causalab.errors",
    "DocumentError": "causalab.errors",
    "CompileError": "causalab.errors",
    "RunError": "causalab.errors",
}
_RENAMED = {"resolve_model": "resolve"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'causalab' has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    return getattr(module, _RENAMED.get(name, name))


def __dir__() -> list[str]:
    return __all__
