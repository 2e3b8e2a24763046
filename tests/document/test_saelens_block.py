"""A featurizer's ``saelens`` block: the cfg.json fields of a SAELens weights file that has none."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from causalab.document import validate
from causalab.errors import DocumentError

CORPUS = Path(__file__).resolve().parents[2] / "documents" / "v2"
BLOCK = {"architecture": "topk", "k": 8, "apply_b_dec_to_input": True, "normalize_activations": "none"}


def _document(**featurizer) -> dict:
    raw = json.loads((CORPUS / "sae_feature_ablation.json").read_text())
    raw["featurizers"]["dictionary"].update(featurizer)
    return raw


def test_a_complete_saelens_block_validates():
    validate(_document(saelens=BLOCK))


@pytest.mark.parametrize("change,where", [
    ({"k": None}, ("saelens", "k")),
    ({"architecture": "standard"}, ("saelens", "k")),
    ({"normalize_activations": "layer_norm"}, ("saelens", "normalize_activations")),
    ({"architecture": "batchtopk"}, ("saelens", "architecture")),
], ids=["topk-without-k", "k-without-topk", "normalised", "unknown-architecture"])
def test_an_incomplete_or_unimplemented_saelens_block_is_refused_at_its_path(change, where):
    block = {key: value for key, value in {**BLOCK, **change}.items() if value is not None}
    with pytest.raises(DocumentError) as refused:
        validate(_document(saelens=block))
    assert refused.value.path[:len(where) + 2] == ("featurizers", "dictionary", *where)


def test_a_saelens_block_on_a_rotation_is_refused():
    raw = json.loads((CORPUS / "das_apply.json").read_text())
    raw["featurizers"]["rot"]["saelens"] = BLOCK
    with pytest.raises(DocumentError) as refused:
        validate(raw)
    assert refused.value.path[:3] == ("featurizers", "rot", "saelens")


def test_saelens_cfg_defaults_are_written_in_the_vocabulary_alone():
    package = Path(__file__).resolve().parents[2] / "causalab"
    restated = re.compile(r"(apply_b_dec_to_input|rescale_acts_by_decoder_norm)"
                          r"(\"?, |[^,(\n]{0,20}\W)(True|False)\b"
                          r"|\"architecture\", \"standard\"|\"reshape_activations\"\)? or \"none\"")
    found = [f"{p.relative_to(package)}: {m.group(0)}" for p in sorted(package.rglob("*.py"))
             if p.name != "vocab.py" for m in restated.finditer(p.read_text(encoding="utf-8"))]
    assert not found, found
