"""Benchmark at a real size: SmolLM2-135M, the 30-layer END residual sweep and the 270-head sweep.

Both sweeps patch from the name-swapped counterfactual on the IOI table (documents/data/ioi,
120 rows). In one process, after a warm-up, three ways of doing the same points are timed:
``hooks`` (hand-written torch hooks: per point one counterfactual forward capturing the place and
one base forward replacing it), ``hooks cached`` (the counterfactual captured once for every
place, then one base forward per point: the hand-written limit) and causalab (``run_document``).
A hand-written point costs the same at every place (two whole forwards, or one with the
counterfactual cached), so the hooks are timed on ``--sample`` points spread over the sweep and
their per-point median is charged for every point; causalab runs the whole sweep. Printed:
seconds, causalab's ratio to each, the largest difference of a sampled point's mean logit diff
(a correctness check) and the peak RSS after each phase.

Fusion memory bound: without ``--batch-size`` causalab stacks sweep points into one trace up to
16,384 tokens (rows x padded width, engine/planner.py); with ``--batch-size N`` a trace holds at
most N rows, so N / rows points fuse, and N below the row count runs one point per trace in
windows of N rows. A trace's memory grows with its tokens (every layer's activations; the
logits of every position only when the head is read elsewhere than the last one), so the
bound is what caps RSS; an ended point's results are dropped, so the sweep's length is not.

    .venv/bin/python scripts/bench/smollm2.py                    # both sweeps, all 120 rows
    .venv/bin/python scripts/bench/smollm2.py --sweep heads --layers 20-29 --batch-size 240
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
KEY = "causalab:smollm2-135m"
HEAD_DIM = 64


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def patching_document(model: dict, site: dict, *, cross_entropy: bool = False) -> dict:
    """Patch ``site`` at the last token from the counterfactual into the base; save the logit
    difference (and score the cross-entropy too, with ``cross_entropy``). scale.py uses it."""
    logits = {"site": "head", "pos": -1, "model": "patched", "input": "base"}
    metrics = {"logit_diff": {"kind": "logit_diff", "of": "logits",
                              "a": "cf_answer", "b": "base_answer"}}
    if cross_entropy:
        metrics["ce"] = {"kind": "cross_entropy", "of": "logits", "target": "cf_answer"}
    return {
        "model": model,
        "roles": {"base": {"field": "input"},
                  "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": site, "head": {"component": "lm_head"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": -1, "input": "counterfactual"},
                      "logits": logits},
            "writes": {"swap": {"site": "target", "pos": -1, "mechanism": "swap",
                                "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["swap"]}},
            "metrics": metrics}},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": "pairs", "counterfactual": "pairs"},
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def _document(revision: str, sweep: str, layers: list[int], heads: int) -> dict:
    if sweep == "heads":
        site = {"component": "attention_premix", "layers": [{"sweep": layers}],
                "heads": [{"sweep": {"range": [0, heads]}}]}
    else:
        site = {"component": "block_output", "layers": [{"sweep": layers}]}
    return patching_document({"key": KEY, "revision": revision, "dtype": "fp32"}, site)


def _points(sweep: str, layers: list[int], heads: int) -> list[tuple[int, int | None]]:
    return [(layer, head) for layer in layers for head in range(heads)] if sweep == "heads" \
        else [(layer, None) for layer in layers]


class Hooks:
    """Hand-written patching on a transformers LlamaForCausalLM, END = the last index."""

    def __init__(self, model, tokenizer, rows):
        self.model = model
        self.base = tokenizer([r["input"] for r in rows], return_tensors="pt", padding=True)
        self.cf = tokenizer([r["counterfactual_inputs"][0] for r in rows], return_tensors="pt",
                            padding=True)
        ids = [(tokenizer(r["cf_answer"], add_special_tokens=False)["input_ids"][0],
                tokenizer(r["base_answer"], add_special_tokens=False)["input_ids"][0])
               for r in rows]
        self.a, self.b = torch.tensor([i for i, _ in ids]), torch.tensor([j for _, j in ids])

    def _module(self, layer: int, head: int | None):
        block = self.model.model.layers[layer]
        return block.self_attn.o_proj if head is not None else block

    def _forward(self, batch, module, hook, pre: bool):
        handle = (module.register_forward_pre_hook(hook) if pre
                  else module.register_forward_hook(hook))
        try:
            with torch.no_grad():
                return self.model(**batch).logits[:, -1]
        finally:
            handle.remove()

    def _capture(self, layer, head):
        """The counterfactual's END value at one place: (rows, 64) of a head, or (rows, d)."""
        kept = {}

        def grab_output(module, args, out):
            kept["v"] = out[:, -1].clone()

        def grab_head(module, args):
            kept["v"] = args[0][:, -1, head * HEAD_DIM:(head + 1) * HEAD_DIM].clone()
        if head is None:
            self._forward(self.cf, self._module(layer, None), grab_output, False)
        else:
            self._forward(self.cf, self._module(layer, head), grab_head, True)
        return kept["v"]

    def _patched(self, layer, head, value) -> float:
        if head is None:
            def put(module, args, out):
                out = out.clone()
                out[:, -1] = value
                return out
            logits = self._forward(self.base, self._module(layer, None), put, False)
        else:
            cut = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)

            def put(module, args):
                x = args[0].clone()
                x[:, -1, cut] = value
                return (x,)
            logits = self._forward(self.base, self._module(layer, head), put, True)
        return float((logits.gather(1, self.a[:, None]) - logits.gather(1, self.b[:, None])).mean())

    def per_point(self, points) -> tuple[list[float], list[float]]:
        """Each point's mean logit diff and its seconds."""
        means, seconds = [], []
        for layer, head in points:
            start = time.perf_counter()
            means.append(self._patched(layer, head, self._capture(layer, head)))
            seconds.append(time.perf_counter() - start)
        return means, seconds

    def cached(self, points) -> tuple[list[float], float, list[float]]:
        """One counterfactual forward capturing every place's END value, then one base forward
        per point: the means, the capture's seconds and each point's seconds."""
        kept, handles = {}, []
        head_sweep = points[0][1] is not None

        def grab(layer):
            def keep(module, args, out=None):
                kept[layer] = (args[0] if head_sweep else out)[:, -1].clone()
            return keep
        start = time.perf_counter()
        for layer in sorted({layer for layer, _ in points}):
            module = self._module(layer, 0 if head_sweep else None)
            handles.append(module.register_forward_pre_hook(grab(layer)) if head_sweep
                           else module.register_forward_hook(grab(layer)))
        try:
            with torch.no_grad():
                self.model(**self.cf)
        finally:
            for handle in handles:
                handle.remove()
        capture = time.perf_counter() - start
        means, seconds = [], []
        for layer, head in points:
            start = time.perf_counter()
            means.append(self._patched(layer, head, kept[layer] if head is None
                                       else kept[layer][:, head * HEAD_DIM:(head + 1) * HEAD_DIM]))
            seconds.append(time.perf_counter() - start)
        return means, capture, seconds


def _causalab(document, rows, batch_size) -> tuple[float, dict[str, float]]:
    from causalab.pipeline import run_document

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pairs.json").write_text(json.dumps(rows))
        start = time.perf_counter()
        run_document(document, out=f"{tmp}/out", data_root=tmp, batch_size=batch_size)
        seconds = time.perf_counter() - start
        means = {t.parent.name: sum(r["value"] for r in json.loads(t.read_text())) / len(rows)
                 for t in Path(tmp, "out").glob("*/logit_diff.json")}
    return seconds, means


def _sample(points: list, count: int) -> list:
    """``count`` points spread evenly over the sweep, first and last included."""
    if count >= len(points):
        return list(points)
    step = (len(points) - 1) / max(count - 1, 1)
    return [points[round(i * step)] for i in range(count)]


def bench(sweep: str, layers: list[int], rows: list[dict], batch_size: int | None,
          sample: int) -> None:
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer, resolve

    resolved = resolve(KEY)
    heads = 9
    points = _points(sweep, layers, heads)
    sampled = _sample(points, sample)
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32).eval()
    hooks = Hooks(model, load_tokenizer(resolved.path), rows)
    hooks.cached(sampled[:1])
    expected, naive_each = hooks.per_point(sampled)
    naive = statistics.median(naive_each) * len(points)
    naive_rss = _peak_mb()
    _, capture, cached_each = hooks.cached(sampled)
    cached = capture + statistics.median(cached_each) * len(points)
    cached_rss = _peak_mb()
    del model
    ours, means = _causalab(_document(resolved.revision, sweep, layers, heads), rows, batch_size)
    got = [means[f"layers={layer}" + (f",heads={head}" if head is not None else "")]
           for layer, head in sampled]
    worst = max(abs(a - b) for a, b in zip(got, expected))
    print(f"{sweep}: {len(points)} points x {len(rows)} rows, batch_size={batch_size}; hooks timed "
          f"on {len(sampled)} points ({statistics.median(naive_each):.2f} s a point, "
          f"{statistics.median(cached_each):.2f} s cached) and charged for all {len(points)}")
    print(f"  hooks {naive:.1f} s  hooks cached {cached:.1f} s  causalab {ours:.1f} s")
    print(f"  ratio causalab/hooks {ours / naive:.2f}  causalab/hooks cached {ours / cached:.2f}")
    print(f"  max |mean logit diff - hooks| {worst:.2e} (over the {len(sampled)} sampled points)")
    print(f"  peak RSS MB: after hooks {naive_rss:.0f}, after cached {cached_rss:.0f}, "
          f"after causalab {_peak_mb():.0f}")


def _layers(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=("layers", "heads", "both"), default="both")
    parser.add_argument("--layers", default="0-29", help="a range such as 20-29")
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--sample", type=int, default=6,
                        help="points the hand-written hooks are timed on (their per-point cost)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="causalab's rows per trace: the fusion memory bound")
    args = parser.parse_args()
    rows = json.loads((ROOT / "documents" / "data" / "ioi" / "data.json").read_text())[:args.rows]
    for sweep in (("layers", "heads") if args.sweep == "both" else (args.sweep,)):
        bench(sweep, _layers(args.layers), rows, args.batch_size, args.sample)


if __name__ == "__main__":
    main()
