"""Every kind of tensor file causalab saves reads back with its stamp (docs/format.md §8.3, §9.4).

Corpus documents on the tiny Llama, each cut to one short point, write a subspace (das), a gate
and a fit's mask and eval curve (dbm), a pca basis, a harvested dictionary as one file and as a
SAELens folder and a plain read (pca_harvest, extended), a loss curve and generated ids
(generate_probe). Each stamp names the point's digest as ``produced_by``, the site it was taken
at and the model; each bundle kind names its own parametrization; and each file's
``tensors_sha256`` equals SHA-256 over every tensor's name, dtype, shape and bytes, recomputed
here with hashlib from the tensors safetensors loads.
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "documents" / "v2"
DATA = str(REPO / "documents" / "data")
DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def _corpus(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.json").read_text())


def _digest_of(raw: dict) -> str:
    body = {k: v for k, v in raw.items() if k != "header"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _tensor_digests(path: Path) -> dict[str, str]:
    out = {}
    for name, tensor in load_file(str(path)).items():
        head = json.dumps([name, DTYPES[tensor.dtype], list(tensor.shape)], separators=(",", ":"))
        out[name] = hashlib.sha256(head.encode() + b"\0" + tensor.numpy().tobytes()).hexdigest()
    return out


def _stamp(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as handle:
        return dict(handle.metadata())


def _das() -> dict:
    raw = _corpus("das")
    raw["steps"]["fit"]["epochs"] = 1
    return raw


def _dbm() -> dict:
    raw = _corpus("dbm")
    fit = raw["steps"]["fit"]
    fit["objective"][1][0] = 0.01
    fit["epochs"] = 1
    fit["saves"].append({"value": "mask.mask", "file_path": "gate_mask.safetensors"})
    return raw


def _harvest() -> dict:
    raw = _corpus("pca_harvest")
    step = raw["steps"]["harvest"]
    step["outputs"].update(acts_all="acts", dictionary={"read": "acts", "reduce": "sae", "k": 8})
    step["saves"] += [{"value": "acts_all", "file_path": "acts.safetensors"},
                      {"value": "dictionary", "file_path": "dictionary.safetensors"},
                      {"value": "dictionary", "file_path": "dictionary"}]
    return raw


def _probe() -> dict:
    raw = _corpus("generate_probe")
    raw["interventions"]["probe"]["reads"]["logits"]["pos"]["index"] = 0  # one point
    return raw


# (document, file, its kind, its parametrization or None for a plain save, the site or "")
FILES = [
    (_das, "export/rot.safetensors", "subspace", "cayley", "target"),
    (_das, "fit/train_loss.safetensors", "tensor", None, ""),
    (_dbm, "export/mask.safetensors", "gate", "sigmoid_logits", "target"),
    (_dbm, "fit/gate_mask.safetensors", "tensor", None, "target"),
    (_dbm, "fit/train_eval.safetensors", "tensor", None, ""),
    (_harvest, "harvest/pca.safetensors", "pca", "basis", "target"),
    (_harvest, "harvest/dictionary.safetensors", "sae", "saelens", "target"),
    (_harvest, "harvest/dictionary/sae_weights.safetensors", "sae", "saelens", "target"),
    (_harvest, "harvest/acts.safetensors", "tensor", None, "target"),
    (_probe, "probe/generated.safetensors", "tensor", None, ""),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each document run once: builder -> (raw document, output folder)."""
    from causalab.pipeline import run_document

    done = {}
    for build in {entry[0] for entry in FILES}:
        raw = build()
        out = tmp_path_factory.mktemp("out")
        run_document(copy.deepcopy(raw), out=str(out), device_map="cpu", data_root=DATA)
        done[build] = (raw, out)
    return done


def _found(out: Path, relative: str) -> Path:
    """A save's path: under the step's folder, or at the top when a step writes there."""
    nested = out / relative
    return nested if nested.exists() else out / relative.split("/", 1)[1]


@pytest.mark.parametrize("build,relative,kind,parametrization,site", FILES,
                         ids=[entry[1].replace("/", "-") for entry in FILES])
def test_a_saved_tensor_file_reads_back_with_its_stamp_and_digest(runs, build, relative, kind,
                                                                   parametrization, site):
    raw, out = runs[build]
    path = _found(out, relative)
    stamp = _stamp(path)
    assert stamp["kind"] == kind and stamp["produced_by"] == _digest_of(raw)
    assert stamp["site"] == site and stamp["model_key"] == raw["model"]["key"]
    assert stamp["model_revision"] == raw["model"]["revision"] and stamp["engine"] == "causalab"
    if site:
        declared = raw["sites"][site]
        assert stamp["component"] == declared["component"]
        assert stamp["layer"] == str(declared["layers"][0])
    assert stamp.get("parametrization") == parametrization
    assert json.loads(stamp["tensors_sha256"]) == _tensor_digests(path)
