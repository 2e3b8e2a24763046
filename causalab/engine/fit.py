"""The fit loop (docs/format.md §9.5): AdamW on featurizer parameters through pre-batched passes.

The compiler has already fixed every update batch, the eval pass and the objective; this
module only runs them. It never opens a trace: each pass goes through the ``run_pass``
callable the walk hands in, which returns a ``PassResult`` whose ``metrics`` map each name
to ``(values, rows)``, one value per eligible row. The model stays frozen; only the featurizers named in
``params`` are stepped. Parameters are left as the last update made them (no rollback).
The progress bar goes to stderr and only on a terminal, never with ``CAUSALAB_QUIET=1``.
On the CPU a fit runs on one intra-op thread (:data:`FIT_THREADS`), so its result does not
depend on the machine's thread count or load.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import TYPE_CHECKING, Callable

from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # the types only annotate; importing them pulls in the compiler
    from causalab.compile.plan import Fit, Plan
    from causalab.engine.assembly import PassResult
    from causalab.engine.state import WalkState

MASK_SUFFIX = ".mask"
# A CPU matmul's sums are split by thread, and a different split rounds differently; an
# update amplifies that last bit into a different rotation (rank 4 of the weekday DAS moved
# its held-out logit difference by 0.03 between 1 and 2 threads). One thread makes the split
# the same everywhere; the weekday fit was no slower on 2 busy cores.
FIT_THREADS = 1


def anneal_temperature(start: float, end: float, update: int, updates: int) -> float:
    """T at 0-based ``update`` of ``updates``: geometric from ``start`` to ``end``.

    >>> round(anneal_temperature(1.0, 0.05, 4, 20), 3)
    0.532
    """
    return start * (end / start) ** (update / max(updates - 1, 1))


def _metric_values(result: PassResult, name: str) -> torch.Tensor:
    return result.metrics[name][0]


def _mean(values: torch.Tensor, at: tuple) -> torch.Tensor:
    if values.numel() == 0:
        raise RunError(at, "no eligible row to score in this pass; a mean over zero rows does not exist")
    return values.float().mean()


def objective_loss(fit: Fit, result: PassResult, featurizers: dict) -> torch.Tensor:
    """Σ wᵢ·mean(termᵢ): a term is a metric of the pass or ``<gate>.mask`` (soft-mask mean)."""
    total = None
    for index, (weight, term) in enumerate(fit.objective):
        gate = term[: -len(MASK_SUFFIX)] if term.endswith(MASK_SUFFIX) else None
        if gate is not None and gate in fit.params and term not in result.metrics:
            value = featurizers[gate].mask_mean()
        else:
            value = _mean(_metric_values(result, term), ("steps", fit.name, "objective", index, 1))
        total = weight * value if total is None else total + weight * value
    return total


def _metrics_only(result: PassResult) -> dict:
    """A pass result cut to its metric values, detached: stored per update and per epoch
    without holding a graph or the pass's reads (logits of every row would add up)."""
    metrics = {name: (values.detach(), eligible)
               for name, (values, eligible) in result.metrics.items()}
    return {"metrics": metrics, "rows": result.rows}


def _gates(fit: Fit, featurizers: dict) -> list[str]:
    return [name for name in fit.params if featurizers[name].kind == "gate"]


def _improved(value: float, best: float | None, mode: str) -> bool:
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best if mode == "max" else value < best


class _FitProgress:
    """A rich bar over the fit's epochs on stderr; silent off a terminal or when quiet."""

    def __init__(self, name: str, epochs: int):
        self._bar = None
        self.loss, self.eval = "", ""
        if os.environ.get("CAUSALAB_QUIET") == "1" or not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(TextColumn("fit {task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[status]}"),
                             console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task(name, total=epochs, status="")
        self._bar.start()

    def update(self, *, advance: int = 0, loss: str | None = None, eval: str | None = None) -> None:
        self.loss = self.loss if loss is None else loss
        self.eval = self.eval if eval is None else eval
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, status=f"{self.loss}  {self.eval}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def loop(fit: Fit, update: Callable[[tuple], None], evaluate: Callable[[int], bool]) -> None:
    """A fit's passes in the order they run: each epoch's updates (``update(rows)``), then
    its eval; ``evaluate(epoch)`` says whether to stop (a run: its patience spent;
    ``explain --traces``: never, so a fit is listed to its last epoch)."""
    for epoch in range(fit.epochs):
        for batch in fit.batches[epoch]:
            update(batch)
        if evaluate(epoch):
            return


def _update(fit: Fit, model, featurizers: dict, state: WalkState, batch: tuple,
            context: dict) -> None:
    """One update; appends its loss and result into ``context``."""
    for name in fit.params:
        featurizers[name].training = True
    update = len(context["losses"])
    for gate, (start, end) in fit.anneal.items():
        featurizers[gate].T = anneal_temperature(start, end, update, context["updates"])
    result = context["run_pass"](model, fit.train, state, rows=batch, grad=True)
    loss = objective_loss(fit, result, featurizers)
    if loss.requires_grad:
        torch.autograd.backward(loss)
    context["optimizer"].step()
    context["optimizer"].zero_grad(set_to_none=True)
    value = float(loss.detach())
    context["losses"].append(value)
    context["passes"].append(_metrics_only(result))
    context["events"].fit_update(context["point"], context["step"], update, value)
    context["progress"].update(loss=f"update {update + 1} loss {value:.4g}")


def _stopped(fit: Fit, value: float, context: dict) -> bool:
    """Whether the watched eval has not improved for ``patience`` epochs."""
    if _improved(value, context.get("best"), fit.early_stop_mode):
        context["best"], context["stale"] = value, 0
        return False
    context["stale"] = context.get("stale", 0) + 1
    return context["stale"] >= fit.patience


def _eval_epoch(fit: Fit, model, featurizers: dict, state: WalkState,
                context: dict) -> list[float]:
    with torch.no_grad():
        result = context["run_pass"](model, fit.eval, state, grad=False)
    context["evals"].append(_metrics_only(result))
    context["last_eval"] = result
    watched = float(_mean(_metric_values(result, fit.early_stop_metric),
                          ("steps", fit.name, "early_stop", "metric")))
    return [watched] + [featurizers[gate].kept() for gate in _gates(fit, featurizers)]


@contextlib.contextmanager
def _fixed_threads(count: int = FIT_THREADS):
    """torch's intra-op thread count held at ``count`` inside, restored after (CPU kernels
    only: an accelerator's are untouched)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_fit(fit: Fit, model, featurizers: dict, state: WalkState, *, run_pass: Callable, events,
            point: Plan | None = None, step: str | None = None) -> dict:
    """Run a fit step and return its results.

    ``featurizers`` maps names to live featurizer objects (shared with the walk);
    ``run_pass(model, pass_, state, rows=None, grad=False)`` runs one pass. Returns
    ``{"train/loss": (updates,), "train/eval": (epochs_run, 1 + gates), "updates": [...],
    "evals": [...], "eval": <last eval pass result>}``; ``updates`` and ``evals`` hold each
    inner pass's metrics (detached), ``eval`` the whole last eval result (for eval saves).
    ``step`` names the step in events (default ``fit.name``; a list entry's ``<step>/<entry>``).
    """
    params = [p for name in fit.params for p in featurizers[name].parameters()]
    for parameter in params:
        parameter.requires_grad_(True)
    context = {
        "optimizer": torch.optim.AdamW(params, lr=fit.lr, weight_decay=fit.weight_decay),
        "updates": sum(len(epoch) for epoch in fit.batches[: fit.epochs]),
        "run_pass": run_pass, "events": events, "point": point, "step": step or fit.name,
        "losses": [], "passes": [], "evals": [],
        "progress": _FitProgress(fit.name, fit.epochs),
    }
    rows: list[list[float]] = []

    def evaluate(epoch: int) -> bool:
        for name in fit.params:
            featurizers[name].training = False
        rows.append(_eval_epoch(fit, model, featurizers, state, context))
        row = rows[-1]
        events.fit_epoch(point, context["step"], epoch, row[0], row[1] if len(row) > 1 else None)
        context["progress"].update(advance=1, eval=f"eval {fit.early_stop_metric} {row[0]:.4g}")
        return _stopped(fit, row[0], context)
    try:
        with _fixed_threads():
            loop(fit, lambda batch: _update(fit, model, featurizers, state, batch, context),
                 evaluate)
    finally:
        context["progress"].close()
        columns = 1 + len(_gates(fit, featurizers))
        for name in fit.params:
            featurizers[name].training = False
        for parameter in params:
            parameter.requires_grad_(False)
    return {
        "train/loss": torch.tensor(context["losses"], dtype=torch.float32),
        "train/eval": torch.tensor(rows, dtype=torch.float32).reshape(len(rows), columns),
        "updates": context["passes"],
        "evals": context["evals"],
        "eval": context.get("last_eval"),
    }
