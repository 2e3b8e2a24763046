"""Each mechanism against its docs/format.md §7.4 formula, written out by hand in the test."""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from causalab.engine.mechanisms import MECHANISMS, NEEDS_F0


def _f(seed=0, shape=(2, 3, 5)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _bits(t):
    return t.contiguous().view(torch.int32)


def test_the_mechanism_table_has_exactly_the_vocabulary_keys():
    vocab = importlib.import_module("causalab.document.vocab")
    assert set(MECHANISMS) == set(vocab.MECHANISMS)
    assert NEEDS_F0 <= set(MECHANISMS)


def test_swap_puts_the_operand_in_place_of_f_whatever_its_broadcast_shape():
    f = _f()
    assert torch.equal(MECHANISMS["swap"](f, 2.5, f0=None), torch.full_like(f, 2.5))
    full = _f(1)
    assert torch.equal(MECHANISMS["swap"](f, full, f0=None), full)
    mean = torch.randn(5)
    assert torch.equal(MECHANISMS["swap"](f, mean, f0=None), mean.expand(2, 3, 5))


def test_add_scaled_adds_scale_times_the_operand_with_scale_one_by_default():
    f, op = _f(), _f(1)
    assert torch.equal(MECHANISMS["add_scaled"](f, op, f0=None), f + op)
    got = MECHANISMS["add_scaled"](f, op, f0=None, scale=-0.5)
    assert torch.allclose(got, torch.tensor([[[a - 0.5 * b for a, b in zip(r1, r2)]
                                               for r1, r2 in zip(m1, m2)]
                                              for m1, m2 in zip(f.tolist(), op.tolist())]))


def test_lerp_is_the_weighted_sum_and_its_ends_are_swap_and_nothing():
    f, op = _f(), _f(1)
    got = MECHANISMS["lerp"](f, op, f0=None, t=0.3)
    assert torch.allclose(got, 0.7 * f + 0.3 * op)
    assert torch.equal(MECHANISMS["lerp"](f, op, f0=None, t=1.0), MECHANISMS["swap"](f, op, f0=None))
    assert torch.equal(MECHANISMS["lerp"](f, op, f0=None, t=0.0), f)
    assert torch.equal(MECHANISMS["lerp"](f, 4.0, f0=None, t=1), torch.full_like(f, 4.0))


def test_gaussian_adds_scaled_noise_from_a_cpu_generator_seeded_once():
    f = _f()
    expected_noise = torch.randn((2, 3, 5), generator=torch.Generator("cpu").manual_seed(7))
    got = MECHANISMS["gaussian"](f, None, f0=None, seed=7, scale=0.1)
    assert torch.equal(got, f + 0.1 * expected_noise)
    assert torch.equal(got, MECHANISMS["gaussian"](f, None, f0=None, seed=7.0, scale=0.1))
    assert not torch.equal(got, MECHANISMS["gaussian"](f, None, f0=None, seed=8, scale=0.1))
    assert torch.equal(MECHANISMS["gaussian"](f, None, f0=None, seed=7), f + expected_noise)


def test_gaussian_noise_does_not_depend_on_the_global_seed():
    f = _f()
    torch.manual_seed(1)
    first = MECHANISMS["gaussian"](f, None, f0=None, seed=3)
    torch.manual_seed(2)
    assert torch.equal(first, MECHANISMS["gaussian"](f, None, f0=None, seed=3))


def test_clamp_bounds_f_with_either_bound_open():
    f = _f() * 3
    assert torch.equal(MECHANISMS["clamp"](f, None, f0=None, lo=-1.0), torch.where(f < -1.0, -1.0, f))
    assert torch.equal(MECHANISMS["clamp"](f, None, f0=None, hi=0.5), torch.where(f > 0.5, 0.5, f))
    both = MECHANISMS["clamp"](f, None, f0=None, lo=-1.0, hi=0.5)
    assert torch.equal(both, torch.where(f > 0.5, 0.5, torch.where(f < -1.0, -1.0, f)))


def test_clamp_to_zero_zero_is_bit_identical_to_swapping_in_zero():
    f = torch.tensor([[-0.0, 0.0, -3.0, 2.0, float("nan"), float("-inf")]])
    clamped = MECHANISMS["clamp"](f, None, f0=None, lo=0.0, hi=0.0)
    swapped = MECHANISMS["swap"](f, 0.0, f0=None)
    assert torch.equal(_bits(clamped), _bits(swapped))


def test_renormalize_gives_each_position_the_norm_of_f0_and_keeps_its_direction():
    f, f0 = _f(), _f(1)
    got = MECHANISMS["renormalize"](f, None, f0=f0)
    for i in range(2):
        for j in range(3):
            target = sum(v * v for v in f0[i, j].tolist()) ** 0.5
            current = sum(v * v for v in f[i, j].tolist()) ** 0.5
            assert torch.allclose(got[i, j], f[i, j] * (target / current), rtol=1e-6)


def test_renormalize_leaves_a_zero_vector_zero_and_its_gradient_finite():
    f = torch.zeros(2, 4, requires_grad=True)
    got = MECHANISMS["renormalize"](f, None, f0=torch.ones(2, 4) * 10)
    assert torch.equal(got, torch.zeros(2, 4))
    torch.autograd.backward(got.sum())
    assert torch.isfinite(f.grad).all()


def test_a_parameter_the_mechanism_does_not_take_is_a_type_error():
    with pytest.raises(TypeError):
        MECHANISMS["swap"](_f(), 0.0, f0=None, scale=2.0)
    with pytest.raises(TypeError):
        MECHANISMS["lerp"](_f(), 0.0, f0=None)


def test_each_mechanism_takes_exactly_the_vocabulary_params_with_its_defaults():
    vocab = importlib.import_module("causalab.document.vocab")
    for name, fn in MECHANISMS.items():
        keyword = {p.name: p for p in inspect.signature(fn).parameters.values()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "f0"}
        declared = vocab.MECHANISMS[name]["params"]
        assert set(keyword) == set(declared), name
        for param, row in declared.items():
            if not row["required"]:
                assert keyword[param].default == row["default"], (name, param)
            else:
                assert keyword[param].default is inspect.Parameter.empty, (name, param)
