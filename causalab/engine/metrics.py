"""Metric kinds: one number per row from vocabulary-shaped logits, and the table rows they make.

Every kind is ``fn(logits (rows, vocab), *ids (rows,)) -> (rows,)`` with its id arguments in
the column order of ``causalab.document.vocab.METRIC_KINDS``; each stays differentiable
(``match`` aside, which is a step function) so a fit can minimise it. Eligibility is the
compiler's column half intersected with the read's position half, applied by indexing:
there are no masks and no NaN-aware means here. Nothing here knows a tokenizer or a model.
"""
from __future__ import annotations

import math
from typing import Sequence

from causalab.compile.plan import MetricOp
from causalab.errors import RunError
from causalab.lazy import torch


# The reason a table gives a row that was placed and had every column, yet whose logits came
# back NaN or Inf (docs/format.md §7.9).
NON_FINITE = "non_finite"


def _wide(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits are scored in float32; a softmax over a vocabulary needs it."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _pick(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return logits.gather(-1, ids.to(logits.device, torch.long)[:, None])[:, 0]


def match(logits: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """1.0 where the argmax is the expected token, else 0.0."""
    logits = _wide(logits)
    return (logits.argmax(-1) == expected.to(logits.device)).to(logits.dtype)


def logit_diff(logits: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``logit[a] − logit[b]``."""
    logits = _wide(logits)
    return _pick(logits, a) - _pick(logits, b)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``−log softmax(logits)[target]``, in nats."""
    return -_pick(torch.log_softmax(_wide(logits), dim=-1), target)


def token_logit(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The raw logit of the token."""
    return _pick(_wide(logits), token)


def token_prob(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``softmax(logits)[token]``."""
    return torch.exp(_pick(torch.log_softmax(_wide(logits), dim=-1), token))


def interchange(logits: torch.Tensor, base_of: torch.Tensor, counterfactual_of: torch.Tensor,
                a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(LD(logits) − LD(base_of)) / mean(LD(counterfactual_of) − LD(base_of))`` per row,
    ``LD = logit[a] − logit[b]``: the patched logit difference's move, in units of the
    model's own clean gap between the base and the counterfactual prompt (the mean over the
    rows scored, so a model whose gap is small is measured against its own)."""
    clean = logit_diff(base_of, a, b)
    gap = (logit_diff(counterfactual_of, a, b) - clean).mean()
    return (logit_diff(logits, a, b) - clean) / gap


METRICS = {
    "match": match,
    "logit_diff": logit_diff,
    "cross_entropy": cross_entropy,
    "token_logit": token_logit,
    "token_prob": token_prob,
    "interchange": interchange,
}


def score(metric: MetricOp, logits_rows: torch.Tensor, placed_rows: Sequence[int],
          further: Sequence[tuple[torch.Tensor, Sequence[int]]] = ()
          ) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Score the eligible rows: ``(values (eligible,), eligible row indices)``.

    ``logits_rows`` is the metric's read, ``(n, 1, vocab)`` rectangular or ``(n, vocab)``
    flat, and ``placed_rows[i]`` is the pass row its entry ``i`` belongs to (the rows whose
    window is non-empty, in the read's order). The scored rows are those placed rows that
    also pass the compiler's column half, in read order. ``further`` holds the kind's further
    reads (``metric.reads``), each ``(logits_rows, placed_rows)`` like the first; a row is
    scored only where every one of them placed it too. Values keep their graph.
    """
    logits = logits_rows[:, 0] if logits_rows.dim() == 3 else logits_rows
    if logits_rows.dim() == 3 and logits_rows.shape[1] != 1:
        raise RunError((metric.name,), f"read {metric.of!r} is {logits_rows.shape[1]} positions wide")
    if logits.shape[0] != len(placed_rows):
        raise RunError((metric.name,), f"{logits.shape[0]} logits rows for {len(placed_rows)} placed rows")
    column_half = set(metric.eligible)
    for _, placed in further:
        column_half &= {int(row) for row in placed}
    local = [i for i, row in enumerate(placed_rows) if int(row) in column_half]
    if not local:
        raise RunError((metric.name,), "no row passes both eligibility halves (columns and positions)")
    rows = tuple(int(placed_rows[i]) for i in local)
    ids = [torch.tensor([column[row] for row in rows], dtype=torch.long, device=logits.device)
           for column in metric.token_ids]
    index = torch.tensor(local, dtype=torch.long, device=logits.device)
    picked = logits.index_select(0, index)
    others = [_rows_of(more, placed, rows) for more, placed in further]
    values = METRICS[metric.kind](picked, *others, *ids)
    return _finite(metric, values, picked, rows)


def _rows_of(logits_rows: torch.Tensor, placed: Sequence[int], rows: tuple[int, ...]
             ) -> torch.Tensor:
    """A further read's logits ``(len(rows), vocab)`` at ``rows``, from its own placed order."""
    logits = logits_rows[:, 0] if logits_rows.dim() == 3 else logits_rows
    at = {int(row): i for i, row in enumerate(placed)}
    index = torch.tensor([at[row] for row in rows], dtype=torch.long, device=logits.device)
    return logits.index_select(0, index)


def _finite(metric: MetricOp, values: torch.Tensor, logits: torch.Tensor, rows: tuple[int, ...]
            ) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The rows whose logits hold no NaN and whose value is finite: a write that overflowed
    the dtype leaves rows no number describes, so they are excluded (``NON_FINITE`` in the
    table), never scored as null or averaged into a NaN; none left is R3."""
    good = torch.isfinite(values) & ~torch.isnan(logits).any(-1)
    if bool(good.all()):
        return values, rows
    keep = good.nonzero()[:, 0]
    if keep.numel() == 0:
        raise RunError((metric.name,), f"every eligible row's {metric.of!r} is NaN or Inf, so "
                       "no row can be scored: a write overflowed the model's dtype (R3)")
    return values.index_select(0, keep), tuple(rows[i] for i in keep.tolist())


def metric_table(metric: MetricOp, values: torch.Tensor | Sequence[float], eligible: Sequence[int],
                 positions: Sequence[Sequence[int]] | None, reasons: Sequence[str] | None,
                 example_ids: Sequence[str], produced_by: str, *, name: str | None = None
                 ) -> list[dict]:
    """The on-disk table (docs/format.md §13): one object per row of the step, excluded ones too.

    ``values[j]`` belongs to row ``eligible[j]``. ``positions`` is each row's window of the
    metric's read, or None when the pass had no dynamic position; ``reasons`` each row's
    position reason (None: every row placed); a placed, filled row left unscored is
    ``NON_FINITE``. ``name`` overrides the saved value's name.
    """
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().tolist()
    by_row = {int(row): value for row, value in zip(eligible, values) if math.isfinite(value)}
    columns = set(metric.eligible)
    table = []
    for row, example_id in enumerate(example_ids):
        value = by_row.get(row)
        reason = "" if reasons is None else reasons[row]
        if value is None and not reason and row in columns:
            reason = NON_FINITE  # placed and filled, and still no number: see _finite
        table.append({
            "example_id": str(example_id),
            "metric": metric.name if name is None else name,
            "value": None if value is None else float(value),
            "eligible": value is not None,
            "positions": None if positions is None else [int(p) for p in positions[row]],
            "reason": reason,
            "unit": metric.unit,
            "estimand_version": metric.estimand_version,
            "produced_by": produced_by,
        })
    return table
