"""Built-in checkpoints and model-key resolution: ``resolve``, ``load_tokenizer``, ``load_config``.

Built-ins (``causalab:tiny-<family>``, ``causalab:weekday-<family>``) are ordinary Hugging Face
directories made or shipped here; nothing touches the network. Importing this package imports
neither torch nor transformers; building a model does.
"""
from causalab.models.registry import BUILTINS, SCHEME
from causalab.models.resolve import (Resolved, load_config, load_tokenizer, models_home, resolve,
                                     verify_weights)

__all__ = ["BUILTINS", "SCHEME", "Resolved", "load_config", "load_tokenizer", "models_home",
           "resolve", "verify_weights"]
