"""The fidelity receipt: proof that the engine's no-op forward is the plain model.

Before a run's points, the first pass of the first point is run through the engine again with
its writes taken out (the model's final logits read at the last prompt token, on its least
and its most padded row: :func:`receipt_rows`) and compared with a plain ``transformers``
forward of the same rows (the same ids, attention mask and position ids, on nnterp's
underlying model). The largest absolute logit difference, the dtype and the library
versions are the receipt (docs/platform.md §5 "Fidelity receipt"); a receipt above
:data:`TOLERANCE` for the dtype refuses the run, naming it. Two rows at most, two forwards:
a few milliseconds beside any step; the plain one is kept for a rerun on the same weights
and rows in one process (:func:`_plain_of`). In fp32, where the run's first points fill
un-intervened values on the receipt's batch through the last block anyway, the engine's side
rides that fill's trace over every row (``planner.receipt_rides``) instead of a trace of
its own; a batch's other rows move a logit by float rounding at most, far below fp32's
tolerance.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import weakref
from importlib import metadata
from typing import TYPE_CHECKING, NamedTuple

from causalab.compile.addresses import resolve_address
from causalab.compile.plan import Observe, Pass, Plan, PositionSpec, PromptBatch
from causalab.document.vocab import IDENTITY
from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only: nnterp takes ~6 s to import
    from nnterp import StandardizedTransformer
    from transformers import PretrainedConfig

    from causalab.engine.assembly import PassResult

# The most a no-op forward may move a logit, by the model's dtype: fp32 leaves room for a
# fused kernel's reordered sums (a built-in's receipt is 0 or ~1e-6), bf16 for one step of its
# 8-bit mantissa at a logit of magnitude ~32.
TOLERANCE = {"fp32": 1e-4, "bf16": 0.25}
LIBRARIES = ("torch", "transformers", "nnsight", "nnterp", "causalab")


def first_pass(plan: Plan | Observe) -> Pass | None:
    """The first observed pass with a metric, depth first (a sweep's first point first)."""
    if isinstance(plan, Observe):
        return plan.pass_ if plan.pass_.metrics else None
    for child in getattr(plan, "children", ()) or ():
        if isinstance(child, (Plan, Observe)):
            found = first_pass(child)
            if found is not None:
                return found
    return None


def no_op_pass(pass_: Pass, config: PretrainedConfig) -> tuple[Pass, str, str]:
    """``pass_`` as one forward with no write that reads the model's final logits (the
    ``logits`` component, whatever the metric reads: a logit lens reads a block) at the last
    prompt token, on its first metric's input: ``(pass, read name, input role)``."""
    metric = pass_.metrics[0]
    forward = next(f for f in pass_.forwards if any(r.name == metric.of for r in f.reads))
    read = next(r for r in forward.reads if r.name == metric.of)
    logits = resolve_address("logits", None, None, None, config, None, ("model",))
    last = dataclasses.replace(read, address=logits, site="logits", featurizer=IDENTITY,
                               view="raw", pos=PositionSpec(index=-1, width=1))
    forward = dataclasses.replace(forward, writes=(), reads=(last,), decode=0,
                                  taps=(("read", read.name),))
    return dataclasses.replace(pass_, forwards=(forward,), metrics=()), read.name, forward.input


class NoOp(NamedTuple):
    """The receipt's pass (over its rows alone), the read it takes, the input role it reads,
    its rows' places in that role's batch, and the same pass over every row of the batch
    (``every``: what it runs when it rides the run's first un-intervened fill)."""

    pass_: Pass
    name: str
    role: str
    rows: tuple[int, ...]
    every: Pass


def receipt_rows(batch: PromptBatch) -> tuple[int, ...]:
    """The rows the receipt reads: the first with the least left padding and the first with
    the most, so both an unpadded row and the mask and position ids of a padded one are
    checked (one row when they are the same)."""
    padding = [mask.count(0) for mask in batch.attention_mask]
    return tuple(sorted({padding.index(min(padding)), padding.index(max(padding))}))


def rows_of(pass_: Pass, role: str, rows: tuple[int, ...]) -> Pass:
    """``pass_`` over ``rows`` of ``role`` alone: an un-intervened read fills every row of
    its batch (for later points), and the receipt's must cost only its own."""
    def pick(values: tuple) -> tuple:
        return tuple(values[row] for row in rows)

    batch = pass_.inputs[role]
    batch = dataclasses.replace(
        batch, prompts=pick(batch.prompts), input_ids=pick(batch.input_ids),
        attention_mask=pick(batch.attention_mask),
        anchors={name: pick(values) for name, values in batch.anchors.items()})
    return dataclasses.replace(pass_, rows=len(rows), example_ids=pick(pass_.example_ids),
                               inputs={role: batch})


def receipt_pass(plan: Plan, config: PretrainedConfig) -> NoOp | None:
    """The pass the receipt runs for ``plan`` (None: no observed metric): one function, so
    a run and ``explain --traces`` open the same trace."""
    pass_ = first_pass(plan)
    if pass_ is None:
        return None
    no_op, name, role = no_op_pass(pass_, config)
    rows = receipt_rows(no_op.inputs[role])
    every = dataclasses.replace(no_op, inputs={role: no_op.inputs[role]})
    return NoOp(rows_of(no_op, role, rows), name, role, rows, every)


def plain_logits(model: StandardizedTransformer, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The last token's logits of a plain ``transformers`` forward of nnterp's model."""
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        output = model._model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                              use_cache=False)
    return output.logits[:, -1]


# The plain side of recent receipts, per loaded model: the same weights on the same rows give
# the same plain forward, so a process that runs a document again (a multirun's jobs, a
# notebook's reruns) computes it once; the engine's side is traced on every run.
_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PLAIN_KEPT = 4


def _weights_state(module: torch.nn.Module) -> tuple:
    """Where each parameter and buffer lives and torch's count of its in-place changes: a
    weight replaced or written in place gives another state."""
    return tuple((t.data_ptr(), t._version)
                 for t in itertools.chain(module.parameters(), module.buffers()))


def _plain_of(model: StandardizedTransformer, batch: PromptBatch) -> torch.Tensor:
    """:func:`plain_logits` of ``batch``'s rows, computed once per weights state and rows."""
    key = (_weights_state(model._model), batch.input_ids, batch.attention_mask)
    found = _PLAIN.setdefault(model._model, {})
    if key not in found:
        device = model._model.get_input_embeddings().weight.device
        ids = torch.tensor(batch.input_ids, dtype=torch.long, device=device)
        mask = torch.tensor(batch.attention_mask, dtype=torch.long, device=device)
        if len(found) >= _PLAIN_KEPT:
            found.pop(next(iter(found)))
        found[key] = plain_logits(model, ids, mask)
    return found[key]


@functools.cache
def _installed() -> tuple[tuple[str, str], ...]:
    """Each library's installed version, read once a process (reading a package's metadata
    parses its files: milliseconds a run)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return tuple(found.items())


def versions() -> dict[str, str]:
    return dict(_installed())


def check(model: StandardizedTransformer, found: NoOp, result: PassResult,
          dtype: str) -> dict:
    """The receipt of the engine's no-op pass ``result`` against a plain forward of its rows."""
    rows = found.rows
    engine = result.reads[found.name]
    engine = engine.reshape(engine.shape[0], -1).float()
    if engine.shape[0] != len(rows):  # the pass over every row: a fill it rode
        engine = engine[list(rows)]
    plain = _plain_of(model, found.pass_.inputs[found.role]).float().to(engine.device)
    found = float((engine - plain).abs().max())
    limit = TOLERANCE.get(dtype, TOLERANCE["bf16"])
    if not found <= limit:
        raise RunError(("model",), f"fidelity receipt {found:.3g}: the engine's forward with no "
                                   f"write differs from a plain transformers forward by more "
                                   f"than {limit:g}, the tolerance for {dtype}")
    return {"max_abs_dlogit": found, "rows": len(rows), "dtype": dtype, "versions": versions()}
