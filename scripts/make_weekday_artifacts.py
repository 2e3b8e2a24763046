"""Write the weekday models' bundles under documents/artifacts/weekday-<family>/, the files
`experiment=das_apply` and `experiment=sae_ablation` load on model=llama, gpt2, gemma2, qwen2.

* ``rot.safetensors``: a rank-8 DAS rotation at the last token leaving block 0 (where the day
  sits on these models), fitted by `experiment=das site=resid site.rank=8`.
* ``sae.safetensors``: a 32-latent dictionary trained at the same site on every prompt token of
  the training pairs, by `experiment=compare method=sae` (``reduce: sae``), stamped.

Each is made by composing the shipped conf and running it on the CPU through
``causalab.pipeline``, so it needs the engine and the built-in weekday models.

    .venv/bin/python scripts/make_weekday_artifacts.py llama gpt2 gemma2 qwen2
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "documents" / "artifacts"
SITE = ["site=resid", "site.layer=0", "site.pos=-1"]
# artifact -> (overrides that make it, the file the run saves)
RECIPES = {
    "rot": (["experiment=das", *SITE, "site.rank=8"], "rot.safetensors"),
    # One stamped file (method=sae itself saves a SAELens folder), as sae_ablation loads it.
    "sae": (["experiment=compare", "method=sae", *SITE, "method.latents=32",
             "steps.harvest.saves=[{value:dictionary,file_path:sae.safetensors}]"],
            "sae.safetensors"),
}


def make(family: str, name: str) -> Path:
    """Run one recipe on ``model=<family>`` and keep the bundle it saves."""
    from causalab.hydra.rendering import render
    from make_artifacts import keep_save

    overrides, saved = RECIPES[name]
    target = ARTIFACTS / f"weekday-{family}" / f"{name}.safetensors"
    return keep_save(render([*overrides, f"model={family}"]), saved, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="+", choices=["llama", "gpt2", "gemma2", "qwen2"])
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    for family in args.families:
        for name in RECIPES:
            print(make(family, name).relative_to(REPO))


if __name__ == "__main__":
    main()
