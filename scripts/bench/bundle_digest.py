"""What checking a bundle's tensor digest costs against a SmolLM2-135M run that loads it.

A random SAELens-shaped dictionary for SmolLM2's residual stream (``W_enc`` (576, d_sae),
``W_dec``, ``b_enc``, ``b_dec``; 16,384 latents by default, 75 MB, the size of a published
SmolLM2 SAE) is written the way causalab writes every bundle (``record.write_safetensors``:
its ``tensors_sha256`` digest in the metadata), then one SmolLM2 document ablates a latent
through it at block_output[12] on the IOI table. Timed in one process, after a warm-up:
``causalab run`` end to end (compile, model load, the pass, the saves), and the digest and
finiteness check on its own (compile/bundles/integrity.py, read from the page cache, as the run reads
it). Printed: both times and the check's share of the run (docs/format.md §8.3).

    .venv/bin/python scripts/bench/bundle_digest.py [--latents 16384] [--rows 120]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "documents" / "data"
sys.path.insert(0, str(REPO))


def _dictionary(path: Path, d: int, latents: int) -> None:
    from causalab.engine import record

    generator = torch.Generator().manual_seed(0)
    w_enc = torch.randn(d, latents, generator=generator) / d ** 0.5
    tensors = {"W_enc": w_enc, "W_dec": w_enc.T.contiguous(), "b_enc": torch.zeros(latents),
               "b_dec": torch.zeros(d)}
    record.write_safetensors(path, tensors)


def _document(bundle: Path, rows: int, data_root: Path) -> dict:
    raw = json.loads((REPO / "documents" / "real" / "ioi_layer_sweep.json").read_text())
    table = json.loads((DATA / "ioi" / "data.json").read_text())[:rows]
    (data_root / "ioi").mkdir(parents=True, exist_ok=True)
    (data_root / "ioi" / "data.json").write_text(json.dumps(table))
    raw["sites"]["target"]["layers"] = [12]
    raw["featurizers"] = {"sae": {"kind": "sae", "file_path": str(bundle),
                                  "trust_unstamped": True}}
    body = raw["interventions"]["patch"]
    pos = {"index": -1, "scope": {"variable": "END"}}
    body["reads"] = {"logits": body["reads"]["logits"]}
    body["writes"] = {"patch": {"site": "target", "pos": pos, "mechanism": "swap", "operand": 0.0,
                                "featurizer": "sae", "features": [0]}}
    body["metrics"] = {"logit_diff": body["metrics"]["logit_diff"]}
    raw["steps"]["patch"]["saves"] = [{"value": "logit_diff", "file_path": "logit_diff.json"}]
    return raw


def _check_seconds(bundle: Path, repeats: int) -> float:
    from causalab.compile.bundles import integrity
    from causalab.compile.bundles.checks import read_header

    times = []
    for _ in range(repeats):
        integrity._checked.cache_clear()  # each time read and hashed anew
        header = read_header(str(bundle))
        started = time.perf_counter()
        integrity.check_tensors(str(bundle), header, ("bench",))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latents", type=int, default=16384)
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from causalab.pipeline import run_document

    with tempfile.TemporaryDirectory(prefix="causalab-digest-bench-") as scratch:
        root = Path(scratch)
        bundle = root / "sae.safetensors"
        _dictionary(bundle, 576, args.latents)
        raw = _document(bundle, args.rows, root / "data")
        run_document(raw, out=str(root / "warm"), device_map="cpu", data_root=str(root / "data"))
        started = time.perf_counter()
        run_document(raw, out=str(root / "out"), device_map="cpu", data_root=str(root / "data"))
        run_s = time.perf_counter() - started
        check_s = _check_seconds(bundle, args.repeats)
        size = bundle.stat().st_size / 2 ** 20
    print(f"SmolLM2-135M, {args.rows} rows, sae of {args.latents} latents ({size:.0f} MiB): "
          f"run {run_s:.2f} s, digest + finiteness check {check_s * 1e3:.0f} ms "
          f"= {100 * check_s / run_s:.2f} % of the run")


if __name__ == "__main__":
    main()
