"""Each featurizer kind against docs/format.md §8.2, with oracles written out in plain torch here.

Exactness claims (an unchanged feature vector returns x to the bit; all-on and all-off gates)
are checked with ``torch.equal``; projections with a tolerance, as the format allows.
"""
from __future__ import annotations

import math

import pytest
import torch

from causalab.compile.plan import FeaturizerSpec
from causalab.engine.featurizers import FEATURIZERS, build_featurizer
from causalab.engine.featurizers.gate import Gate
from causalab.engine.featurizers.identity import Identity
from causalab.engine.featurizers.linear import Linear
from causalab.engine.featurizers.pca import PCA
from causalab.engine.featurizers.sae import SAE
from causalab.engine.featurizers.subspace import Subspace

D, K, D_SAE = 16, 4, 24


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _acts(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, D, generator=_gen(seed)) * 3


def _spec(kind: str, k: int | None = K, seed: int = 0, trained_by: str | None = None) -> FeaturizerSpec:
    return FeaturizerSpec(name="f", kind=kind, d=D, k=k, seed=seed, file_path=None, trust_unstamped=False,
                          parametrization="cayley", stamp={}, trained_by=trained_by)


def _bad_dictionary(tied: bool = False) -> dict[str, torch.Tensor]:
    """A dictionary that reconstructs nothing well: large random weights and biases."""
    g = _gen(11)
    out = {"W_enc": torch.randn(D, D_SAE, generator=g) * 5, "b_enc": torch.randn(D_SAE, generator=g),
           "b_dec": torch.randn(D, generator=g) * 7}
    if not tied:
        out["W_dec"] = torch.randn(D_SAE, D, generator=g) * 3
    return out


def test_the_table_has_one_class_per_kind_each_untrained_by_default():
    assert set(FEATURIZERS) == {"identity", "subspace", "pca", "gate", "sae", "linear"}
    for kind, cls in FEATURIZERS.items():
        assert cls.kind == kind


def test_identity_features_are_the_activation_and_its_inverse_is_the_new_value():
    identity, x, new = Identity(), _acts(0, 3), _acts(1, 3)
    f, err = identity.featurize(x)
    assert f is x and err is None
    assert identity.inverse(new, err, x) is new
    assert identity.parameters() == [] and identity.tensors() == {} and identity.training is False


def test_a_subspace_swap_takes_the_source_coordinates_and_leaves_the_complement():
    subspace = Subspace.draw(D, K, seed=2)
    base, source = _acts(3, 5), _acts(4, 5)
    q = subspace.basis.detach()
    swapped = subspace.inverse(subspace.featurize(source)[0], None, base)
    complement = torch.eye(D) - q @ q.T
    assert torch.allclose(swapped @ complement, base @ complement, atol=2e-6, rtol=0)
    assert torch.allclose(swapped @ q, source @ q, atol=2e-6, rtol=0)
    oracle = (source @ q) @ q.T + (base - (base @ q) @ q.T)
    assert torch.allclose(swapped, oracle, atol=2e-6, rtol=0)


def test_an_unchanged_subspace_feature_vector_returns_the_activation_to_the_bit():
    subspace, x = Subspace.draw(D, K, seed=5), _acts(6, 2, 3)
    f, err = subspace.featurize(x)
    assert f.shape == (2, 3, K)
    assert torch.equal(subspace.inverse(f, err, x), x)


def test_pca_projects_onto_its_stored_basis_and_trains_nothing():
    basis, _ = torch.linalg.qr(torch.randn(D, K, generator=_gen(7)))
    pca, base, source = PCA(basis), _acts(8, 4), _acts(9, 4)
    f, _ = pca.featurize(source)
    assert torch.allclose(f, source @ basis, atol=1e-6)
    oracle = (source @ basis) @ basis.T + (base - (base @ basis) @ basis.T)
    assert torch.allclose(pca.inverse(f, None, base), oracle, atol=2e-6, rtol=0)
    assert pca.parameters() == [] and torch.equal(pca.tensors()["weight"], basis)


@pytest.mark.parametrize("cls", [SAE, Linear], ids=["sae", "linear"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_an_unchanged_dictionary_code_returns_the_activation_to_the_bit(cls, tied):
    dictionary = cls(**_bad_dictionary(tied))
    x = _acts(12, 3, 2)
    f, err = dictionary.featurize(x)
    assert f.shape == (3, 2, D_SAE)
    assert err.abs().max() > 1.0  # the reconstruction really is poor
    assert torch.equal(dictionary.inverse(f, err, x), x)
    assert torch.equal(dictionary.inverse(f.clone(), err, x), x)


@pytest.mark.parametrize("cls,act", [(SAE, torch.relu), (Linear, lambda t: t)], ids=["sae", "linear"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_dictionary_edit_is_the_new_decode_plus_the_error_term(cls, act, tied):
    tensors = _bad_dictionary(tied)
    dictionary = cls(**tensors)
    w_dec = tensors["W_enc"].T if tied else tensors["W_dec"]
    x = _acts(13, 5)
    f = act((x - tensors["b_dec"]) @ tensors["W_enc"] + tensors["b_enc"])

    def decode(code):
        return code @ w_dec + tensors["b_dec"]

    got_f, got_err = dictionary.featurize(x)
    assert torch.allclose(got_f, f, rtol=1e-5, atol=1e-4)
    assert torch.allclose(got_err, x - decode(f), rtol=1e-5, atol=1e-3)
    edited = f.clone()
    edited[:, 3] = 10.0
    assert torch.allclose(dictionary.inverse(edited, got_err, x), decode(edited) + (x - decode(f)),
                          rtol=1e-5, atol=1e-3)


def test_missing_dictionary_biases_are_zeros_and_a_missing_decoder_is_tied():
    w_enc = torch.randn(D, D_SAE, generator=_gen(14))
    dictionary = SAE(w_enc)
    assert torch.equal(dictionary.decoder, w_enc.T)
    assert set(dictionary.tensors()) == {"W_enc", "b_enc", "b_dec"}
    x = _acts(15, 2)
    f, _ = dictionary.featurize(x)
    assert torch.allclose(f, torch.relu(x @ w_enc), atol=1e-5)


def _gate(theta: list[float]) -> Gate:
    return Gate(torch.tensor(theta))


def test_an_all_on_gate_is_patching_and_an_all_off_gate_is_no_write_to_the_bit():
    base, source = _acts(16, 3), _acts(17, 3)
    on, off = _gate([1.0] * D), _gate([-1.0] * D)
    f, err = on.featurize(base)
    assert torch.equal(on.inverse(source, err, base), source)
    assert torch.equal(off.inverse(source, err, base), base)
    assert on.kept() == 1.0 and off.kept() == 0.0


def test_an_unfitted_gate_writes_nothing_hard_and_blends_half_soft():
    gate, base, source = Gate.start(D), _acts(18, 4), _acts(19, 4)
    assert torch.equal(gate.weight, torch.zeros(D)) and gate.T == 1.0
    assert torch.equal(gate.inverse(source, None, base), base)
    gate.training = True
    assert torch.allclose(gate.inverse(source, None, base), 0.5 * source + 0.5 * base, atol=1e-6)
    assert gate.mask_mean().item() == pytest.approx(0.5)


def test_a_gate_mask_is_sigmoid_over_temperature_while_training_and_a_threshold_otherwise():
    theta = torch.linspace(-2, 2, D)
    gate, base, source = Gate(theta.clone()), _acts(20, 3), _acts(21, 3)
    gate.training, gate.T = True, 0.25
    soft = torch.sigmoid(theta / 0.25)
    assert torch.allclose(gate.inverse(source, None, base), soft * source + (1 - soft) * base, atol=1e-6)
    assert gate.mask_mean().item() == pytest.approx(soft.mean().item(), abs=1e-6)
    gate.training = False
    hard = theta > 0
    assert torch.equal(gate.inverse(source, None, base), torch.where(hard, source, base))
    assert gate.kept() == pytest.approx(hard.float().mean().item())


def test_a_soft_gate_passes_gradient_to_theta():
    gate = Gate(torch.zeros(D, requires_grad=True))
    gate.training = True
    out = gate.inverse(_acts(22, 2), None, _acts(23, 2))
    torch.autograd.backward(out.sum() + gate.mask_mean())
    assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["subspace", "gate"])
def test_a_featurizer_keeps_a_bfloat16_activation_in_bfloat16(kind):
    featurizer = Subspace.draw(D, K, 0) if kind == "subspace" else _gate([1.0] * D)
    x = _acts(24, 2).to(torch.bfloat16)
    f, err = featurizer.featurize(x)
    assert f.dtype == torch.float32
    assert featurizer.inverse(f, err, x).dtype == torch.bfloat16


def test_a_fresh_subspace_is_the_seeded_draw_and_is_a_leaf_only_when_a_fit_trains_it():
    trained = build_featurizer(_spec("subspace", seed=9, trained_by="fit"), "cpu")
    frozen = build_featurizer(_spec("subspace", seed=9), "cpu")
    expected = torch.randn(D, K, generator=_gen(9)) / math.sqrt(D)
    assert torch.equal(trained.weight.detach(), expected) and torch.equal(frozen.weight, expected)
    assert trained.weight.is_leaf and trained.weight.requires_grad
    assert not frozen.weight.requires_grad
    assert trained.parameters() == [trained.weight] and not trained.training


def test_a_fresh_gate_starts_at_zero():
    gate = build_featurizer(_spec("gate", k=None, trained_by="fit"), "cpu")
    assert gate.kind == "gate" and torch.equal(gate.weight.detach(), torch.zeros(D))
    assert gate.weight.requires_grad


@pytest.mark.parametrize("kind", ["pca", "sae", "linear"])
def test_a_loaded_only_kind_without_a_bundle_cannot_be_built(kind):
    with pytest.raises(ValueError):
        build_featurizer(_spec(kind), "cpu")
