"""SAELens-written fixture directories and SAELens's own outputs on weekday-llama activations.

Run in a venv with sae-lens (``make saelens-fixtures`` makes .venv-saelens and runs both halves), after
scripts/saelens/activations.py has written the inputs:

    .venv-saelens/bin/python scripts/saelens/write_fixtures.py documents/artifacts/saelens

For each architecture SAELens builds an SAE at ``blocks.1.hook_resid_post`` (weekday-llama,
d_in 64, d_sae 128) from a fixed seed and writes it with its own ``save_model``. The two
pre-6.0 directories hold the standard and TopK weights as SAELens wrote them under a cfg.json
in the old format (``activation_fn_str``, ``hook_point``, no ``architecture``, no version),
which SAELens 6 still reads. Every directory is then loaded back with
``SAE.load_from_disk`` and SAELens computes, on the inputs' ``x``: ``encode`` (latents),
``decode`` (reconstruction) and its error-term forward with and without a latent edit (the
EDIT below, applied at ``hook_sae_acts_post``). These go to expected.safetensors as
``<name>.<output>``; manifest.json records the class SAELens chose for each directory.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import sae_lens
from sae_lens import SAE

D_IN, D_SAE, K, HOOK = 64, 128, 8, "blocks.1.hook_resid_post"
ZEROED, RAISED, RAISED_TO = (0, 1, 2, 3), 5, 1.5
CURRENT = ("standard", "topk", "topk_rescaled", "jumprelu", "gated")


def edit(f: torch.Tensor) -> torch.Tensor:
    """The latent edit every fixture records: latents 0-3 off, latent 5 set to 1.5."""
    out = f.clone()
    out[..., list(ZEROED)] = 0.0
    out[..., RAISED] = RAISED_TO
    return out


def _config(name: str) -> dict:
    base = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu",
            "apply_b_dec_to_input": True, "metadata": {"hook_name": HOOK, "model_name": "weekday-llama"}}
    if name.startswith("topk"):
        return {**base, "architecture": "topk", "k": K,
                "rescale_acts_by_decoder_norm": name == "topk_rescaled"}
    return {**base, "architecture": name}


def _build(name: str, x: torch.Tensor, seed: int) -> SAE:
    torch.manual_seed(seed)
    sae = SAE.from_dict(_config(name))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(D_IN, D_SAE, generator=g) / D_IN ** 0.5)
        norms = 0.5 + torch.rand(D_SAE, 1, generator=g)  # rows not unit: rescaling matters
        sae.W_dec.copy_(sae.W_enc.T / sae.W_enc.T.norm(dim=-1, keepdim=True) * norms)
        sae.b_dec.copy_(x.mean(0) + 0.1 * torch.randn(D_IN, generator=g))
        for bias in ("b_enc", "b_gate", "b_mag"):
            if isinstance(getattr(sae, bias, None), torch.nn.Parameter):
                getattr(sae, bias).copy_(0.2 * torch.randn(D_SAE, generator=g) - 0.1)
        if isinstance(getattr(sae, "r_mag", None), torch.nn.Parameter):
            sae.r_mag.copy_(0.3 * torch.randn(D_SAE, generator=g))
        if isinstance(getattr(sae, "threshold", None), torch.nn.Parameter):
            pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
            sae.threshold.copy_(pre.std(0) * torch.rand(D_SAE, generator=g))
    return sae


def _old_config(name: str) -> dict:
    """A pre-6.0 cfg.json: the keys SAELens 3.x-5.x wrote, no version, no architecture."""
    old = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu",
           "model_name": "weekday-llama", "hook_point": HOOK, "hook_point_layer": 1,
           "hook_point_head_index": None, "apply_b_dec_to_input": True,
           "finetuning_scaling_factor": False, "context_size": 16, "dataset_path": "",
           "activation_fn_str": "relu", "normalize_activations": False}
    if name == "pre6_topk":
        old.update(activation_fn_str="topk", activation_fn_kwargs={"k": K},
                   normalize_activations="none")
    return old


def _outputs(sae: SAE, x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        latents = sae.encode(x)
        out = {"latents": latents, "reconstruction": sae.decode(latents)}
        sae.use_error_term = True
        out["forward"] = sae(x)
        sae.hook_sae_acts_post.add_hook(lambda acts, hook: edit(acts))
        out["edited"] = sae(x)
        sae.reset_hooks()
    return out


def main(root: str) -> None:
    root_path = Path(root)
    x = load_file(str(root_path / "inputs.safetensors"))["x"]
    for seed, name in enumerate(CURRENT):
        _build(name, x, seed).save_model(root_path / name)
    for name, source in (("pre6_relu", "standard"), ("pre6_topk", "topk")):
        target = root_path / name
        target.mkdir(exist_ok=True)
        shutil.copyfile(root_path / source / "sae_weights.safetensors", target / "sae_weights.safetensors")
        (target / "cfg.json").write_text(json.dumps(_old_config(name)))
    expected, manifest = {}, {"sae_lens": sae_lens.__version__, "edit": {
        "zeroed": list(ZEROED), "raised": RAISED, "raised_to": RAISED_TO}, "saes": {}}
    for name in CURRENT + ("pre6_relu", "pre6_topk"):
        sae = SAE.load_from_disk(root_path / name)
        manifest["saes"][name] = {"class": type(sae).__name__, "architecture": sae.cfg.architecture()}
        for key, value in _outputs(sae, x).items():
            expected[f"{name}.{key}"] = value.contiguous()
    save_file(expected, str(root_path / "expected.safetensors"))
    (root_path / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(json.dumps(manifest["saes"]))


if __name__ == "__main__":
    main(sys.argv[1])
