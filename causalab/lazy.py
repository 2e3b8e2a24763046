"""``torch``, imported where it is first used rather than where the engine's modules are.

``causalab explain --traces`` walks the run's own engine modules with a dry runner that opens
no trace and touches no tensor; importing torch for it would cost seconds (most of the verb's
time). The engine says ``from causalab.lazy import torch`` and uses it as torch; the first
attribute read imports the real module, after which reads go straight to it.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any


class LazyModule(ModuleType):
    """A module imported at its first attribute read; its attributes are the real module's."""

    def __getattr__(self, name: str) -> Any:
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)  # later reads find them here, without this call
        return getattr(module, name)


if TYPE_CHECKING:
    import torch as torch
else:
    torch = LazyModule("torch")
