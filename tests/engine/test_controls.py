"""A fit on the random-init control says so, is refused where a trained fit is meant, and is
scored by a metric the control can express (docs/format.md §3, §7.8, §8.3).

The weekday Llama's rank-4 DAS (documents/known/das.json, one epoch) on its random-init twin:
the rotation's stamp names the control, its seed and the twin's own revision, which is the
tensor digest of transformers' initialisation of the same config under seed 0, built and hashed
here with hashlib. The interchange score is checked against a plain transformers forward of the
twin written here: the clean logit differences of the base and counterfactual prompts, with the
patched ones the run saved, give each row's (LD_patched - LD_base) / mean(LD_cf - LD_base).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import causalab.compile
from causalab.compile.explain import explain
from causalab.errors import CausalabError

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")


def _document(control: str | None) -> dict:
    document = json.loads((REPO / "documents" / "known" / "das.json").read_text())
    for name in ("rot", "random"):
        document["featurizers"][name]["k"] = 4
    document["steps"]["fit"]["epochs"] = 1
    document["steps"]["test"]["saves"].append({"value": "interchange",
                                               "file_path": "test_interchange.json"})
    if control:
        document["model"]["control"] = control
    return document


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> Path:
    from causalab.pipeline import run_document

    out = tmp_path_factory.mktemp("control")
    run_document(_document("random_init"), out=str(out), device_map="cpu", data_root=DATA)
    return out


def _twin():
    from transformers import AutoConfig, AutoModelForCausalLM

    from causalab.models import resolve

    path = resolve("causalab:weekday-llama").path
    torch.manual_seed(0)
    return path, AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).eval()


def _hashed(tensors: dict) -> str:
    sha = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous()
        sha.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def test_a_rotation_fitted_on_the_twin_carries_the_control_and_the_twin_s_revision(fitted):
    with safe_open(str(fitted / "rot.safetensors"), "pt") as handle:
        stamp = handle.metadata()
    trained = json.loads((REPO / "documents" / "known" / "das.json").read_text())["model"]
    assert stamp["model_control"] == "random_init" and stamp["model_control_seed"] == "0"
    assert stamp["model_revision"] == trained["revision"]  # what it was re-initialised from
    _, twin = _twin()
    assert stamp["model_control_revision"] == _hashed(twin.state_dict())
    assert stamp["model_control_revision"] != stamp["model_revision"]
    with safe_open(str(fitted / "train_loss.safetensors"), "pt") as handle:
        assert handle.metadata()["model_control"] == "random_init"  # every saved tensor


def _applying(bundle: Path, control: str | None) -> dict:
    document = json.loads((REPO / "documents" / "v2" / "das_apply.json").read_text())
    trained = json.loads((REPO / "documents" / "known" / "das.json").read_text())
    document["model"] = trained["model"]
    document["sites"] = trained["sites"]
    document["roles"] = trained["roles"]
    document["featurizers"]["rot"] = {"kind": "subspace", "k": 4, "file_path": str(bundle)}
    if control:
        document["featurizers"]["rot"]["control"] = control
    for step in document["steps"].values():
        if "rows" in step:
            step["rows"] = {role: "weekdays_full/data#test" for role in step["rows"]}
    return document


def test_the_twin_s_rotation_is_refused_where_a_trained_one_is_meant_unless_asked_for(fitted):
    bundle = fitted / "rot.safetensors"
    with pytest.raises(CausalabError) as refused:
        causalab.compile.compile_document(_applying(bundle, None), data_root=DATA)
    assert refused.value.path == ("featurizers", "rot", "file_path")
    assert "random_init" in str(refused.value)
    plan = causalab.compile.compile_document(_applying(bundle, "random_init"), data_root=DATA)
    assert "rot: subspace k=4 d=64 cayley loaded from" in explain(plan)
    assert "control=random_init (seed 0)" in explain(plan)


def test_a_trained_rotation_loads_on_the_twin_and_explain_names_the_control():
    trained = REPO / "documents" / "artifacts" / "weekday-llama" / "rot.safetensors"
    with safe_open(str(trained), "pt") as handle:
        stamp = handle.metadata()
    document = _applying(trained, None)
    document["featurizers"]["rot"]["k"] = int(stamp["k"])
    document["sites"]["target"] = {"component": stamp["component"],
                                   "layers": [int(stamp["layer"])]}
    document["model"]["control"] = "random_init"
    plan = causalab.compile.compile_document(document, data_root=DATA)
    assert explain(plan).splitlines()[0].startswith(
        "<root>: Plan  model=causalab:weekday-llama control=random_init")


def _clean_gaps(rows: list[dict]) -> tuple[list[float], list[float]]:
    """Each row's logit[cf_answer] - logit[base_answer] at the last token of its base and of its
    counterfactual prompt, on the twin, by a plain transformers forward."""
    from causalab.models import load_tokenizer

    path, twin = _twin()
    tokenizer = load_tokenizer(path)
    found = {"base": [], "cf": []}
    with torch.no_grad():
        for row in rows:
            a, b = (tokenizer(row[c], add_special_tokens=False)["input_ids"][0]
                    for c in ("cf_answer", "base_answer"))
            for name, prompt in (("base", row["input"]), ("cf", row["counterfactual_inputs"][0])):
                ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
                logits = twin(input_ids=ids).logits[0, -1]
                found[name].append(float(logits[a] - logits[b]))
    return found["base"], found["cf"]


def test_the_interchange_score_is_the_patched_move_across_the_twin_s_own_clean_gap(fitted):
    table = json.loads((Path(DATA) / "weekdays_full" / "data.json").read_text())
    rows = [row for row in table if row["split"] == "test"]
    base, cf = _clean_gaps(rows)
    gap = sum(c - b for b, c in zip(base, cf)) / len(rows)
    patched = {r["example_id"]: r["value"]
               for r in json.loads((fitted / "test_logit_diff.json").read_text())}
    scored = {r["example_id"]: r["value"]
              for r in json.loads((fitted / "test_interchange.json").read_text())}
    assert sorted(scored) == sorted(row["example_id"] for row in rows)
    for row, clean in zip(rows, base):
        expected = (patched[row["example_id"]] - clean) / gap
        assert scored[row["example_id"]] == pytest.approx(expected, rel=1e-4, abs=1e-4)
