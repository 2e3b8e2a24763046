"""Benchmark at 1B and 8B parameters within a memory budget, on random-weight stand-ins in bf16.

The stand-ins (``causalab.models.standin``: Llama-3.2-1B's and Llama-3.1-8B's shapes, seeded
random weights, written once under the causalab cache) measure cost, not meaning. In one
process, on the CPU:

1. ``1b``: the 1B shape in bf16 over ``--rows`` weekday pairs: a head sweep over one layer's
   heads, a layer sweep, attribution over every head, a DAS fit (d = the residual width,
   k = 16, a few updates); for each its wall seconds, peak RSS (sampled every 5 ms while it
   runs) and peak over the weights.
2. ``growth``: cost against rows (12/24/48, a 4-layer sweep), points (8/32/128 heads) and the
   patched layer's depth (a quarter, half and all of the stack), as fitted exponents
   (log-log slopes of wall seconds).
3. ``budget``: the head sweep, attribution and the fit again under budgets of the weights +
   2 GiB and + 1 GiB (``--memory``, the whole process counted): the largest difference of any
   table value from the default run's, and each peak against its budget.
4. ``8b``: the 8B shape in bf16 under ``--memory 21GiB``: attribution over every head (12
   rows) and a DAS fit at one layer (k = 16, a few updates), peak reported.

It ends with one line ``SCALE …`` holding the figures. ``--only`` picks parts; ``--shape``
swaps the 1B shape for another (``llama-tiny`` for a quick check of the script itself).

    .venv/bin/python scripts/bench/scale.py                     # everything (8B: 16 GB)
    .venv/bin/python scripts/bench/scale.py --only 1b,growth,budget --rows 24
    .venv/bin/python scripts/bench/scale.py --only 8b
    .venv/bin/python scripts/bench/scale.py --only budget --workloads attribution,das
    .venv/bin/python scripts/bench/scale.py --shape llama-tiny --only 1b,budget --rows 6
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
TEMPLATES = ("If today is {}, tomorrow is", "Today is {}, so tomorrow is")
GIB = 2 ** 30


def pairs(count: int) -> list[dict]:
    """``count`` weekday pairs: base and counterfactual days differ, answers are next days."""
    rows = []
    for template in TEMPLATES:
        for i, day in enumerate(DAYS):
            for j, other in enumerate(DAYS):
                if i != j:
                    rows.append({"input": template.format(day),
                                 "counterfactual_inputs": [template.format(other)],
                                 "base_answer": " " + DAYS[(i + 1) % 7],
                                 "cf_answer": " " + DAYS[(j + 1) % 7],
                                 "example_id": f"{len(rows)}"})
    return [rows[k % len(rows)] | {"example_id": str(k)} for k in range(count)]


def _patching(model: dict, site: dict) -> dict:
    logits = {"site": "head", "pos": -1, "model": "patched", "input": "base"}
    return {
        "model": model,
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": site, "head": {"component": "lm_head"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": -1, "input": "counterfactual"},
                      "logits": logits},
            "writes": {"swap": {"site": "target", "pos": -1, "mechanism": "swap",
                                "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["swap"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"},
                        "ce": {"kind": "cross_entropy", "of": "logits", "target": "cf_answer"}}}},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": "pairs", "counterfactual": "pairs"},
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def head_sweep(model: dict, layers: list[int], heads: int) -> dict:
    return _patching(model, {"component": "attention_premix", "layers": [{"sweep": layers}],
                             "heads": [{"sweep": {"range": [0, heads]}}]})


def layer_sweep(model: dict, layers: list[int]) -> dict:
    return _patching(model, {"component": "block_output", "layers": [{"sweep": layers}]})


def attribution(model: dict) -> dict:
    document = _patching(model, {"component": "attention_premix", "layers": [0]})
    document["steps"] = {"attribute": {
        "kind": "attribute", "interventions": "patch", "layers": "all", "unit": "head",
        "rows": {"base": "pairs", "counterfactual": "pairs"}, "metrics": ["logit_diff"],
        "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}}
    return document


def das(model: dict, layer: int, k: int = 16, pairs_per_update: int = 8) -> dict:
    document = _patching(model, {"component": "block_output", "layers": [layer]})
    document["featurizers"] = {"rot": {"kind": "subspace", "k": k}}
    patch = document["interventions"]["patch"]
    patch["reads"]["v_cf"]["featurizer"] = "rot"
    patch["writes"]["swap"]["featurizer"] = "rot"
    rows = {"base": "pairs", "counterfactual": "pairs"}
    document["steps"] = {
        "fit": {"kind": "fit", "interventions": "patch", "rows": rows, "params": ["rot"],
                "objective": [[1.0, "ce"]], "epochs": 1, "pairs": pairs_per_update, "seed": 0,
                "optimizer": {"name": "adamw", "lr": 0.001},
                "early_stop": {"metric": "logit_diff", "mode": "max", "patience": 1},
                "eval": {"rows": rows, "saves": [{"value": "logit_diff",
                                                  "file_path": "logit_diff.json"}]}}}
    return document


class Peak:
    """The process's resident set sampled every 5 ms while a block runs: its peak in bytes."""

    def __enter__(self):
        import psutil

        self._process, self._done, self.peak = psutil.Process(), threading.Event(), 0
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._done.wait(0.005)

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def run(document: dict, rows: list[dict], memory: str | None = None) -> dict:
    """Run ``document`` over ``rows``: wall seconds, peak RSS and every table value in order."""
    from causalab.pipeline import run_document

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pairs.json").write_text(json.dumps(rows))
        start = time.perf_counter()
        with Peak() as peak:
            run_document(document, out=f"{tmp}/out", data_root=tmp, memory=memory)
        seconds = time.perf_counter() - start
        values = [row.get("effect", row.get("value"))
                  for table in sorted(Path(tmp, "out").rglob("logit_diff.json"))
                  for row in json.loads(table.read_text())]
    return {"seconds": seconds, "peak": peak.peak, "values": values}


def exponent(sizes: list[float], seconds: list[float]) -> float:
    """The log-log slope of ``seconds`` against ``sizes`` (least squares)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(t, 1e-9)) for t in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def shape_of(name: str, dtype: str = "bf16") -> tuple[dict, object, int]:
    """(the document's model node, the model's facts, its weights' bytes) of stand-in ``name``."""
    from causalab import memory
    from causalab.engine.state import ModelFacts
    from causalab.models import load_config
    from causalab.models.standin import standin

    from causalab.models.revision import directory_digest, recorded

    path = str(standin(name, dtype=dtype))
    revision = recorded(path) or directory_digest(path)
    return ({"key": path, "revision": revision, "dtype": dtype}, ModelFacts.of(load_config(path)),
            memory.weights_bytes(path, dtype))


WORKLOADS = ("heads", "layers", "attribution", "das")


def workloads(model: dict, facts, rows: int, chosen=WORKLOADS) -> dict:
    """The 1B part's workloads: name -> (document, rows), those ``chosen``."""
    middle = facts.layers // 2
    every = {"heads": lambda: head_sweep(model, [middle], facts.heads),
             "layers": lambda: layer_sweep(model, list(range(facts.layers))),
             "attribution": lambda: attribution(model), "das": lambda: das(model, middle)}
    return {name: (every[name](), pairs(rows)) for name in WORKLOADS if name in chosen}


def part_1b(model, facts, weights, rows: int, figures: dict, chosen=WORKLOADS) -> dict:
    found = {}
    for name, (document, table) in workloads(model, facts, rows, chosen).items():
        found[name] = run(document, table)
        ratio = found[name]["peak"] / weights
        print(f"1b {name:<12} {found[name]['seconds']:7.1f} s  peak {found[name]['peak'] / GIB:5.2f} "
              f"GiB  peak/weights {ratio:.2f}", flush=True)
        figures[f"{name}_s"] = f"{found[name]['seconds']:.1f}"
        figures[f"{name}_peak/weights"] = f"{ratio:.2f}"
    figures["peak/weights"] = f"{max(r['peak'] for r in found.values()) / weights:.2f}"
    return found


def part_growth(model, facts, figures: dict) -> None:
    sizes: dict = {}
    four = list(range(0, facts.layers, max(facts.layers // 4, 1)))[:4]
    sizes["rows"] = [(n, run(layer_sweep(model, four), pairs(n))["seconds"]) for n in (12, 24, 48)]
    points = []
    for count in (8, 32, 128):  # as many as the model has heads, on a small stand-in
        per_layer = min(count, facts.heads)
        layers = list(range(facts.layers))[-max(count // per_layer, 1):]
        found = run(head_sweep(model, layers, per_layer), pairs(12))["seconds"]
        points.append((per_layer * len(layers), found))
    sizes["points"] = points
    depths = [max(facts.layers // 4, 1), max(facts.layers // 2, 1), facts.layers]
    sizes["layers"] = [(d, run(layer_sweep(model, [d - 1]), pairs(12))["seconds"]) for d in depths]
    for name, found in sizes.items():
        slope = exponent([s for s, _ in found], [t for _, t in found])
        print(f"growth {name:<7} " + "  ".join(f"{s}: {t:.1f} s" for s, t in found)
              + f"  exponent {slope:.2f}", flush=True)
        figures[f"exp_{name}"] = f"{slope:.2f}"


def part_budget(model, facts, weights, rows: int, reference: dict, figures: dict,
                chosen=WORKLOADS) -> None:
    chosen = {k: v for k, v in workloads(model, facts, rows, chosen).items() if k != "layers"}
    for extra in (2, 1):
        budget = weights + extra * GIB
        spelled = f"{budget // 2 ** 20}MiB"
        worst, over = 0.0, []
        for name, (document, table) in chosen.items():
            found = run(document, table, memory=spelled)
            base = reference.get(name) or run(document, table)
            worst = max([worst] + [abs(a - b) for a, b in zip(found["values"], base["values"])])
            same = len(found["values"]) == len(base["values"])
            over.append(found["peak"] / budget)
            print(f"budget +{extra}GiB {name:<12} {found['seconds']:7.1f} s  peak "
                  f"{found['peak'] / GIB:5.2f} GiB of {budget / GIB:.2f}  tables "
                  f"{'identical' if same and worst == 0 else f'differ by {worst:.3g}'}", flush=True)
        figures[f"budget+{extra}GiB_peak/budget"] = f"{max(over):.2f}"
        figures[f"budget+{extra}GiB_maxdiff"] = f"{worst:.3g}"


def part_8b(figures: dict, rows: int = 12, name: str = "llama-3.1-8b",
            memory: str = "21GiB") -> None:
    model, facts, weights = shape_of(name)
    for label, document in (("attribution", attribution(model)),
                            ("das", das(model, facts.layers // 2, pairs_per_update=4))):
        found = run(document, pairs(rows), memory=memory)
        print(f"8b {label:<12} {found['seconds']:7.1f} s  peak {found['peak'] / GIB:5.2f} GiB "
              f"(weights {weights / GIB:.2f}, budget {memory})", flush=True)
        figures[f"8b_{label}_s"] = f"{found['seconds']:.1f}"
        figures[f"8b_{label}_peak"] = f"{found['peak'] / GIB:.2f}GiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="1b,growth,budget,8b",
                        help="comma-separated parts: 1b, growth, budget, 8b")
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--shape", default="llama-3.2-1b", help="the stand-in of the 1B part")
    parser.add_argument("--big", default="llama-3.1-8b", help="the stand-in of the 8B part")
    parser.add_argument("--big-memory", default="21GiB")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="of the 1B and budget parts: heads, layers, attribution, das")
    args = parser.parse_args(argv)
    parts, chosen = set(args.only.split(",")), set(args.workloads.split(","))
    figures: dict = {"shape": args.shape, "rows": args.rows}
    reference: dict = {}
    if parts & {"1b", "growth", "budget"}:
        model, facts, weights = shape_of(args.shape)
        figures["weights"] = f"{weights / GIB:.2f}GiB"
        if "1b" in parts:
            reference = part_1b(model, facts, weights, args.rows, figures, chosen)
        if "growth" in parts:
            part_growth(model, facts, figures)
        if "budget" in parts:
            part_budget(model, facts, weights, args.rows, reference, figures, chosen)
    if "8b" in parts:
        part_8b(figures, name=args.big, memory=args.big_memory)
    print("SCALE " + " ".join(f"{key}={value}" for key, value in figures.items()))


if __name__ == "__main__":
    main()
