"""Composed Hydra config -> one canonical document in the FORMAT.md format.

The document is the composed config's document keys (``header``, ``model``, ``roles``,
``sites``, ``featurizers``, ``interventions``, ``steps``), interpolations resolved. Every other
top-level key is scaffolding that never enters the document or its digest: ``site``, ``data``,
``shape`` and ``method`` are the knobs the groups interpolate, ``tracking`` and ``run`` belong to the run,
``hydra`` to Hydra. Rendering does not validate; ``causalab.document.validate`` does.

>>> render(["experiment=patching", "model=tiny_llama"])["sites"]["target"]
{'component': 'block_output', 'layers': [0]}
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from causalab.errors import UsageError

CONF = Path(__file__).resolve().parent.parent / "conf"
SCAFFOLDING = ("site", "data", "shape", "method", "tracking", "run", "hydra")
ORDER = ("header", "model", "roles", "sites", "featurizers", "interventions", "steps")


def config_dir() -> str:
    """The absolute path of the shipped ``conf/`` folder."""
    return str(CONF)


def compose(overrides: Sequence[str], config_dir: str | None = None):
    """The composed config (a DictConfig, ``hydra`` key excluded) for these overrides."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    folder = str(Path(config_dir or CONF).resolve())
    try:
        with initialize_config_dir(config_dir=folder, version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise UsageError(("overrides",), _one_line(error)) from None


def document_of(config: Any) -> dict:
    """The document a composed config renders to: its non-scaffolding keys, resolved, in the
    order FORMAT §2 lists them (an unknown key is kept, for validation to refuse at its path)."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(config, DictConfig):
        try:
            data = OmegaConf.to_container(config, resolve=True)
        except OmegaConfBaseException as error:
            raise UsageError(("overrides",), _one_line(error)) from None
    else:
        data = dict(config)
    keys = [k for k in ORDER if k in data] + [k for k in data if k not in ORDER]
    return {key: data[key] for key in keys if key not in SCAFFOLDING}


def render(overrides: Sequence[str], config_dir: str | None = None) -> dict:
    """Compose ``conf/config.yaml`` with ``overrides`` and return the document it renders to."""
    return document_of(compose(overrides, config_dir))


def _one_line(error: BaseException) -> str:
    """Hydra's message folded onto one line (its hints sit on the following lines)."""
    lines = [line.strip() for line in str(error).split("Config search path")[0].splitlines()
             if line.strip()]
    return "; ".join(line for line in lines if not line.startswith("full_key")) or type(error).__name__
