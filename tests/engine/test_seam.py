"""The write seam: gather/scatter on every layout, and apply_write against hand-written oracles.

The featurizers here are test oracles (a rotation, an SAE with its error term, a gate), written
from docs/format.md §8.2 so the seam can be checked before and apart from causalab's own featurizers.
Expected values are computed with explicit per-row loops, never with the seam itself.
"""
from __future__ import annotations

import pytest
import torch

from causalab.compile.plan import Address, Operand, PositionSpec, WriteOp
from causalab.engine.seam import Window, apply_write, express, gather, scatter
from causalab.errors import RunError

BATCH, SEQ, HEADS, HEAD_DIM, HIDDEN = 3, 6, 3, 4, 12


def _address(component="block_output", seq_axis=1, width=HIDDEN, heads=None, units=None,
             groups=None, per_group=None, key_axis=False):
    return Address(component, 0, "interior" if seq_axis == 2 else "layers_output", (0, 60),
                   seq_axis, width, width, heads=heads, units=units, groups=groups,
                   per_group=per_group, interior=seq_axis == 2, key_axis=key_axis)


# layout name -> (activation shape, address)
LAYOUTS = {
    "boundary": ((BATCH, SEQ, HIDDEN), _address()),
    "boundary_units": ((BATCH, SEQ, HIDDEN), _address(width=3, units=(7, 0, 4), groups=HIDDEN, per_group=1)),
    "premix_heads": ((BATCH, SEQ, HIDDEN), _address("attention_premix", width=8, heads=(2, 0),
                                                     groups=HEADS, per_group=HEAD_DIM)),
    "interior": ((BATCH, HEADS, SEQ, HEAD_DIM), _address("attention_query", 2)),
    "interior_heads": ((BATCH, HEADS, SEQ, HEAD_DIM), _address("attention_query", 2, width=4, heads=(1,),
                                                               groups=HEADS, per_group=HEAD_DIM)),
    "interior_units": ((BATCH, HEADS, SEQ, HEAD_DIM), _address("attention_z", 2, width=3, units=(5, 11, 2),
                                                               groups=HIDDEN, per_group=1)),
    "key_axis_heads": ((BATCH, HEADS, SEQ, SEQ), _address("attention_probs", 2, width=None, heads=(2, 1),
                                                          groups=HEADS, key_axis=True)),
    "input_ids": ((BATCH, SEQ), _address("input_ids", width=None)),
}

WINDOWS = {
    "rectangular": ([(1, 3), (0, 2), (5, 4)], False),
    "ragged": ([(1, 3, 4), (5,), ()], True),
}


def _vector(activation, address, row, position):
    """One position's features, flattened head-major, with the site's selection applied."""
    if activation.dim() == 2:
        return activation[row, position]
    native = activation[row, :, position] if address.seq_axis == 2 else activation[row, position]
    flat = native.reshape(-1)
    take = address.heads if address.heads is not None else address.units
    if take is None:
        return flat
    groups = address.groups
    return flat.reshape(groups, -1)[list(take)].reshape(-1)


def _expected_gather(activation, address, windows, rectangular):
    vectors = [[_vector(activation, address, r, p) for p in window] for r, window in enumerate(windows)]
    if rectangular:
        return torch.stack([torch.stack(row) for row in vectors])
    return torch.stack([v for row in vectors for v in row])


def _expected_scatter(activation, address, windows, flat_value):
    """Write each value vector back with per-position loops in the model's own layout."""
    out = activation.clone()
    take = address.heads if address.heads is not None else address.units
    i = 0
    for row, window in enumerate(windows):
        for position in window:
            value = flat_value[i]
            i += 1
            if out.dim() == 2:
                out[row, position] = value
                continue
            target = out[row, :, position] if address.seq_axis == 2 else out[row, position]
            flat = target.reshape(-1).clone()
            if take is None:
                flat = value.reshape(-1)
            else:
                grouped = flat.reshape(address.groups, -1)
                grouped[list(take)] = value.reshape(len(take), -1)
                flat = grouped.reshape(-1)
            target.copy_(flat.reshape(target.shape))
    return out


def _activation(shape):
    if len(shape) == 2:
        return torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(1))
    return torch.randn(shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("window_name", list(WINDOWS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gather_matches_a_per_position_loop_on_every_layout(layout, window_name):
    shape, address = LAYOUTS[layout]
    windows, ragged = WINDOWS[window_name]
    activation = _activation(shape)
    window = Window.from_windows(windows, ragged=ragged)
    got = gather(activation, address, window)
    expected = _expected_gather(activation, address, windows, not ragged)
    assert got.shape == expected.shape
    assert torch.equal(got, expected)


@pytest.mark.parametrize("window_name", list(WINDOWS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_scatter_of_a_gather_gives_the_activation_back_bit_for_bit(layout, window_name):
    shape, address = LAYOUTS[layout]
    windows, ragged = WINDOWS[window_name]
    activation = _activation(shape)
    window = Window.from_windows(windows, ragged=ragged)
    back = scatter(activation, address, window, gather(activation, address, window))
    assert back.shape == activation.shape and back.stride() == activation.stride()
    assert torch.equal(back, activation)


@pytest.mark.parametrize("window_name", list(WINDOWS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_scatter_replaces_only_the_named_groups_at_the_window(layout, window_name):
    shape, address = LAYOUTS[layout]
    windows, ragged = WINDOWS[window_name]
    activation = _activation(shape)
    window = Window.from_windows(windows, ragged=ragged)
    gathered = gather(activation, address, window)
    value = (torch.arange(gathered.numel()).reshape(gathered.shape) + 1000).to(activation.dtype)
    got = scatter(activation, address, window, value)
    flat_value = value.reshape(window.total, -1) if activation.dim() > 2 else value.reshape(-1)
    assert torch.equal(got, _expected_scatter(activation, address, windows, flat_value))


def test_scatter_leaves_its_input_alone_and_passes_gradients_both_ways():
    shape, address = LAYOUTS["interior_heads"]
    activation = torch.randn(shape, requires_grad=True)
    before = activation.detach().clone()
    window = Window.from_windows([(1, 2), (0, 3), (4, 5)])
    value = torch.randn(BATCH, 2, HEAD_DIM, requires_grad=True)
    out = scatter(activation, address, window, value)
    assert out.data_ptr() != activation.data_ptr()
    assert torch.equal(activation.detach(), before)
    torch.autograd.backward((out * 3.0).sum())
    assert torch.equal(value.grad, torch.full_like(value, 3.0))
    expected = torch.full(shape, 3.0)
    for row, window_positions in enumerate([(1, 2), (0, 3), (4, 5)]):
        for position in window_positions:
            expected[row, 1, position] = 0.0
    assert torch.equal(activation.grad, expected)


def test_a_ragged_selection_stays_flat_even_when_this_batch_looks_rectangular():
    assert Window.from_windows([(2,), (3,)], ragged=True).width is None
    assert Window.from_windows([(2,), (3,)]).width == 1
    empty = Window.from_windows([(), ()], ragged=True)
    assert empty.positions.dtype == torch.long and empty.batch_rows.dtype == torch.long
    assert empty.counts == (0, 0) and empty.total == 0
    shape, address = LAYOUTS["boundary"]
    assert gather(torch.randn(2, SEQ, HIDDEN), address, empty).shape == (0, HIDDEN)


# ---------------------------------------------------------------- oracle featurizers


class Rotation:
    """Orthonormal Q (d, k): ``f = Qᵀx``, inverse ``Qf′ + (x − QQᵀx)`` (docs/format.md §8.2)."""

    kind, training = "subspace", False

    def __init__(self, q):
        self.q = q
        self.seen = []

    def featurize(self, x):
        f = x @ self.q
        self.seen.append((x.dtype, f.dtype))
        return f, torch.zeros(())

    def inverse(self, f, err, x):
        return f @ self.q.T + (x - (x @ self.q) @ self.q.T)


class DictionaryWithError:
    """An SAE: ``f = ReLU((x − b_dec) W_enc + b_enc)``, ``err = x − decode(f)``.

    The inverse is written ``x + (decode(f′) − decode(f))``, which is ``decode(f′) + err``
    rearranged so that ``f′ = f`` gives back x to the bit (the difference is exactly zero).
    """

    kind, training = "sae", False

    def __init__(self, d, k, seed):
        g = torch.Generator().manual_seed(seed)
        self.W_enc = torch.randn(d, k, generator=g)
        self.W_dec = torch.randn(k, d, generator=g) * 3.0
        self.b_enc = torch.randn(k, generator=g)
        self.b_dec = torch.randn(d, generator=g)

    def encode(self, x):
        return torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)

    def decode(self, f):
        return f @ self.W_dec + self.b_dec

    def featurize(self, x):
        f = self.encode(x)
        return f, x - self.decode(f)

    def inverse(self, f, err, x):
        return x + (self.decode(f) - self.decode(self.encode(x)))


class Gate:
    """A hard mask m over the units: ``f = x``, inverse ``m ⊙ f′ + (1 − m) ⊙ x``."""

    kind, training = "gate", False

    def __init__(self, mask):
        self.mask = mask

    def featurize(self, x):
        return x, torch.zeros(())

    def inverse(self, f, err, x):
        return self.mask * f + (1 - self.mask) * x


def _write(mechanism, address=None, features=None, operand=Operand("literal", value=0.0), **params):
    return WriteOp(mechanism, "s", address or LAYOUTS["boundary"][1], PositionSpec(index=-1),
                   mechanism, operand, features=features, params=params)


def _orthonormal(d, k, seed):
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=torch.Generator().manual_seed(seed)))
    return q


WIN = [(5,), (3,), (4,)]


def test_an_identity_swap_of_a_literal_is_activation_patching():
    activation = torch.randn(BATCH, SEQ, HIDDEN)
    out = apply_write(activation, _write("swap"), Window.from_windows(WIN), None, 0.0)
    expected = activation.clone()
    for row, (position,) in enumerate(WIN):
        expected[row, position] = 0.0
    assert torch.equal(out, expected)


def test_a_rotation_swap_replaces_the_subspace_and_keeps_the_complement():
    q = _orthonormal(HIDDEN, 3, 0)
    base, source = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
    window = Window.from_windows(WIN)
    rotation = Rotation(q)
    operand = express(rotation, gather(source, LAYOUTS["boundary"][1], window))
    out = apply_write(base, _write("swap"), window, rotation, operand)
    for row, (position,) in enumerate(WIN):
        x, s = base[row, position], source[row, position]
        expected = q @ (q.T @ s) + (x - q @ (q.T @ x))
        assert torch.allclose(out[row, position], expected, atol=1e-6)
        keep = [p for p in range(SEQ) if p != position]
        assert torch.equal(out[row, keep], base[row, keep])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_an_sae_write_with_f_unchanged_returns_x_to_the_bit_with_a_bad_dictionary(dtype):
    sae = DictionaryWithError(HIDDEN, 20, seed=3)
    activation = (torch.randn(BATCH, SEQ, HIDDEN) * 5).to(dtype)
    window = Window.from_windows(WIN)
    x = gather(activation, LAYOUTS["boundary"][1], window).float()
    assert (sae.decode(sae.encode(x)) - x).abs().max() > 1.0  # the dictionary reconstructs badly
    out = apply_write(activation, _write("swap"), window, sae, sae.encode(x))
    assert out.dtype == dtype
    assert torch.equal(out, activation)


def test_an_sae_latent_write_moves_x_by_the_decoded_difference_only():
    sae = DictionaryWithError(HIDDEN, 20, seed=4)
    activation = torch.randn(BATCH, SEQ, HIDDEN)
    window = Window.from_windows(WIN)
    out = apply_write(activation, _write("swap", features=(1, 7)), window, sae, 0.0)
    for row, (position,) in enumerate(WIN):
        x = activation[row, position]
        f = sae.encode(x)
        edited = f.clone()
        edited[[1, 7]] = 0.0
        expected = sae.decode(edited) + (x - sae.decode(f))
        assert torch.allclose(out[row, position], expected, atol=1e-4)


def test_an_all_on_gate_is_patching_and_an_all_off_gate_is_nothing_bit_for_bit():
    base, source = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
    window = Window.from_windows(WIN)
    operand = gather(source, LAYOUTS["boundary"][1], window)
    patched = apply_write(base, _write("swap"), window, None, operand)
    all_on = apply_write(base, _write("swap"), window, Gate(torch.ones(HIDDEN)), operand)
    all_off = apply_write(base, _write("swap"), window, Gate(torch.zeros(HIDDEN)), operand)
    assert torch.equal(all_on, patched)
    assert torch.equal(all_off, base)
    assert not torch.equal(patched, base)


def test_features_restrict_the_coordinates_and_cut_a_full_width_operand_the_same_way():
    activation = torch.randn(BATCH, SEQ, HIDDEN)
    window = Window.from_windows(WIN)
    full = torch.randn(BATCH, 1, HIDDEN)
    narrow = torch.randn(BATCH, 1, 2)
    write = _write("add_scaled", features=(2, 9), scale=2.0)
    out_full = apply_write(activation, write, window, None, full)
    out_narrow = apply_write(activation, write, window, None, narrow)
    for row, (position,) in enumerate(WIN):
        expected_full = activation[row, position].clone()
        expected_full[[2, 9]] += 2.0 * full[row, 0, [2, 9]]
        expected_narrow = activation[row, position].clone()
        expected_narrow[[2, 9]] += 2.0 * narrow[row, 0]
        assert torch.equal(out_full[row, position], expected_full)
        assert torch.equal(out_narrow[row, position], expected_narrow)


@pytest.mark.parametrize("shape", [(1, HIDDEN), (HIDDEN,)], ids=["window_mean", "flat_mean"])
def test_a_mean_operand_without_a_row_axis_broadcasts_over_rows(shape):
    activation = torch.randn(BATCH, SEQ, HIDDEN)
    mean = torch.randn(shape)
    out = apply_write(activation, _write("swap"), Window.from_windows(WIN), None, mean)
    for row, (position,) in enumerate(WIN):
        assert torch.equal(out[row, position], mean.reshape(HIDDEN))


def test_a_flat_write_takes_a_flat_operand_row_by_row():
    activation = torch.randn(BATCH, SEQ, HIDDEN)
    windows = [(1, 2), (4,), (0, 3, 5)]
    window = Window.from_windows(windows, ragged=True)
    operand = torch.randn(window.total, HIDDEN)
    out = apply_write(activation, _write("lerp", t=0.25), window, None, operand)
    i = 0
    for row, positions in enumerate(windows):
        for position in positions:
            x = activation[row, position]
            assert torch.allclose(out[row, position], 0.75 * x + 0.25 * operand[i])
            i += 1


def test_renormalize_after_add_scaled_restores_each_positions_norm():
    original = torch.randn(BATCH, SEQ, HIDDEN)
    window = Window.from_windows([(4, 5), (0, 1), (2, 3)])
    address = LAYOUTS["boundary"][1]
    direction = torch.randn(HIDDEN)
    steered = apply_write(original, _write("add_scaled", scale=4.0), window, None, direction)
    restored = apply_write(steered, _write("renormalize", operand=Operand("none")), window, None,
                           None, original)
    before = gather(original, address, window).norm(dim=-1)
    after_steer = gather(steered, address, window)
    after = gather(restored, address, window)
    assert not torch.allclose(after_steer.norm(dim=-1), before)
    assert torch.allclose(after.norm(dim=-1), before, rtol=1e-5)
    cosine = torch.nn.functional.cosine_similarity(after, after_steer, dim=-1)
    assert torch.allclose(cosine, torch.ones_like(cosine), atol=1e-6)


def test_renormalize_without_the_pre_write_value_is_refused_at_the_write():
    write = _write("renormalize", operand=Operand("none"))
    with pytest.raises(RunError) as caught:
        apply_write(torch.randn(BATCH, SEQ, HIDDEN), write, Window.from_windows(WIN), None, None)
    assert caught.value.path == ("renormalize",)


def test_featurizer_arithmetic_runs_in_float32_with_autocast_off():
    rotation = Rotation(_orthonormal(HIDDEN, 3, 1))
    activation = torch.randn(BATCH, SEQ, HIDDEN).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = apply_write(activation, _write("swap"), Window.from_windows(WIN), rotation, 0.5)
    assert rotation.seen == [(torch.float32, torch.float32)]
    assert out.dtype == torch.bfloat16


def test_a_head_selected_pattern_swap_changes_only_those_heads_query_rows():
    shape, address = LAYOUTS["key_axis_heads"]
    base, source = torch.rand(shape), torch.rand(shape)
    window = Window.from_windows(WIN)
    operand = gather(source, address, window)
    out = apply_write(base, _write("swap", address=address), window, None, operand)
    expected = base.clone()
    for row, (position,) in enumerate(WIN):
        for head in (2, 1):
            expected[row, head, position] = source[row, head, position]
    assert torch.equal(out, expected)


def test_gradients_reach_the_rotation_and_the_operand_through_a_write():
    q_param = torch.randn(HIDDEN, 3, requires_grad=True)
    rotation = Rotation(torch.linalg.qr(q_param)[0])
    activation = torch.randn(BATCH, SEQ, HIDDEN)
    operand = torch.randn(BATCH, 1, 3, requires_grad=True)
    out = apply_write(activation, _write("swap"), Window.from_windows(WIN), rotation, operand)
    torch.autograd.backward(out.pow(2).sum())
    assert operand.grad is not None and operand.grad.abs().sum() > 0
    assert q_param.grad is not None and q_param.grad.abs().sum() > 0


def test_renormalize_on_features_measures_norms_over_those_coordinates_only():
    original = torch.randn(BATCH, SEQ, HIDDEN)
    window = Window.from_windows(WIN)
    steered = apply_write(original, _write("add_scaled", features=(0, 5, 6)), window, None, 3.0)
    restored = apply_write(steered, _write("renormalize", features=(0, 5, 6), operand=Operand("none")),
                           window, None, None, original)
    for row, (position,) in enumerate(WIN):
        cut = [0, 5, 6]
        target = original[row, position, cut].norm()
        expected = steered[row, position].clone()
        expected[cut] = steered[row, position, cut] * target / steered[row, position, cut].norm()
        assert torch.allclose(restored[row, position], expected, rtol=1e-6)
