"""The Cayley basis of a subspace: Woodbury against the dense solve, orthonormality under AdamW.

The oracle is the dense d×d form written out here: A = W Eᵀ − E Wᵀ, Q = solve(I − A, (I + A) E).
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from causalab.engine.featurizers.subspace import Subspace, cayley_basis


def _dense_basis(weight: torch.Tensor) -> torch.Tensor:
    d, k = weight.shape
    eye = torch.eye(d, dtype=weight.dtype)
    frame = eye[:, :k]
    skew = weight @ frame.T - frame @ weight.T
    return torch.linalg.solve(eye - skew, (eye + skew) @ frame)


@pytest.mark.parametrize("d,k", [(4, 1), (8, 3), (16, 16), (64, 8), (300, 5), (1024, 16)],
                         ids=["tiny", "small", "square", "mid", "odd", "wide"])
def test_the_woodbury_basis_equals_the_dense_cayley_solve(d, k):
    generator = torch.Generator().manual_seed(d * 31 + k)
    for scale in (1 / math.sqrt(d), 1.0):
        weight = torch.randn(d, k, generator=generator) * scale
        assert torch.allclose(cayley_basis(weight), _dense_basis(weight), atol=1e-5, rtol=0)


def test_the_woodbury_gradient_equals_the_dense_gradient():
    weight = torch.randn(40, 4, generator=torch.Generator().manual_seed(1)) / math.sqrt(40)
    probe = torch.randn(40, 4, generator=torch.Generator().manual_seed(2))
    grads = []
    for basis_of in (cayley_basis, _dense_basis):
        leaf = weight.clone().requires_grad_(True)
        torch.autograd.backward((basis_of(leaf) * probe).sum())
        grads.append(leaf.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=0)


def test_the_basis_stays_orthonormal_after_two_hundred_adamw_steps_at_d_2048():
    d, k = 2048, 16
    subspace = Subspace.draw(d, k, seed=0)
    subspace.weight.requires_grad_(True)
    optimizer = torch.optim.AdamW(subspace.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(3)
    inputs, target = torch.randn(32, d, generator=generator), torch.randn(32, k, generator=generator)
    for _ in range(200):
        features, _ = subspace.featurize(inputs)
        torch.autograd.backward(((features - target) ** 2).mean())
        optimizer.step()
        optimizer.zero_grad()
    basis = subspace.basis.detach()
    assert (basis.T @ basis - torch.eye(k)).abs().max().item() < 1e-5


def test_the_basis_is_recomputed_after_every_change_of_the_weight():
    subspace = Subspace.draw(12, 2, seed=4)
    before = subspace.basis
    with torch.no_grad():
        subspace.weight.add_(0.3)
    assert not torch.allclose(before, subspace.basis)
    assert torch.allclose(subspace.basis, _dense_basis(subspace.weight.detach()), atol=1e-6)


def test_an_untrained_draw_is_a_seeded_normal_scaled_by_one_over_root_d():
    expected = torch.randn(64, 4, generator=torch.Generator().manual_seed(7)) / 8.0
    assert torch.equal(Subspace.draw(64, 4, seed=7).weight, expected)
    assert not torch.equal(Subspace.draw(64, 4, seed=8).weight, expected)


def test_the_basis_is_float32_under_a_bfloat16_autocast():
    weight = torch.randn(32, 4, generator=torch.Generator().manual_seed(5)) / math.sqrt(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        basis = cayley_basis(weight)
    assert basis.dtype == torch.float32
    assert torch.allclose(basis, _dense_basis(weight), atol=1e-5)


def test_the_cayley_bench_reports_woodbury_at_least_five_times_faster_than_dense(capsys):
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "cayley.py"
    spec = importlib.util.spec_from_file_location("cayley_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ratio = bench.main([])
    assert "ratio" in capsys.readouterr().out
    assert ratio >= 5
