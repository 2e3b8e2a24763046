"""Two absolute writes at one site compose when their features are disjoint (docs/format.md §7.4).

A swap of the counterfactual's latents 1 and 5 and a swap of 2.0 into latent 9, both through
the shipped 16 → 32 dictionary at block_output[0], run in document order; the oracle is the
plain transformers model with torch hooks and the dictionary's maths written out here. A pair
that shares a latent is refused naming both writes and the latent.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from causalab.document import validate
from causalab.errors import DocumentError

REPO = Path(__file__).resolve().parents[2]
SAE_FILE = REPO / "documents" / "artifacts" / "sae.safetensors"
FROM_CF, RAISED, RAISED_TO = [1, 5], [9], 2.0


def _document(kit, tiny, second_features) -> dict:
    document = kit.patching_document(tiny("tiny-llama"))
    document["featurizers"] = {"dictionary": {"kind": "sae", "file_path": str(SAE_FILE),
                                              "trust_unstamped": True}}
    body = document["interventions"]["patch"]
    body["reads"]["v_cf"]["featurizer"] = "dictionary"
    body["writes"] = {
        "patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf",
                  "featurizer": "dictionary", "features": FROM_CF},
        "raise": {"site": "target", "pos": -1, "mechanism": "swap", "operand": RAISED_TO,
                  "featurizer": "dictionary", "features": second_features},
    }
    body["models"]["patched"]["writes"] = ["patch", "raise"]
    return document


def _oracle_logits(model, tokenizer, kit, rows) -> torch.Tensor:
    """Each write on its own features, in order: x ↦ x + (f′ − f) W_dec, f = ReLU((x − b_dec) W_enc + b_enc)."""
    sae = load_file(str(SAE_FILE))
    W_enc, W_dec, b_enc, b_dec = (sae[n].double() for n in ("W_enc", "W_dec", "b_enc", "b_dec"))

    def encode(x):
        return torch.relu((x - b_dec) @ W_enc + b_enc)

    def swap(x, features, value):
        f = encode(x)
        edited = f.clone()
        edited[:, features] = value[:, features] if torch.is_tensor(value) else value
        return x + (edited - f) @ W_dec

    block = model.model.layers[0]
    store = {}

    def grab(module, args, output):
        store["f_cf"] = encode(output[:, -1].double())

    def put(module, args, output):
        out = output.clone()
        x = swap(out[:, -1].double(), FROM_CF, store["f_cf"])
        out[:, -1] = swap(x, RAISED, RAISED_TO).float()
        return out
    with torch.no_grad():
        for hook, role in ((grab, "counterfactual"), (put, "base")):
            prompts = [r["input"] if role == "base" else r["counterfactual_inputs"][0] for r in rows]
            handle = block.register_forward_hook(hook)
            try:
                logits = model(**kit.encode(tokenizer, prompts)).logits
            finally:
                handle.remove()
    return logits[:, -1]


def test_two_swaps_on_disjoint_sae_latents_at_one_site_compose_as_the_hooked_oracle(
        kit, tiny, oracle, tmp_path):
    rows = kit.pair_rows()
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    document = _document(kit, tiny, RAISED)
    plan = kit.run_compiled(document, data_root, tmp_path / "out")
    model, tokenizer = oracle(tiny("tiny-llama").path)
    want = _oracle_logits(model, tokenizer, kit, rows)
    ids = [tokenizer(r[c], add_special_tokens=False)["input_ids"][0]
           for r in rows for c in ("cf_answer", "base_answer")]
    diff = (want[torch.arange(len(rows)), ids[0::2]] - want[torch.arange(len(rows)), ids[1::2]])
    got = [row["value"] for row in json.loads((tmp_path / "out" / "logit_diff.json").read_text())]
    assert plan is not None and torch.allclose(torch.tensor(got, dtype=torch.float64),
                                               diff.double(), atol=1e-4)


def test_two_swaps_sharing_a_latent_are_refused_naming_both_writes_and_the_latent(kit, tiny):
    document = _document(kit, tiny, [9, 5])
    with pytest.raises(DocumentError) as refused:
        validate(document)
    assert refused.value.path == ("interventions", "patch", "models", "patched", "writes")
    assert "'patch'" in refused.value.message and "'raise'" in refused.value.message
    assert "features [5]" in refused.value.message
