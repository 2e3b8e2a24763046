"""A pass's result: its reads in their featurizers' spaces, layouts, metrics and positions.

Made from the raw reads the walk gathered and the windows resolved for the pass; it never
opens a trace. Steps publish and save from it, fits score it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from causalab.compile.plan import Pass, ReadOp
from causalab.engine import outputs as output_rules
from causalab.engine import windows as window_rules
from causalab.engine.metrics import score
from causalab.engine.seam import Window, express


@dataclass(frozen=True)
class PassResult(Mapping):
    """What one pass produced over its run rows.

    ``reads``: name -> value in its featurizer's space, ``(rows, w, width)`` or flat
    ``(total, width)``; ``layouts``: name -> :class:`Window`; ``metrics``: name -> (values,
    eligible pass-row indices); ``positions``: op -> provenance; ``rows``: the run rows;
    ``resolved``: the pass's windows over all its rows (``windows.resolve_pass``);
    ``generated``: ``"<model>[.<input>].generated"`` -> int64 ``(rows, decode)``.
    It reads as a mapping too (``result["reads"]``): the plan's ``results`` is filled from it.
    """

    reads: dict
    layouts: dict
    metrics: dict
    positions: dict
    rows: tuple
    resolved: dict
    generated: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        if name not in _FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)


_FIELDS = tuple(f.name for f in fields(PassResult))


def result_of(pass_: Pass, run_rows: tuple, resolved: dict, values: dict,
              generated: dict | None = None) -> PassResult:
    """The pass's result from its featurized reads (``values``: name -> ``Published``)."""
    reads = {name: published.value for name, published in values.items()}
    layouts = {}
    for forward in pass_.forwards:
        for read in forward.reads:
            windows, _ = resolved[("read", read.name, read.input)]
            if read.pos.frame == "generated":
                layouts[read.name] = Window.from_windows([windows[r] for r in run_rows],
                                                         ragged=read.pos.ragged)
            else:
                layouts[read.name] = window_rules.layout(windows, run_rows, read.pos.ragged)
    metrics = {}
    for metric in pass_.metrics:
        windows, _ = resolved[("read", metric.of, metric.input)]
        placed = [r for r in run_rows if windows[r]]
        metrics[metric.name] = score(metric, reads[metric.of], placed)
    positions = {key[1]: entry for key, entry in resolved.items() if key[0] == "provenance"}
    return PassResult(reads, layouts, metrics, positions, run_rows, resolved, generated or {})


def featurized(raw: output_rules.Published, read: ReadOp, state: Any) -> output_rules.Published:
    """A read's raw gathered value expressed in its featurizer's space (float32)."""
    if read.address.component == "input_ids" or read.view == "logits":
        return raw
    featurizer = state.featurizers.get(read.featurizer) if read.featurizer != "identity" else None
    return output_rules.Published(express(featurizer, raw.value), raw.counts, raw.rows, "none")
