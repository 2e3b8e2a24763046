"""SAELens itself, live: it writes fresh directories causalab loads, and it loads what causalab
writes. Slow; ``make test-saelens`` builds SAELens's own venv (.venv-saelens: sae-lens needs
transformer-lens < 4, which cannot share causalab's venv) and points CAUSALAB_SAELENS_PYTHON at it.

Both directions compare on the weekday-llama activations of documents/artifacts/saelens, to
the tolerance of the fast suite (tests/engine/test_saelens.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from causalab.engine.featurizers import build_featurizer, write_saelens_dir
from test_saelens import FIXTURES, TOLERANCE, _edit, _spec

REPO = Path(__file__).resolve().parents[2]
PYTHON = os.environ.get("CAUSALAB_SAELENS_PYTHON", str(REPO / ".venv-saelens" / "bin" / "python"))
pytestmark = pytest.mark.slow

# Run by SAELens's python: load each directory named on the command line, encode x, save.
_ENCODE = """
import sys, torch
from safetensors.torch import load_file, save_file
from sae_lens import SAE
x = load_file(sys.argv[1])["x"]
out = {}
for directory in sys.argv[3:]:
    sae = SAE.load_from_disk(directory)
    with torch.no_grad():
        out[directory.rsplit("/", 1)[-1]] = sae.encode(x).contiguous()
    print(directory, type(sae).__name__)
save_file(out, sys.argv[2])
"""


def _saelens(*argv: str) -> str:
    if not Path(PYTHON).exists():
        pytest.skip(f"no SAELens venv at {PYTHON}: run `make test-saelens` (QUARANTINE.md)")
    done = subprocess.run([PYTHON, *argv], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_directories_saelens_writes_now_load_in_causalab_with_saelens_latents(tmp_path):
    shutil.copyfile(FIXTURES / "inputs.safetensors", tmp_path / "inputs.safetensors")
    _saelens(str(REPO / "scripts" / "saelens" / "write_fixtures.py"), str(tmp_path))
    x = load_file(str(tmp_path / "inputs.safetensors"))["x"]
    expected = load_file(str(tmp_path / "expected.safetensors"))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert len(manifest["saes"]) == 7
    for name, row in manifest["saes"].items():
        sae = build_featurizer(_spec(tmp_path / name), "cpu")
        assert sae.architecture == row["architecture"], name
        f, err = sae.featurize(x)
        assert (f - expected[f"{name}.latents"]).abs().max() <= TOLERANCE, name
        assert (sae.inverse(_edit(f), err, x) - expected[f"{name}.edited"]).abs().max() <= TOLERANCE, name
        assert torch.equal(sae.inverse(f, err, x), x)


def test_saelens_loads_what_causalab_writes_and_encodes_as_causalab_does(tmp_path):
    x = load_file(str(FIXTURES / "inputs.safetensors"))["x"]
    configs = {"standard": {}, "topk": {"architecture": "topk", "k": 8},
               "jumprelu": {"architecture": "jumprelu"}, "gated": {"architecture": "gated"}}
    written, ours = [], {}
    for name, cfg in configs.items():
        tensors = load_file(str(FIXTURES / name / "sae_weights.safetensors"))
        directory = write_saelens_dir(tmp_path / name, tensors,
                                      {"hook_name": "blocks.1.hook_resid_post", **cfg})
        written.append(directory)
        ours[name] = build_featurizer(_spec(directory), "cpu").featurize(x)[0]
    stdout = _saelens("-c", _ENCODE, str(FIXTURES / "inputs.safetensors"), str(tmp_path / "out.safetensors"),
                      *written)
    assert "TopKSAE" in stdout and "JumpReLUSAE" in stdout and "GatedSAE" in stdout
    theirs = load_file(str(tmp_path / "out.safetensors"))
    for name in configs:
        assert (ours[name] - theirs[name]).abs().max() <= TOLERANCE, name
