"""SAEs as SAELens writes them: each architecture against SAELens's own outputs and a plain-torch
oracle, the cfg.json read as the directory's identity, and causalab's writer read back.

The directories under documents/artifacts/saelens were written by SAELens 6.54 itself
(scripts/saelens/write_fixtures.py), with SAELens's encode, decode and error-term forward on
weekday-llama activations saved next to them, so this file needs no SAELens installed. The
live comparison is tests/engine/test_saelens_live.py (slow, ``make test-saelens``).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from causalab.compile.plan import FeaturizerSpec
from causalab.engine.bundle_files import check_bundle
from causalab.engine.featurizers import build_featurizer, write_saelens_dir
from causalab.engine.featurizers.sae import ARCHITECTURES
from causalab.errors import CompileError
from causalab.files import SAELENS_CONFIG, SAELENS_WEIGHTS

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "documents" / "artifacts" / "saelens"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
NAMES = list(MANIFEST["saes"])
D, D_SAE = 64, 128
AT = ("featurizers", "dictionary", "file_path")
# SAELens and causalab run the same float32 operations in different processes; 1e-5 absolute
# (latents are O(1)) leaves room for a different matmul blocking and nothing more.
TOLERANCE = 1e-5


def _spec(path, component="block_output", layer="1", kind="sae", saelens=None) -> FeaturizerSpec:
    return FeaturizerSpec(name="dictionary", kind=kind, d=D, k=None, seed=0, file_path=str(path),
                          trust_unstamped=False, parametrization="cayley",
                          stamp={"component": component, "layer": layer, "site": "target"},
                          saelens=saelens or {})


def _copy(name: str, tmp_path: Path, **cfg_changes) -> Path:
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target)
    config = json.loads((target / SAELENS_CONFIG).read_text())
    for key, value in cfg_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (target / SAELENS_CONFIG).write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return load_file(str(FIXTURES / "inputs.safetensors"))["x"]


@pytest.fixture(scope="module")
def expected() -> dict:
    return load_file(str(FIXTURES / "expected.safetensors"))


def _edit(f: torch.Tensor) -> torch.Tensor:
    """The edit write_fixtures.py applied at SAELens's hook_sae_acts_post."""
    edit = MANIFEST["edit"]
    out = f.clone()
    out[..., edit["zeroed"]] = 0.0
    out[..., edit["raised"]] = edit["raised_to"]
    return out


# 1. Every SAELens-written directory loads as it is and computes what SAELens computes.

@pytest.mark.parametrize("name", NAMES)
def test_a_saelens_directory_loads_without_a_stamp_as_the_architecture_saelens_reads(name):
    sae = build_featurizer(_spec(FIXTURES / name), "cpu")
    assert sae.architecture == MANIFEST["saes"][name]["architecture"]


@pytest.mark.parametrize("name", NAMES)
def test_a_saelens_directory_another_tool_wrote_keeps_its_rules_with_no_digest_and_no_note(name):
    # SAELens writes no stamp and no tensors_sha256: its cfg.json is its identity (docs/format.md §8.2),
    # and nothing is said to be unchecked, since no stamp promises a digest.
    notes = []
    check_bundle(_spec(FIXTURES / name), notes=notes)
    assert notes == []


@pytest.mark.parametrize("name", NAMES)
def test_latents_equal_saelens_encode_on_weekday_llama_activations(name, x, expected):
    sae = build_featurizer(_spec(FIXTURES / name), "cpu")
    f, err = sae.featurize(x)
    saelens_f = expected[f"{name}.latents"]
    assert torch.equal(f > 0, saelens_f > 0)  # the same latents fire
    assert (f - saelens_f).abs().max() <= TOLERANCE
    assert (x - err - expected[f"{name}.reconstruction"]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("name", NAMES)
def test_a_latent_edit_equals_saelens_error_term_forward_with_that_edit(name, x, expected):
    sae = build_featurizer(_spec(FIXTURES / name), "cpu")
    f, err = sae.featurize(x)
    assert (sae.inverse(_edit(f), err, x) - expected[f"{name}.edited"]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("name", NAMES)
def test_an_identity_write_through_a_saelens_directory_is_bit_exact(name, x, expected):
    sae = build_featurizer(_spec(FIXTURES / name), "cpu")
    f, err = sae.featurize(x)
    assert torch.equal(sae.inverse(f, err, x), x)
    # SAELens's own error-term forward returns x only to rounding:
    assert (expected[f"{name}.forward"] - x).abs().max() <= TOLERANCE


def test_a_pre_6_topk_cfg_is_read_as_topk_not_as_relu(x):
    sae = build_featurizer(_spec(FIXTURES / "pre6_topk"), "cpu")
    f, _ = sae.featurize(x)
    assert sae.architecture == "topk" and sae.k == 8
    assert ((f > 0).sum(-1) <= 8).all()


# 2. Each architecture against its own plain-torch oracle.

def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"W_enc": torch.randn(D, D_SAE, generator=g) / 8, "W_dec": torch.randn(D_SAE, D, generator=g) / 4,
            "b_enc": torch.randn(D_SAE, generator=g) / 10, "b_dec": torch.randn(D, generator=g),
            "threshold": torch.rand(D_SAE, generator=g) / 2, "b_gate": torch.randn(D_SAE, generator=g) / 10,
            "b_mag": torch.randn(D_SAE, generator=g) / 10, "r_mag": torch.randn(D_SAE, generator=g) / 4}


def _oracle(architecture: str, t: dict, x: torch.Tensor, k: int = 5, rescale: bool = False):
    """(f, decode(f)) written out here, one architecture at a time."""
    centred = x - t["b_dec"]
    decoder = t["W_dec"]
    if architecture == "gated":
        gate = (centred @ t["W_enc"] + t["b_gate"]) > 0
        magnitude = torch.clamp(centred @ (t["W_enc"] * torch.exp(t["r_mag"])) + t["b_mag"], min=0)
        f = torch.where(gate, magnitude, torch.zeros_like(magnitude))
    else:
        pre = centred @ t["W_enc"] + t["b_enc"]
        if architecture == "standard":
            f = torch.clamp(pre, min=0)
        elif architecture == "jumprelu":
            f = torch.where((pre > t["threshold"]) & (pre > 0), pre, torch.zeros_like(pre))
        else:
            norms = t["W_dec"].norm(dim=1)
            ranked = pre * norms if rescale else pre
            kth = ranked.sort(dim=-1, descending=True).values[..., k - 1:k]
            f = torch.where((ranked >= kth) & (ranked > 0), ranked, torch.zeros_like(ranked))
            if rescale:
                decoder = t["W_dec"] / norms[:, None]
    return f, f @ decoder + t["b_dec"]


CASES = {"standard": {}, "topk": {"k": 5}, "topk_rescaled": {"k": 5, "rescale_acts_by_decoder_norm": True},
         "jumprelu": {}, "gated": {}}


@pytest.mark.parametrize("case", list(CASES))
def test_each_architecture_matches_its_plain_torch_oracle_and_keeps_the_error_term(case):
    architecture = "topk" if case.startswith("topk") else case
    t = _tensors()
    names = {"standard": ("W_enc", "W_dec", "b_enc", "b_dec"), "topk": ("W_enc", "W_dec", "b_enc", "b_dec"),
             "jumprelu": ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"),
             "gated": ("W_enc", "W_dec", "b_dec", "b_gate", "b_mag", "r_mag")}[architecture]
    sae = ARCHITECTURES[architecture](**{n: t[n] for n in names}, **CASES[case])
    x = torch.randn(3, 7, D, generator=torch.Generator().manual_seed(1))
    f_want, decoded = _oracle(architecture, t, x, k=CASES[case].get("k", 5),
                              rescale=CASES[case].get("rescale_acts_by_decoder_norm", False))
    f, err = sae.featurize(x)
    assert f.shape == (3, 7, D_SAE)
    assert torch.allclose(f, f_want, atol=1e-6)  # float32 matmuls of width 64 on O(1) values
    assert torch.allclose(err, x - decoded, atol=1e-5)
    assert torch.equal(sae.inverse(f, err, x), x)
    edited = f.clone()
    edited[..., 2] += 1.0
    assert torch.allclose(sae.inverse(edited, err, x), _oracle_decode(t, edited, CASES[case]) + err, atol=1e-5)


def _oracle_decode(t: dict, f: torch.Tensor, case: dict) -> torch.Tensor:
    decoder = t["W_dec"]
    if case.get("rescale_acts_by_decoder_norm"):
        decoder = t["W_dec"] / t["W_dec"].norm(dim=1)[:, None]
    return f @ decoder + t["b_dec"]


# 3. The cfg is the identity: each field checked, each mismatch refused at the file path.

@pytest.mark.parametrize("changes", [
    {"metadata": {"hook_name": "blocks.2.hook_resid_post", "sae_lens_version": "6.54.12"}},
    {"metadata": {"hook_name": "blocks.1.hook_mlp_out", "sae_lens_version": "6.54.12"}},
    {"metadata": {"hook_name": "blocks.1.ln2.hook_normalized", "sae_lens_version": "6.54.12"}},
    {"d_in": 32}, {"d_sae": 256}, {"dtype": "bfloat16"},
    {"normalize_activations": "expected_average_only_in"}, {"architecture": "batchtopk"},
], ids=["other-layer", "other-component", "unknown-hook", "d-in", "d-sae", "dtype", "normalised",
        "unknown-architecture"])
def test_a_cfg_that_does_not_fit_its_tensors_or_the_site_is_refused_at_the_file_path(tmp_path, changes):
    directory = _copy("standard", tmp_path, **changes)
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory))
    assert refused.value.path == AT
    assert "\n" not in str(refused.value)


def test_a_pre_6_cfg_on_another_layer_is_refused_by_its_hook_point(tmp_path):
    directory = _copy("pre6_relu", tmp_path, hook_point="blocks.3.hook_resid_post")
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory))
    assert refused.value.path == AT and refused.value.message.startswith("hook_name:")


@pytest.mark.parametrize("hook,component", [("hook_resid_pre", "block_input"), ("hook_resid_mid", "block_mid"),
                                            ("hook_attn_out", "attention_output"), ("hook_mlp_out", "mlp_output")])
def test_each_saelens_hook_maps_to_its_causalab_component(tmp_path, hook, component):
    directory = _copy("standard", tmp_path, metadata={"hook_name": f"blocks.1.{hook}", "sae_lens_version": "6.54.12"})
    assert check_bundle(_spec(directory, component=component))["architecture"] == "standard"


def test_an_old_normalize_activations_false_reads_as_none():
    config = json.loads((FIXTURES / "pre6_relu" / SAELENS_CONFIG).read_text())
    assert config["normalize_activations"] is False and "architecture" not in config
    assert check_bundle(_spec(FIXTURES / "pre6_relu")) == {"architecture": "standard", "apply_b_dec_to_input": True}


def test_a_bare_saelens_weights_file_is_refused_unless_the_document_says_its_cfg(tmp_path, x, expected):
    bare = tmp_path / SAELENS_WEIGHTS
    shutil.copyfile(FIXTURES / "topk" / SAELENS_WEIGHTS, bare)
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(bare))
    assert refused.value.path == AT
    partial = {"architecture": "topk", "apply_b_dec_to_input": True, "normalize_activations": "none"}
    with pytest.raises(CompileError):
        check_bundle(_spec(bare, saelens=partial))  # a topk without k
    sae = build_featurizer(_spec(bare, saelens={**partial, "k": 8}), "cpu")
    assert (sae.featurize(x)[0] - expected["topk.latents"]).abs().max() <= TOLERANCE


# A field of the wrong JSON type: the fixture it is put in, the change, the field named.
WRONG_TYPES = {
    "architecture-list": ("standard", {"architecture": ["topk"]}, "architecture"),
    "architecture-object": ("standard", {"architecture": {"name": "topk"}}, "architecture"),
    "metadata-string": ("standard", {"metadata": "blocks.1.hook_resid_post"}, "metadata"),
    "pre-6-kwargs-list": ("pre6_topk", {"activation_fn_kwargs": [8]}, "activation_fn_kwargs"),
    "k-true": ("topk", {"k": True}, "k"),
    "pre-6-k-true": ("pre6_topk", {"activation_fn_kwargs": {"k": True}}, "activation_fn_kwargs.k"),
    "apply-b-dec-string": ("standard", {"apply_b_dec_to_input": "false"}, "apply_b_dec_to_input"),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_a_cfg_field_of_the_wrong_json_type_is_refused_naming_the_file_and_field(tmp_path, case):
    name, changes, field = WRONG_TYPES[case]
    directory = _copy(name, tmp_path, **changes)
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory))
    assert refused.value.path == AT
    assert refused.value.message.startswith(f"{directory / SAELENS_CONFIG}: {field} must be ")


def test_a_cfg_nested_past_the_parsers_depth_is_refused_as_unreadable(tmp_path):
    directory = _copy("standard", tmp_path)
    (directory / SAELENS_CONFIG).write_text("[" * 100_000)
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory))
    assert refused.value.path == AT
    assert refused.value.message.startswith(f"unreadable {directory / SAELENS_CONFIG}")


@pytest.mark.parametrize("name,changes", [("topk", {"k": D_SAE + 1}),
                                          ("pre6_topk", {"activation_fn_kwargs": {"k": 1000}})],
                         ids=["k", "pre-6-activation-fn-kwargs-k"])
def test_a_topk_k_above_d_sae_is_refused_at_compile_naming_k_and_d_sae(tmp_path, name, changes):
    directory = _copy(name, tmp_path, **changes)
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory))
    assert refused.value.path == AT and refused.value.message.startswith("k:")
    assert f"{D_SAE} latents (d_sae)" in refused.value.message
    every = _copy("topk", tmp_path / "every", k=D_SAE)  # k = d_sae keeps every latent
    assert check_bundle(_spec(every))["k"] == D_SAE


def test_a_saelens_folder_without_cfg_json_is_refused_naming_the_folder(tmp_path):
    directory = _copy("standard", tmp_path)
    (directory / SAELENS_CONFIG).unlink()
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory))
    assert refused.value.path == AT
    assert refused.value.message.startswith(f"no {directory / SAELENS_CONFIG}: ")


HOOKLESS = {"6": ("standard", {"metadata": {"sae_lens_version": "6.54.12"}}),
            "pre-6": ("pre6_relu", {"hook_point": None})}


@pytest.mark.parametrize("case", list(HOOKLESS))
def test_a_cfg_without_a_hook_name_is_refused_unless_the_document_block_says_it(tmp_path, case):
    name, changes = HOOKLESS[case]
    directory = _copy(name, tmp_path, **changes)
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(directory))
    assert refused.value.path == AT
    assert refused.value.message.startswith(f"{directory / SAELENS_CONFIG} has no hook_name")
    block = {"architecture": "standard", "apply_b_dec_to_input": True, "normalize_activations": "none"}
    here = _spec(directory, saelens={**block, "hook_name": "blocks.1.hook_resid_post"})
    assert check_bundle(here)["architecture"] == "standard"
    with pytest.raises(CompileError) as elsewhere:
        check_bundle(_spec(directory, saelens={**block, "hook_name": "blocks.2.hook_resid_post"}))
    assert elsewhere.value.message.startswith("hook_name:")


# 4. What causalab writes, SAELens's format, loads back as it was.

def test_write_saelens_dir_writes_what_causalab_loads_back_bit_for_bit(tmp_path, x, expected):
    tensors = load_file(str(FIXTURES / "jumprelu" / SAELENS_WEIGHTS))
    out = write_saelens_dir(tmp_path / "written", tensors,
                            {"architecture": "jumprelu", "hook_name": "blocks.1.hook_resid_post"})
    assert sorted(p.name for p in Path(out).iterdir()) == [SAELENS_CONFIG, SAELENS_WEIGHTS]
    back = load_file(str(Path(out) / SAELENS_WEIGHTS))
    assert set(back) == set(tensors) and all(torch.equal(back[n], tensors[n]) for n in tensors)
    sae = build_featurizer(_spec(out), "cpu")
    assert (sae.featurize(x)[0] - expected["jumprelu.latents"]).abs().max() <= TOLERANCE


def test_write_saelens_dir_refuses_a_hook_no_site_has_and_writes_nothing(tmp_path):
    tensors = load_file(str(FIXTURES / "standard" / SAELENS_WEIGHTS))
    with pytest.raises(CompileError):
        write_saelens_dir(tmp_path / "bad", tensors, {"hook_name": "blocks.1.hook_nowhere"})
    assert not (tmp_path / "bad").exists()


def test_write_saelens_dir_refuses_a_cfg_without_a_hook_as_it_would_not_load_back(tmp_path):
    tensors = load_file(str(FIXTURES / "standard" / SAELENS_WEIGHTS))
    with pytest.raises(CompileError) as refused:
        write_saelens_dir(tmp_path / "hookless", tensors, {})
    assert "has no hook_name" in refused.value.message
    assert not (tmp_path / "hookless").exists()


def test_a_plain_dictionary_file_without_cfg_still_needs_trust(tmp_path):
    path = tmp_path / "dictionary.safetensors"
    save_file(load_file(str(FIXTURES / "standard" / SAELENS_WEIGHTS)), str(path))
    with pytest.raises(CompileError) as refused:
        check_bundle(_spec(path))
    assert refused.value.path == AT


def test_the_engine_implements_exactly_the_vocabulary_architectures_with_their_tensor_names():
    from causalab.document.vocab import SAE_ARCHITECTURES

    assert set(ARCHITECTURES) == set(SAE_ARCHITECTURES)
    for name, row in SAE_ARCHITECTURES.items():
        sae = build_featurizer(_spec(FIXTURES / name), "cpu")
        assert sae.architecture == name and set(sae.tensors()) == set(row["tensors"])


# 5. A SAELens directory in a document on weekday-llama: compiled, refused, run.

WEEKDAY = {"key": "causalab:weekday-llama", "dtype": "fp32",
           "revision": "c4604b591ba897ff2414b9e6f0db15ea549df863b7a53ac46c3b47e833d7e9b8"}


def _document(directory: Path, layer: int = 1) -> dict:
    raw = json.loads((REPO / "documents" / "v2" / "sae_feature_ablation.json").read_text())
    raw["model"] = dict(WEEKDAY)
    raw["sites"]["target"]["layers"] = [layer]
    raw["featurizers"]["dictionary"] = {"kind": "sae", "file_path": str(directory)}
    raw["interventions"]["ablate"]["writes"]["ablate"]["features"] = [0]
    raw["steps"]["ablate"]["saves"].append({"value": "active", "file_path": "active.safetensors"})
    return raw


def test_a_document_whose_site_is_not_the_saes_hook_is_refused_at_compile_time():
    from causalab.pipeline import compile_only

    with pytest.raises(CompileError) as refused:
        compile_only(_document(FIXTURES / "topk", layer=2), str(REPO / "documents" / "data"))
    assert refused.value.path == AT and refused.value.message.startswith("hook_name:")


def test_latents_read_on_weekday_llama_equal_a_plain_forward_through_the_saelens_formula(tmp_path, oracle):
    from causalab.pipeline import run_document
    from causalab.models import resolve

    run_document(_document(FIXTURES / "jumprelu"), out=str(tmp_path), device_map="cpu",
                 data_root=str(REPO / "documents" / "data"))
    got = load_file(str(tmp_path / "active.safetensors"))["weight"]
    assert (got > 0).any() and (got == 0).any()  # some latents fire, the threshold stops others
    model, tokenizer = oracle(resolve("causalab:weekday-llama").path)
    t = load_file(str(FIXTURES / "jumprelu" / SAELENS_WEIGHTS))
    rows = json.loads((REPO / "documents" / "data" / "weekdays" / "train.json").read_text())
    for row, latents in zip(rows, got.reshape(len(rows), D_SAE), strict=True):
        with torch.no_grad():
            hidden = model(**tokenizer(row["input"], return_tensors="pt"), output_hidden_states=True)
        x = hidden.hidden_states[2][0, -1]  # the output of block 1: SAELens's blocks.1.hook_resid_post
        pre = (x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
        want = torch.where((pre > t["threshold"]) & (pre > 0), pre, torch.zeros_like(pre))
        assert (latents - want).abs().max() <= TOLERANCE


def test_a_pre_6_hook_z_sae_reads_the_attention_z_site(tmp_path):
    directory = _copy("pre6_relu", tmp_path, hook_point="blocks.1.attn.hook_z")
    assert check_bundle(_spec(directory, component="attention_z"))["architecture"] == "standard"
    with pytest.raises(CompileError):
        check_bundle(_spec(directory))  # block_output is not what it read


def test_explain_refuses_a_saelens_directory_off_its_hook_in_one_line(capsys, tmp_path):
    from causalab.cli.main import main

    document = tmp_path / "moved.json"
    document.write_text(json.dumps(_document(FIXTURES / "gated", layer=3)))
    status = main(["explain", str(document), "--data-root", str(REPO / "documents" / "data")])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1
    assert "featurizers.dictionary.file_path: hook_name:" in err


def test_a_saelens_folder_holding_nan_is_refused_before_the_run_writes_anything(tmp_path):
    from causalab.pipeline import run_document

    directory = _copy("standard", tmp_path / "sae")
    weights = load_file(str(directory / SAELENS_WEIGHTS))
    weights["W_enc"][3, 5] = float("nan")
    save_file(weights, str(directory / SAELENS_WEIGHTS))
    out = tmp_path / "out"
    with pytest.raises(CompileError) as refused:  # at compile, before any weight loads
        run_document(_document(directory), out=str(out), device_map="cpu",
                     data_root=str(REPO / "documents" / "data"))
    assert refused.value.path == AT and "bundle tensor W_enc holds 1 NaN" in refused.value.message
    assert not out.exists() or not any(out.iterdir())
