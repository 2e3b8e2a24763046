"""Harvest-then-apply in one document on the tiny Llama, against a plain transformers forward
with torch hooks: a PCA basis and a trained dictionary published by a harvest step are the
featurizers the next step patches through."""
from __future__ import annotations

import json

import pytest
import torch

from causalab.engine.bundle_files import read_bundle

# An SVD of the same fp32 vectors by another routine moves the basis by ~1e-6; the patched
# logits inherit that through two 16-wide matmuls, so 1e-5 absolute is the bound.
TOL = dict(atol=1e-5, rtol=1e-5)


def _document(kit, resolved, kind: str, k: int) -> dict:
    doc = kit.patching_document(resolved)
    patch = doc["interventions"]["patch"]
    for node in (patch["reads"]["v_cf"], patch["writes"]["patch"]):
        node["featurizer"] = "learned"
    source = {"kind": kind, "file_path": "steps:harvest/learned"}
    doc["featurizers"] = {"learned": {**source, "k": k} if kind == "pca" else source}
    doc["interventions"]["harvest"] = {
        "reads": {"acts": {"site": "target", "pos": {"all": True}, "input": "base"}}}
    doc["steps"] = {"harvest": {"kind": "observe", "interventions": "harvest",
                                "rows": {"base": "pairs"},
                                "outputs": {"learned": {"read": "acts", "reduce": kind, "k": k}},
                                "saves": [{"value": "learned", "file_path": "learned.safetensors"}]},
                    **doc["steps"]}
    return doc


def _oracle(model, kit, tokenizer, new_last):
    """Base logits at the last token with block 0's last output replaced by
    ``new_last(x_base, x_cf)``; also block 0's output at every base prompt token."""
    base = kit.encode(tokenizer, [p[0] for p in kit.PAIRS])
    cf = kit.encode(tokenizer, [p[1] for p in kit.PAIRS])
    store = {}

    def keep(name):
        def post(module, args, output):
            store[name] = output[0] if isinstance(output, tuple) else output
        return post

    def replace(module, args, output):
        tensor = (output[0] if isinstance(output, tuple) else output).clone()
        tensor[:, -1] = new_last(tensor[:, -1], store["cf"][:, -1])
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

    layer = model.model.layers[0]
    with torch.no_grad():
        for name, enc in (("cf", cf), ("base", base)):
            handle = layer.register_forward_hook(keep(name))
            model(**enc)
            handle.remove()
        handle = layer.register_forward_hook(replace)
        logits = model(**base).logits[:, -1]
        handle.remove()
    # {"all": true} reads the prompt's own tokens: not padding, not the BOS the tokenizer adds
    text = base["attention_mask"].bool() & (base["input_ids"] != tokenizer.bos_token_id)
    return logits, store["base"][text]


def test_a_harvested_pca_basis_patches_as_the_projection_of_the_hook_oracle(tiny, oracle, kit,
                                                                             tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = kit.run_compiled(_document(kit, resolved, "pca", 3), data_root, tmp_path / "out")
    got = kit.step(plan, "patch").results["reads"]["logits"][:, 0]
    _, placed = _oracle(model, kit, tokenizer, lambda x, v: x)
    centred = placed - placed.mean(0)
    q = torch.linalg.svd(centred.double(), full_matrices=False)[2][:3].T.float()
    want, _ = _oracle(model, kit, tokenizer, lambda x, v: x + (v - x) @ q @ q.T)
    assert torch.allclose(got, want, **TOL)
    metadata, _ = read_bundle(str(tmp_path / "out" / "learned.safetensors"))
    assert (metadata["kind"], metadata["k"], metadata["layer"]) == ("pca", "3", "0")


def test_a_dictionary_trained_by_reduce_sae_reconstructs_its_harvest_and_swaps_its_latents(
        tiny, oracle, kit, tmp_path):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    plan = kit.run_compiled(_document(kit, resolved, "sae", 32), data_root, tmp_path / "out")
    metadata, sae = read_bundle(str(tmp_path / "out" / "learned.safetensors"))
    assert (metadata["kind"], metadata["k"], metadata["d"]) == ("sae", "32", "16")
    assert {name: tuple(t.shape) for name, t in sae.items()} == {
        "W_enc": (16, 32), "W_dec": (32, 16), "b_enc": (32,), "b_dec": (16,)}

    def encode(x):
        return torch.relu((x - sae["b_dec"]) @ sae["W_enc"] + sae["b_enc"])

    _, placed = _oracle(model, kit, tokenizer, lambda x, v: x)
    residual = placed - (encode(placed) @ sae["W_dec"] + sae["b_dec"])
    unexplained = residual.pow(2).sum() / (placed - placed.mean(0)).pow(2).sum()
    assert unexplained < 0.05  # a trained dictionary, not a random one (which leaves ~1)
    want, _ = _oracle(model, kit, tokenizer,
                      lambda x, v: x + (encode(v) - encode(x)) @ sae["W_dec"])
    got = kit.step(plan, "patch").results["reads"]["logits"][:, 0]
    assert torch.allclose(got, want, **TOL)
    rows = json.loads((tmp_path / "out" / "iia.json").read_text())
    assert [r["eligible"] for r in rows] == [True] * len(kit.PAIRS)


def test_a_dictionary_saved_to_a_folder_is_written_as_saelens_writes_one_and_loads_back(
        tiny, kit, tmp_path):
    from safetensors import safe_open

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = _document(kit, resolved, "sae", 32)
    document["steps"]["harvest"]["saves"] = [{"value": "learned", "file_path": "sae"}]
    first = kit.run_compiled(document, data_root, tmp_path / "out")
    folder = tmp_path / "out" / "sae"
    assert sorted(p.name for p in folder.iterdir()) == ["cfg.json", "sae_weights.safetensors"]
    cfg = json.loads((folder / "cfg.json").read_text())
    # SAELens >= 6 reads these keys; block 0's output is its hook_resid_post at layer 0.
    assert (cfg["architecture"], cfg["d_in"], cfg["d_sae"], cfg["dtype"]) == ("standard", 16, 32,
                                                                              "float32")
    assert cfg["metadata"]["hook_name"] == "blocks.0.hook_resid_post"
    with safe_open(str(folder / "sae_weights.safetensors"), "pt") as handle:
        assert handle.metadata()["kind"] == "sae"
        saved = {name: handle.get_tensor(name) for name in handle.keys()}
    _, published = read_bundle(str(tmp_path / "out" / "sae" / "sae_weights.safetensors"))
    assert set(saved) == {"W_enc", "W_dec", "b_enc", "b_dec"}
    # The same dictionary applied from the folder in a second document patches the same logits.
    again = _document(kit, resolved, "sae", 32)
    again["featurizers"]["learned"] = {"kind": "sae", "file_path": str(folder)}
    del again["steps"]["harvest"]
    second = kit.run_compiled(again, data_root, tmp_path / "again")
    want = kit.step(first, "patch").results["reads"]["logits"]
    assert torch.equal(kit.step(second, "patch").results["reads"]["logits"], want)
    assert all(torch.equal(saved[n], published[n]) for n in saved)


def test_a_dictionary_of_a_head_site_saved_to_a_folder_is_refused_at_its_save(tiny, kit, tmp_path):
    from causalab.errors import CompileError

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = _document(kit, resolved, "sae", 8)
    document["sites"]["heads"] = {"component": "attention_premix", "layers": [0], "heads": [0]}
    document["interventions"]["harvest"]["reads"]["acts"]["site"] = "heads"
    document["steps"]["harvest"]["saves"] = [{"value": "learned", "file_path": "sae"}]
    del document["steps"]["patch"], document["interventions"]["patch"]
    document["featurizers"] = {}
    import causalab.compile

    with pytest.raises(CompileError) as refused:
        causalab.compile.compile_document(document, data_root=data_root)
    assert refused.value.path == ("steps", "harvest", "saves", 0, "file_path")
    assert "SAELens hook" in refused.value.message
    assert not (tmp_path / "out" / "sae").exists()
