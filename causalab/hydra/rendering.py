"""Composed Hydra config -> one canonical document in the format of docs/format.md.

The document is the composed config's document keys (``header``, ``model``, ``roles``,
``sites``, ``featurizers``, ``interventions``, ``steps``), interpolations resolved. Every other
top-level key is scaffolding that never enters the document or its digest: ``site``, ``data``,
``shape`` and ``method`` are the knobs the groups interpolate, ``tracking`` and ``run`` belong to the run,
``hydra`` to Hydra. Rendering does not validate; ``causalab.document.validate`` does.

Two things the groups lean on are done here, once. The data group offers its prompt roles and
``conf/config.yaml`` puts them all in ``roles``; the document keeps the roles its steps' rows
name, so an experiment on the base prompts alone never restates them. The resolver
``${causalab.each:n}`` gives ``[[0], [1], … [n-1]]``, a sweep over every layer or head from
the model's counts; it is registered when a config is composed or rendered, never at import.

>>> render(["experiment=patching", "model=tiny_llama"])["sites"]["target"]
{'component': 'block_output', 'layers': [0]}
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from causalab.errors import UsageError

CONF = Path(__file__).resolve().parents[2] / "conf"
SCAFFOLDING = ("site", "data", "shape", "method", "tracking", "run", "hydra")
ORDER = ("header", "model", "roles", "sites", "featurizers", "interventions", "steps")


def config_dir() -> str:
    """The absolute path of the shipped ``conf/`` folder."""
    return str(CONF)


def register_resolvers() -> None:
    """``causalab.each``: the index lists a document sweep over layers or heads takes."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("causalab.each", _each, replace=True)


def _each(count: Any) -> list[list[int]]:
    return [[index] for index in range(int(count))]


def unknown_choice(overrides: Sequence[str], config_dir: str | None = None) -> str | None:
    """``experiment=dass: conf/experiment/ has no option 'dass'; nearest: das, dbm, dass…``:
    the first override that picks an option its config group does not have (one value of a
    ``-m`` sweep's ``a,b`` counts too), in one line with the nearest names; None when every
    option named is there. Groups under ``hydra/`` (whose options plugins add) and overrides
    this cannot read are left to Hydra."""
    import difflib

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    root = Path(config_dir or CONF)
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o])
    except HydraException:
        return None
    for override in parsed:
        group = override.key_or_group
        folder = root / group
        if override.is_delete() or group.startswith("hydra") or not folder.is_dir():
            continue
        if override.is_sweep_override():
            if not override.is_choice_sweep():
                continue
            values = list(override.sweep_string_iterator())
        else:
            values = [override.get_value_element_as_str()]
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        for value in values:
            if value in options or value == "null":
                continue
            nearest = difflib.get_close_matches(value, options, n=3, cutoff=0.5)
            shown = (f"nearest: {', '.join(nearest)}" if nearest else
                     f"its options: {', '.join(options[:8])}" +
                     (f", … ({len(options)})" if len(options) > 8 else ""))
            where = folder.relative_to(root.parent) if root.parent in folder.parents else folder
            return f"{group}={value}: {where}/ has no option {value!r}; {shown}"
    return None


def compose(overrides: Sequence[str], config_dir: str | None = None):
    """The composed config (a DictConfig, ``hydra`` key excluded) for these overrides."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    unknown = unknown_choice(overrides, config_dir)
    if unknown is not None:
        raise UsageError(("overrides",), unknown)
    register_resolvers()
    folder = str(Path(config_dir or CONF).resolve())
    try:
        with initialize_config_dir(config_dir=folder, version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise UsageError(("overrides",), _one_line(error)) from None


def document_of(config: Any) -> dict:
    """The document a composed config renders to: its non-scaffolding keys, resolved, in the
    order docs/format.md §2 lists them (an unknown key is kept, for validation to refuse at its path)."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(config, DictConfig):
        register_resolvers()
        try:
            data = OmegaConf.to_container(config, resolve=True)
        except OmegaConfBaseException as error:
            raise UsageError(("overrides",), _one_line(error)) from None
    else:
        data = dict(config)
    keys = [k for k in ORDER if k in data] + [k for k in data if k not in ORDER]
    document = {key: data[key] for key in keys if key not in SCAFFOLDING}
    used = _roles_read(document.get("steps"))
    if used is not None and isinstance(document.get("roles"), dict):
        document["roles"] = {k: v for k, v in document["roles"].items() if k in used}
    return document


def _roles_read(steps: Any) -> set[str] | None:
    """Every role a step's (or its eval's) rows name; None when that is not plain to see."""
    if not isinstance(steps, dict):
        return None
    used: set[str] = set()
    for step in steps.values():
        if not isinstance(step, dict):
            return None
        for rows in (step.get("rows"), (step.get("eval") or {}).get("rows")):
            if rows is None:
                continue
            if not isinstance(rows, dict) or "sweep" in rows:
                return None
            used.update(rows)
    return used


def render(overrides: Sequence[str], config_dir: str | None = None) -> dict:
    """Compose ``conf/config.yaml`` with ``overrides`` and return the document it renders to."""
    return document_of(compose(overrides, config_dir))


def _one_line(error: BaseException) -> str:
    """Hydra's message folded onto one line (its hints sit on the following lines)."""
    lines = [line.strip() for line in str(error).split("Config search path")[0].splitlines()
             if line.strip()]
    return "; ".join(line for line in lines if not line.startswith("full_key")) or type(error).__name__
