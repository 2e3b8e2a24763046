"""Bundles: the stamp written, the load check refusing by key, SAELens files and directories.

Bundles are written here with ``safetensors.torch.save_file`` directly (the oracle layout of
docs/format.md §8.3), then read back through causalab. Refusals assert the JSON path and, where the
format says the message names a key, the key it starts with.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from causalab.compile.plan import FeaturizerSpec
from causalab.engine import record
from causalab.engine.bundle_files import (
    check_bundle, document_stamp, read_stamp, restamp, same_content, stamp_metadata,
    weights_results,
)
from causalab.engine.featurizers import build_featurizer
from causalab.engine.featurizers.subspace import Subspace, cayley_basis
from causalab.errors import CompileError
from causalab.files import SAELENS_CONFIG, SAELENS_WEIGHTS

D, K, D_SAE = 16, 4, 24
AT = ("featurizers", "rot", "file_path")
SAELENS_SITE = {"component": "block_output", "layer": "1"}  # blocks.1.hook_resid_post


def _stamp(kind="subspace", k=K, **changes) -> dict[str, str]:
    stamp = {"kind": kind, "d": str(D), "parametrization": "cayley", "site": "target",
             "component": "block_output", "layer": "1", "model_key": "causalab:tiny-llama",
             "model_revision": "abc123", "model_dtype": "float32"}
    if k is not None:
        stamp["k"] = str(k)
    stamp.update(changes)
    return stamp


def _spec(path, kind="subspace", k=K, trust=False, stamp=None, trained_by=None) -> FeaturizerSpec:
    return FeaturizerSpec(name="rot", kind=kind, d=D, k=k, seed=0, file_path=str(path),
                          trust_unstamped=trust, parametrization="cayley",
                          stamp=_stamp(kind, k) if stamp is None else stamp, trained_by=trained_by)


def _weight(seed=0, shape=(D, K)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _dictionary(tied=False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    out = {"W_enc": torch.randn(D, D_SAE, generator=g), "b_enc": torch.randn(D_SAE, generator=g),
           "b_dec": torch.randn(D, generator=g)}
    if not tied:
        out["W_dec"] = torch.randn(D_SAE, D, generator=g)
    return out


def test_a_stamped_subspace_bundle_loads_and_gives_the_same_basis(tmp_path):
    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight()}, str(path), metadata=_stamp())
    restamp(str(path))  # written by hand: the digest a stamp needs (else trust_unstamped)
    featurizer = build_featurizer(_spec(path), "cpu")
    assert featurizer.kind == "subspace"
    assert torch.equal(featurizer.weight, _weight())
    assert torch.allclose(featurizer.basis, cayley_basis(_weight()))


def test_the_stamp_is_read_from_the_header_with_shapes(tmp_path):
    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight()}, str(path), metadata=_stamp())
    metadata, shapes = read_stamp(str(path))
    assert metadata == _stamp() and shapes == {"weight": (D, K)}


@pytest.mark.parametrize("key,value", [("layer", "0"), ("k", "3"), ("component", "attention_output"),
                                       ("model_key", "causalab:tiny-gpt2"), ("model_revision", "zzz"),
                                       ("heads", "[0,1]"), ("kind", "pca")])
def test_a_stamp_mismatch_is_refused_naming_the_key(tmp_path, key, value):
    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight()}, str(path), metadata=_stamp(**{key: value}))
    with pytest.raises(CompileError) as refused:
        build_featurizer(_spec(path), "cpu")
    assert refused.value.path == AT
    assert refused.value.message.startswith(f"{key}:")


def test_an_unstamped_bundle_is_refused_without_trust_and_loaded_with_it(tmp_path):
    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight()}, str(path))
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(path))
    assert refused.value.path == AT
    featurizer = build_featurizer(_spec(path, trust=True), "cpu")
    assert torch.equal(featurizer.weight, _weight())


@pytest.mark.parametrize("shape", [(D + 1, K), (D, K + 1), (D,)], ids=["width", "rank", "axes"])
def test_a_trusted_unstamped_bundle_still_has_its_shapes_checked(tmp_path, shape):
    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight(shape=shape)}, str(path))
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(path, trust=True))
    assert refused.value.path == AT


def test_a_missing_bundle_is_refused(tmp_path):
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(tmp_path / "absent.safetensors"))
    assert refused.value.path == AT


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_corrupt_bundle_is_refused(tmp_path, damage):
    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight()}, str(path), metadata=_stamp())
    data = path.read_bytes()
    path.write_bytes({"garbage": b"not a safetensors file at all", "truncated": data[:-7],
                      "empty": b""}[damage])
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(path))
    assert refused.value.path == AT


def _rewrite_header(path, edit) -> None:
    """Rewrite a safetensors file's JSON header with ``edit(header)``, keeping its data bytes."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length:])


def _offsets(**spans):
    def edit(header):
        for name, offsets in spans.items():
            header[name]["data_offsets"] = offsets
    return edit


def _set(name, key, value):
    def edit(header):
        header[name][key] = value
    return edit


# Two F32 tensors of 64 and 96 bytes, a at [0, 64] and b at [64, 160]. Every damage keeps the
# largest end at the data's 160 bytes, the one thing a header was once checked against.
LAYOUTS = {
    "overlap": _offsets(a=[96, 160]),  # a reads b's last bytes; bytes 0-64 belong to none
    "hole": lambda header: header["b"].update(shape=[20], data_offsets=[80, 160]),
    "swapped-lengths": _offsets(a=[0, 96], b=[96, 160]),
    "unknown-dtype": _set("a", "dtype", "F12"),
    "dtype-not-a-string": _set("a", "dtype", ["F32"]),
    "shape-of-booleans": _set("a", "shape", [True, 16]),
    "offsets-backwards": _offsets(a=[64, 0]),
    "metadata-not-strings": lambda header: header.update(__metadata__={"layer": 1}),
}


@pytest.mark.parametrize("damage", list(LAYOUTS))
def test_a_header_that_does_not_describe_the_data_as_safetensors_requires_is_refused(tmp_path, damage):
    path = tmp_path / "rot.safetensors"
    save_file({"a": torch.zeros(16), "b": torch.zeros(24)}, str(path))
    _rewrite_header(path, _offsets(a=[0, 64], b=[64, 160]))
    read_stamp(str(path))  # rewritten as it was laid out, the file is valid
    _rewrite_header(path, LAYOUTS[damage])
    with pytest.raises(CompileError) as refused:
        read_stamp(str(path), at=AT)
    assert refused.value.path == AT and str(path) in refused.value.message


def test_a_dictionary_given_where_a_subspace_is_declared_is_refused(tmp_path):
    path = tmp_path / "sae.safetensors"
    save_file(_dictionary(), str(path))
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(path, trust=True))
    assert refused.value.path == AT


def test_a_gate_bundle_checks_its_one_axis(tmp_path):
    path = tmp_path / "mask.safetensors"
    save_file({"weight": _weight(shape=(D,))}, str(path), metadata=_stamp("gate", None))
    gate = build_featurizer(_spec(path, kind="gate", k=None, trust=True), "cpu")
    assert gate.kind == "gate" and torch.equal(gate.weight, _weight(shape=(D,)))
    assert not gate.training


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_an_unstamped_sae_file_with_saelens_names_loads_when_trusted(tmp_path, tied):
    path = tmp_path / "sae.safetensors"
    save_file(_dictionary(tied), str(path))
    sae = build_featurizer(_spec(path, kind="sae", k=D_SAE, trust=True, stamp={}), "cpu")
    tensors = _dictionary(tied)
    assert torch.equal(sae.W_enc, tensors["W_enc"])
    assert torch.equal(sae.decoder, tensors["W_enc"].T if tied else tensors["W_dec"])
    x = torch.randn(3, D)
    f, err = sae.featurize(x)
    assert torch.equal(sae.inverse(f, err, x), x)


def test_an_sae_whose_input_width_differs_from_the_site_is_refused(tmp_path):
    path = tmp_path / "sae.safetensors"
    tensors = _dictionary()
    tensors["W_enc"] = torch.randn(D + 2, D_SAE)
    save_file(tensors, str(path))
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(path, kind="sae", k=None, trust=True, stamp={}))
    assert refused.value.path == AT


def _saelens_dir(tmp_path, **config) -> str:
    directory = tmp_path / "saelens"
    directory.mkdir()
    save_file(_dictionary(), str(directory / SAELENS_WEIGHTS))
    cfg = {"d_in": D, "d_sae": D_SAE, "architecture": "standard", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "hook_name": "blocks.1.hook_resid_post", **config}
    (directory / SAELENS_CONFIG).write_text(json.dumps(cfg))
    return str(directory)


def test_a_saelens_directory_loads_as_an_sae(tmp_path):
    directory = _saelens_dir(tmp_path)
    sae = build_featurizer(_spec(directory, kind="sae", k=None, trust=True, stamp=SAELENS_SITE), "cpu")
    tensors = _dictionary()
    x = torch.randn(2, D)
    f, _ = sae.featurize(x)
    assert torch.allclose(f, torch.relu((x - tensors["b_dec"]) @ tensors["W_enc"] + tensors["b_enc"]),
                          atol=1e-5)


def test_a_saelens_directory_that_does_not_subtract_b_dec_is_honoured(tmp_path):
    directory = _saelens_dir(tmp_path, apply_b_dec_to_input=False)
    sae = build_featurizer(_spec(directory, kind="sae", k=None, trust=True, stamp=SAELENS_SITE), "cpu")
    tensors = _dictionary()
    x = torch.randn(2, D)
    assert torch.allclose(sae.featurize(x)[0], torch.relu(x @ tensors["W_enc"] + tensors["b_enc"]), atol=1e-5)


@pytest.mark.parametrize("config,named", [({"architecture": "jumprelu"}, "threshold"),
                                          ({"normalize_activations": "expected_average_only_in"},
                                           "normalize_activations")],
                         ids=["jumprelu-without-threshold", "normalized"])
def test_a_saelens_directory_whose_cfg_its_tensors_or_causalab_cannot_meet_is_refused(tmp_path, config,
                                                                                      named):
    directory = _saelens_dir(tmp_path, **config)
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory, kind="sae", k=None, trust=True, stamp=SAELENS_SITE))
    assert refused.value.path == AT and named in refused.value.message


def test_a_saved_featurizer_carries_the_full_stamp_and_loads_back(tmp_path):
    subspace = Subspace.draw(D, K, seed=3)
    spec = _spec(tmp_path / "rot.safetensors")
    record.write_tensor(tmp_path / "rot.safetensors", subspace.tensors()["weight"],
                        stamp_metadata(document_stamp(spec), produced_by="f" * 64))
    metadata, shapes = read_stamp(str(tmp_path / "rot.safetensors"))
    digests = json.loads(metadata.pop("tensors_sha256"))
    assert metadata == {**_stamp(), "featurizer_dtype": "fp32", "produced_by": "f" * 64, "engine": "causalab"}
    assert shapes == {"weight": (D, K)}
    oracle = hashlib.sha256(b'["weight","F32",[16,4]]\0' + subspace.weight.numpy().tobytes())
    assert digests == {"weight": oracle.hexdigest()}
    assert torch.equal(build_featurizer(spec, "cpu").weight, subspace.weight)


def test_bundles_compare_by_content_not_bytes(tmp_path):
    first, second, third = (str(tmp_path / f"{n}.safetensors") for n in "abc")
    save_file({"weight": _weight()}, first, metadata=_stamp())
    save_file({"weight": _weight()}, second, metadata=dict(reversed(list(_stamp().items()))))
    save_file({"weight": _weight(seed=1)}, third, metadata=_stamp())
    assert same_content(first, second) and not same_content(first, third)


def test_a_weights_step_publishes_detached_copies_of_each_weight():
    subspace = Subspace.draw(D, K, seed=3)
    subspace.weight.requires_grad_(True)
    published = weights_results(["rot"], {"rot": subspace})
    assert torch.equal(published["rot"], subspace.weight.detach()) and not published["rot"].requires_grad
    assert published["rot"].data_ptr() != subspace.weight.data_ptr()


def test_reading_a_stamp_does_not_import_torch(tmp_path):
    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight()}, str(path), metadata=_stamp())
    code = ("import sys; from causalab.engine.bundle_files import read_stamp; "
            f"meta, shapes = read_stamp({str(path)!r}); "
            "assert shapes == {'weight': (16, 4)} and meta['layer'] == '1'; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_finite_refuses_nan_or_inf_with_the_error_loading_gives(tmp_path):
    from causalab.engine.bundle_files import check_finite, load_bundle
    from causalab.errors import RunError

    path = tmp_path / "rot.safetensors"
    save_file({"weight": _weight()}, str(path), metadata=_stamp())
    assert check_finite(_spec(path)) is None
    weight = _weight()
    weight[1, 2] = float("inf")
    save_file({"weight": weight}, str(path), metadata=_stamp())
    with pytest.raises(RunError) as streamed:
        check_finite(_spec(path))
    with pytest.raises(CompileError) as loaded:  # the bundle check reads its tensors first
        load_bundle(_spec(path))
    for refused in (streamed, loaded):
        assert refused.value.path == AT and "weight holds 1 NaN or Inf" in refused.value.message


def test_the_bundles_checked_before_a_run_are_each_file_once_and_no_step_output():
    import dataclasses

    from causalab.compile.plan import Featurizers, Plan
    from causalab.engine.bundle_files import bundle_files

    file = _spec("rot.safetensors")
    published = dataclasses.replace(file, name="pub", file_path="steps:harvest/basis")
    tracked = dataclasses.replace(file, name="tracked", file_path="runs:/abc/rot.safetensors")
    trained = dataclasses.replace(file, name="fresh", file_path=None)
    node = Featurizers(name="featurizers", featurizers=(file, published, tracked, trained))
    points = tuple(Plan(name=f"p{i}", directory=f"p{i}", children=(node,)) for i in range(2))
    plan = Plan(name="root", directory="", children=points)
    assert bundle_files(plan) == {"rot.safetensors": file}
    assert list(bundle_files(plan, resolver=str)) == ["rot.safetensors", "runs:/abc/rot.safetensors"]
