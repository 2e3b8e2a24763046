"""Published outputs: a read reduced (``none``, ``mean``, ``pca``, ``sae``) for the steps after it.

A published value lives in the walk's state; this module only shapes it. It never writes
files or knows a step's name: refusals carry the output's name and the walk places them.
An unreduced value keeps its per-row layout so a later batched step slices it by its own
rows; a mean or a basis has no row axis and every batch shares it whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from causalab.compile.plan import OutputOp
from causalab.errors import RunError
from causalab.lazy import torch

if TYPE_CHECKING:  # annotations only
    from causalab.engine.seam import Window


@dataclass(frozen=True)
class Published:
    """A value a step published. ``rows`` and ``counts`` describe an unreduced read:
    ``rows`` is its row count; ``counts`` each row's window width when it is flat
    ``(total, width)`` and None when it is rectangular ``(rows, w, width)``."""

    value: torch.Tensor | dict[str, torch.Tensor]  # ``sae``: {W_enc, W_dec, b_enc, b_dec}
    counts: tuple[int, ...] | None
    rows: int | None
    reduce: str

    def slice_rows(self, row_indices: Sequence[int]) -> "Published":
        """The rows ``row_indices`` (any order, e.g. a shuffled fit batch) of an unreduced
        value; a reduced value is returned whole.

        >>> p = Published(torch.arange(6.).reshape(3, 1, 2), None, 3, "none")
        >>> p.slice_rows([2, 0]).value[:, 0, 0].tolist()
        [4.0, 0.0]
        """
        if self.reduce != "none":
            return self
        rows = [int(r) for r in row_indices]
        device = self.value.device
        if self.counts is None:
            index = torch.tensor(rows, dtype=torch.long, device=device)
            return Published(self.value.index_select(0, index), None, len(rows), "none")
        starts = [0]
        for count in self.counts:
            starts.append(starts[-1] + count)
        flat = [i for r in rows for i in range(starts[r], starts[r + 1])]
        index = torch.tensor(flat, dtype=torch.long, device=device)
        return Published(self.value.index_select(0, index),
                         tuple(self.counts[r] for r in rows), len(rows), "none")


def _basis(value: torch.Tensor, output: OutputOp) -> torch.Tensor:
    """Top-k right singular vectors of the centred ``(-1, d)`` vectors, as ``(d, k)``.

    Each column's sign is fixed so its largest-magnitude entry is positive, making the
    basis a function of the data rather than of the SVD routine.
    """
    k = int(output.k or 0)
    vectors = value.reshape(-1, value.shape[-1]).float()
    n, d = vectors.shape
    if n < k or d < k:
        raise RunError((output.name, "k"), f"pca needs at least k={k} vectors of width ≥ k; "
                       f"the read gave {n} of width {d}")
    centred = vectors - vectors.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    basis = vh[:k].T.contiguous()
    peak = basis.abs().argmax(0)
    signs = torch.sign(basis[peak, torch.arange(k, device=basis.device)])
    return basis * torch.where(signs == 0, torch.ones_like(signs), signs)


def reduce(value: torch.Tensor, output: OutputOp, layout: Window) -> Published:
    """Publish a gathered read as ``output`` asks (docs/format.md §9.3).

    ``layout`` is the read's :class:`~causalab.engine.seam.Window` over all its rows
    (anything with ``counts`` and ``width``): ``width is None`` means the value is flat.
    ``none`` keeps the value and its layout; ``mean`` averages axis 0 (rows of a rectangle,
    every (row, position) pair of a flat read); ``pca`` gives a ``(d, k)`` orthonormal basis;
    ``sae`` a ``k``-latent dictionary trained on the vectors (``engine/dictionary.py``).
    """
    flat = layout.width is None
    if value.shape[0] == 0:
        raise RunError((output.name,), f"read {output.read!r} placed no row; nothing to publish")
    value = value.detach()
    if output.reduce == "none":
        counts = tuple(layout.counts) if flat else None
        return Published(value, counts, len(layout.counts), "none")
    if output.reduce == "mean":
        numbers = value if value.is_floating_point() else value.float()
        return Published(numbers.mean(0), None, None, "mean")
    if output.reduce == "pca":
        return Published(_basis(value, output), None, None, "pca")
    if output.reduce == "sae":
        from causalab.engine.dictionary import train_dictionary

        return Published(train_dictionary(value, int(output.k or 0)), None, None, "sae")
    raise RunError((output.name, "reduce"), f"unknown reduce {output.reduce!r}")
