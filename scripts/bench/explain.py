"""Benchmark: ``causalab explain`` of the 96-point head-patching document, each in a fresh process.

``documents/real/weekdays_head_patching.json`` sweeps 3 layers x 32 heads of Llama-3.2-1B over
42 weekday pairs. Offline, it is compiled against a stand-in directory of the same shape (the
config numbers of Llama-3.2-1B around the built-in tokenizer, as tests/compile does); no weights
are read. Printed, as medians over fresh processes: the CLI's import time, ``explain`` (text
and ``--json``), and the same explain with transformers imported first (what reading the
config and tokenizer through transformers costs); then ratios and the 1.5 s target.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/explain.py [samples]
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TARGET_S = 1.5


def _stand_in(folder: Path) -> Path:
    """A config-and-tokenizer directory of Llama-3.2-1B's shape, and the document pointed at it."""
    from causalab.models.readers import LLAMA_3_2_1B_SHAPE, shape_stand_in

    model = shape_stand_in(folder / "llama_3_2_1b_shape", LLAMA_3_2_1B_SHAPE)
    document = json.loads((ROOT / "documents/real/weekdays_head_patching.json").read_text())
    document["model"]["key"] = model
    path = folder / "head_patching.json"
    path.write_text(json.dumps(document))
    return path


def _wall(code: str, samples: int) -> float:
    """Median wall seconds of ``python -c code`` in a fresh process, from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(samples: int) -> None:
    with tempfile.TemporaryDirectory(prefix="causalab-bench-explain-") as folder:
        document = _stand_in(Path(folder))
        explain = f"from causalab.cli.main import main; raise SystemExit(main(['explain', {str(document)!r}"
        python = _wall("pass", samples)
        cli = _wall("import causalab.cli.main", samples)
        text = _wall(explain + "]))", samples)
        as_json = _wall(explain + ", '--json']))", samples)
        with_transformers = _wall("import transformers; transformers.PreTrainedTokenizerFast; "
                                  "transformers.AutoConfig; " + explain + "]))", samples)
    print(f"explain of the 96-point head-patching document, medians of {samples} fresh processes")
    print(f"python start   {python:.3f} s")
    print(f"cli import     {cli:.3f} s")
    print(f"explain        {text:.3f} s   (--json {as_json:.3f} s)")
    print(f"with transformers imported first {with_transformers:.3f} s")
    print(f"ratio explain / with transformers {text / with_transformers:.2f}")
    verdict = "ok" if text <= TARGET_S else "over"
    print(f"target explain <= {TARGET_S} s: {verdict}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
