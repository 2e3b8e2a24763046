"""Outputs: none keeps the per-row layout, mean drops axis 0, pca is a (d, k) basis (docs/format.md §9.3)."""
from __future__ import annotations

import importlib

import pytest
import torch

from causalab.compile.plan import OutputOp
from causalab.engine.outputs import Published, reduce
from causalab.engine.seam import Window
from causalab.errors import RunError


def test_the_reduce_modes_are_the_vocabulary_ones(monkeypatch):
    monkeypatch.setattr("causalab.engine.dictionary.UPDATES", 5)  # shape only; trained elsewhere
    vocab = importlib.import_module("causalab.document.vocab")
    assert set(vocab.REDUCE_MODES) == {"none", "mean", "pca", "sae"}
    value = torch.randn(6, 1, 4)
    layout = Window.from_windows([(0,)] * 6)
    for mode in vocab.REDUCE_MODES:
        k = 2 if vocab.REDUCE_MODES[mode]["needs_k"] else None
        assert reduce(value, OutputOp("o", "acts", mode, k), layout).reduce == mode


def test_an_unreduced_rectangular_read_slices_by_any_rows_in_any_order():
    value = torch.arange(4 * 2 * 3, dtype=torch.float32).reshape(4, 2, 3)
    published = reduce(value, OutputOp("o", "acts"), Window.from_windows([(1, 2)] * 4))
    assert published.counts is None and published.rows == 4
    part = published.slice_rows([3, 0])
    assert torch.equal(part.value, torch.stack([value[3], value[0]]))
    assert part.rows == 2


def test_an_unreduced_flat_read_slices_each_rows_own_positions():
    windows = [(1, 2), (5,), (), (0, 3, 4)]
    value = torch.arange(6 * 2, dtype=torch.float32).reshape(6, 2)
    published = reduce(value, OutputOp("o", "acts"), Window.from_windows(windows, ragged=True))
    assert published.counts == (2, 1, 0, 3)
    part = published.slice_rows([3, 1, 2])
    assert torch.equal(part.value, value[[3, 4, 5, 2]])
    assert part.counts == (3, 1, 0)


def test_a_mean_averages_rows_of_a_rectangle_and_every_pair_of_a_flat_read():
    rect = torch.randn(5, 2, 3)
    mean = reduce(rect, OutputOp("m", "acts", "mean"), Window.from_windows([(0, 1)] * 5))
    assert mean.value.shape == (2, 3)
    assert torch.allclose(mean.value, sum(rect[i] for i in range(5)) / 5)
    flat = torch.randn(4, 3)
    layout = Window.from_windows([(0, 1), (), (2, 3)], ragged=True)
    mean = reduce(flat, OutputOp("m", "acts", "mean"), layout)
    assert mean.value.shape == (3,)
    assert torch.allclose(mean.value, sum(flat[i] for i in range(4)) / 4)
    assert mean.slice_rows([2]) is mean


def test_a_pca_basis_is_orthonormal_and_spans_the_top_covariance_directions():
    g = torch.Generator().manual_seed(0)
    d, n, k = 6, 40, 2
    directions, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    scales = torch.tensor([5.0, 3.0, 0.3, 0.2, 0.1, 0.05])
    data = (torch.randn(n, d, generator=g) * scales) @ directions.T + 7.0
    published = reduce(data.reshape(10, 4, d), OutputOp("basis", "acts", "pca", k),
                       Window.from_windows([(0, 1, 2, 3)] * 10))
    basis = published.value
    assert basis.shape == (d, k)
    assert torch.allclose(basis.T @ basis, torch.eye(k), atol=1e-5)
    centred = data - data.mean(0)
    _, eigenvectors = torch.linalg.eigh(centred.T @ centred)
    top = eigenvectors[:, -k:].flip(1)
    assert torch.allclose(basis @ basis.T, top @ top.T, atol=1e-4)
    for column in range(k):
        assert basis[basis[:, column].abs().argmax(), column] > 0


def test_pca_over_fewer_vectors_than_k_is_refused_at_the_outputs_k():
    with pytest.raises(RunError) as caught:
        reduce(torch.randn(4, 1, 8), OutputOp("basis", "acts", "pca", 5), Window.from_windows([(0,)] * 4))
    assert caught.value.path == ("basis", "k")


def test_a_read_that_placed_no_row_cannot_be_published():
    layout = Window.from_windows([(), ()], ragged=True)
    with pytest.raises(RunError) as caught:
        reduce(torch.randn(0, 3), OutputOp("m", "acts", "mean"), layout)
    assert caught.value.path == ("m",)


def test_a_published_value_carries_no_graph():
    value = torch.randn(3, 1, 2, requires_grad=True)
    published = reduce(value, OutputOp("o", "acts"), Window.from_windows([(0,)] * 3))
    assert isinstance(published, Published) and not published.value.requires_grad
