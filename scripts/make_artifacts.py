"""Write the small bundles under documents/artifacts/ that corpus documents load (docs/format.md §16.1).

* ``sae.safetensors``: a random 16 -> 32 dictionary in SAELens names and orientations
  (``W_enc`` (16, 32), ``W_dec`` (32, 16), ``b_enc`` (32,), ``b_dec`` (16,)), drawn from a fixed
  seed and deliberately unstamped, so a document must say ``trust_unstamped: true``.
* ``pca.safetensors``: the stamped k 4 basis, made by running documents/v2/pca_harvest.json.
* ``rot.safetensors``: the stamped (16, 8) rotation, made by running documents/v2/das.json.

The last two run the documents through ``causalab.pipeline`` on the CPU, so they need the engine
and the built-in tiny Llama; the first needs only torch and safetensors.

    .venv/bin/python scripts/make_artifacts.py sae pca rot
"""
from __future__ import annotations

import argparse
import sys
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "documents" / "artifacts"
SAE_D, SAE_K, SAE_SEED = 16, 32, 0
# Which saved file of which corpus document becomes which artifact.
FROM_DOCUMENTS = {
    "pca": ("documents/v2/pca_harvest.json", "pca.safetensors"),
    "rot": ("documents/v2/das.json", "rot.safetensors"),
}


def make_sae(target: Path) -> Path:
    """A reproducible random dictionary: columns of W_enc unit-norm, W_dec their transpose."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(SAE_SEED)
    w_enc = torch.randn(SAE_D, SAE_K, generator=generator)
    w_enc = w_enc / w_enc.norm(dim=0, keepdim=True)
    tensors = {
        "W_enc": w_enc.contiguous(),
        "W_dec": w_enc.T.contiguous(),
        "b_enc": torch.zeros(SAE_K),
        "b_dec": 0.1 * torch.randn(SAE_D, generator=generator),
    }
    save_file(tensors, str(target))
    return target


def keep_save(raw: dict, saved: str, target: Path) -> Path:
    """Run ``raw`` on the CPU into a scratch folder and keep the one bundle it saves."""
    from causalab.pipeline import run_document

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        run_document(raw, out=scratch, device_map="cpu",
                     data_root=str(REPO / "documents" / "data"))
        shutil.copyfile(Path(scratch) / saved, target)
    return target


def make_from_document(document: str, saved: str, target: Path) -> Path:
    """Run the shipped ``document`` and keep the one bundle it saves."""
    from causalab.document import load_json

    return keep_save(load_json(str(REPO / document)), saved, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=["sae", *FROM_DOCUMENTS])
    args = parser.parse_args()
    # A checkout without `make setup` has no installed package: run against this tree.
    sys.path.insert(0, str(REPO))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        target = ARTIFACTS / f"{name}.safetensors"
        if name == "sae":
            make_sae(target)
        else:
            make_from_document(*FROM_DOCUMENTS[name], target)
        print(target.relative_to(REPO))


if __name__ == "__main__":
    main()
