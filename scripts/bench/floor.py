"""The memory budget's floor, measured: each built-in refused below it, held at it.

For each built-in (``causalab:<name>``, in the run's dtype) the corpus patching document
(documents/v2/patching.json, its model swapped) runs through ``causalab run`` in a fresh
process, tracked to a scratch SQLite store as the command line does by default:

1. ``--memory`` at the weights + 10 %: refused before the model loads, in one line naming
   the floor, the weights and the budget (and the least budget that holds them);
2. ``--memory`` at that least budget (the smallest the run accepts; named again by a refusal
   when this process's runtime came out a few MiB larger): the process's peak
   resident set (the child's own ``VmHWM`` as it exits) against the budget, and what
   the run held beyond its runtime and weights (what ``memory.LOAD_MARGIN`` must cover).

It ends with one line ``FLOOR …``: per built-in the peak over the budget, and the largest
over all, which must stay at or under 1.05 (``memory.PEAK_SLACK``).

    .venv/bin/python scripts/bench/floor.py                        # every built-in
    .venv/bin/python scripts/bench/floor.py --models tiny-llama,smollm2-135m --dtype bf16
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
MIB = 2 ** 20


def document(key: str, dtype: str) -> dict:
    from causalab.models import resolve

    found = json.loads((ROOT / "documents" / "v2" / "patching.json").read_text())
    found["model"].update(key=f"causalab:{key}", revision=resolve(f"causalab:{key}").revision,
                          dtype=dtype)
    return found


# ``causalab run`` with its own peak written to a file as it exits: the child's ``VmHWM``
# (``memory.peak_bytes``), which starts afresh at exec, where ``ru_maxrss`` from ``wait4``
# would keep the parent's (a test process holding a model) from the fork.
_CHILD = """
import atexit, sys
from causalab import memory
target, sys.argv = sys.argv[1], ["causalab"] + sys.argv[2:]
atexit.register(lambda: open(target, "w").write(str(memory.peak_bytes())))
from causalab.cli.main import console
console()
"""


def run(path: Path, budget: str, scratch: Path) -> tuple[int, str, int]:
    """``causalab run`` of ``path`` under ``budget`` in a fresh process: (exit status, its
    stderr, its peak resident set in bytes)."""
    out, peak = scratch / f"out-{budget}", scratch / f"peak-{budget}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_EXPERIMENT_NAME="floor",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(peak), "run", str(path), "--memory", budget,
         "--out", str(out), "--tracking-uri", f"sqlite:///{scratch / 'mlflow.db'}",
         "--data-root", str(ROOT / "documents" / "data")],
        cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        timeout=1800)
    return child.returncode, child.stderr, int(peak.read_text()) if peak.exists() else 0


def measure(key: str, dtype: str) -> dict:
    from causalab import memory
    from causalab.models import resolve

    weights = memory.weights_bytes(resolve(f"causalab:{key}").path, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        path = scratch / "doc.json"
        path.write_text(json.dumps(document(key, dtype)))
        low = f"{max(int(weights * 1.1) // 1024, 1)}KiB"
        status, err, _ = run(path, low, scratch)
        lines = [line for line in err.splitlines() if line.strip()]
        found = re.search(r"give at least (\d+)MiB", err)
        refused = status == 1 and len(lines) == 1 and "floor" in err and found is not None
        least = int(found.group(1)) * MIB if found else 0
        runtime = re.search(r"its runtime ([\d.]+) (MiB|GiB)", err)
        held = float(runtime.group(1)) * (MIB if runtime.group(2) == "MiB" else 2 ** 30) \
            if runtime else 0
        status, err, peak = 1, "", 0
        for _ in range(3):  # the runtime differs by a few MiB between processes: retry above
            if not least:
                break
            status, err, peak = run(path, f"{least // MIB}MiB", scratch)
            again = re.search(r"give at least (\d+)MiB", err)
            if status == 0 or again is None:
                break
            least = int(again.group(1)) * MIB
        notes = [line for line in err.splitlines() if line.startswith("note: memory:")]
    return {"model": key, "dtype": dtype, "weights": weights, "refused_at_weights+10%": refused,
            "refusal": lines[0] if lines else "", "least": least, "ran": status == 0,
            "peak": peak, "peak/budget": peak / least if least else float("nan"),
            "beyond_runtime_and_weights": peak - held - weights, "notes": notes}


def main() -> None:
    from causalab.models.registry import BUILTINS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BUILTINS))
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    args = parser.parse_args()
    unknown = [key for key in args.models.split(",") if key not in BUILTINS]
    if unknown:
        parser.error(f"--models: unknown built-in {', '.join(unknown)}; built-ins are "
                     + ", ".join(BUILTINS))
    rows = []
    for key in args.models.split(","):
        row = measure(key, args.dtype)
        rows.append(row)
        print(f"{key:<16} {args.dtype} weights {row['weights'] / MIB:6.0f} MiB  refused at "
              f"+10%: {row['refused_at_weights+10%']}  least {row['least'] / MIB:6.0f} MiB  "
              f"peak {row['peak'] / MIB:6.0f} MiB ({row['peak/budget']:.3f} of it)  beyond "
              f"runtime+weights {row['beyond_runtime_and_weights'] / MIB:5.0f} MiB"
              + (f"  {row['notes'][0]}" if row["notes"] else ""), flush=True)
    if rows:
        print(f"    e.g. {rows[-1]['refusal']}")
    worst = max(row["peak/budget"] for row in rows)
    print("FLOOR " + " ".join(f"{row['model']}={row['peak/budget']:.3f}" for row in rows)
          + f" worst={worst:.3f} all_refused={all(r['refused_at_weights+10%'] for r in rows)}"
          f" all_ran={all(r['ran'] for r in rows)}")


if __name__ == "__main__":
    main()
