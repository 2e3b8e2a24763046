"""Benchmark: a 32-point patching sweep, causalab against a hand-written torch-hook loop.

8 places (block_input, attention_output, mlp_output, block_output at layers 0 and 1) × 4
positions (−1 … −4, read and write tied as one named axis) on the built-in tiny Llama over
42 weekday pairs. The hook loop does what a researcher writes by hand: per point, one
counterfactual forward capturing the place and one base forward replacing it. Both run in
this process after a warm-up, alternated; the printed ``ratio`` is the median of causalab's
wall times over the median of the loop's.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/patching.py
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# nnsight runs the model beside its own worker thread; OpenMP teams that spin-wait then fight
# over 2 cores (12 ms per tiny matmul). Passive waiting has to be set before torch starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
PLACES = [(c, layer) for layer in (0, 1)
          for c in ("block_input", "attention_output", "mlp_output", "block_output")]
POSITIONS = [-1, -2, -3, -4]
SAMPLES = 5


def _rows() -> list[dict]:
    shipped = ROOT / "documents" / "data" / "weekdays_full" / "data.json"
    if shipped.exists():
        return json.loads(shipped.read_text())
    rows = []
    for a, b in itertools.permutations(range(7), 2):
        rows.append({"input": f"If today is {DAYS[a]}, tomorrow is",
                     "counterfactual_inputs": [f"If today is {DAYS[b]}, tomorrow is"],
                     "base_answer": " " + DAYS[(a + 1) % 7], "cf_answer": " " + DAYS[(b + 1) % 7],
                     "example_id": f"{DAYS[a][:3]}-{DAYS[b][:3]}"})
    return rows


def sweep_document(model: dict, places: list, pos) -> dict:
    """A patching sweep over ``places`` ((component, layer) pairs) at ``pos``: swap the
    counterfactual's value in, read the last token's logits, score the logit difference."""
    sites = [{"component": c, "layers": [layer]} for c, layer in places]
    return {
        "model": model,
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"sweep": sites, "as": "place"}, "head": {"component": "lm_head"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": pos, "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": {"site": "target", "pos": pos, "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"}},
        }},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": "pairs", "counterfactual": "pairs"},
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def _document(resolved) -> dict:
    model = {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"}
    return sweep_document(model, PLACES, {"sweep": POSITIONS, "as": "pos"})


def _module(model, component: str, layer: int):
    block = model.model.layers[layer]
    return {"block_input": (block, "pre"), "attention_output": (block.self_attn, "post"),
            "mlp_output": (block.mlp, "post"), "block_output": (block, "post")}[component]


def _hook_loop(model, tokenizer, rows) -> list[float]:
    def encode(prompts):
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
        enc["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        return enc
    base = encode([r["input"] for r in rows])
    cf = encode([r["counterfactual_inputs"][0] for r in rows])
    a = torch.tensor([tokenizer(r["cf_answer"], add_special_tokens=False)["input_ids"][0] for r in rows])
    b = torch.tensor([tokenizer(r["base_answer"], add_special_tokens=False)["input_ids"][0] for r in rows])
    means = []
    for (component, layer), pos in itertools.product(PLACES, POSITIONS):
        module, side = _module(model, component, layer)
        store = {}

        def grab_pre(mod, args, kwargs):
            store["v"] = (args[0] if args else kwargs["hidden_states"])[:, pos].clone()

        def grab_post(mod, args, output):
            store["v"] = (output[0] if isinstance(output, tuple) else output)[:, pos].clone()

        def put_pre(mod, args, kwargs):
            value = (args[0] if args else kwargs["hidden_states"]).clone()
            value[:, pos] = store["v"]
            if args:
                return (value, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": value}

        def put_post(mod, args, output):
            tensor = (output[0] if isinstance(output, tuple) else output).clone()
            tensor[:, pos] = store["v"]
            return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

        with torch.no_grad():
            for hook, enc in ((grab_pre if side == "pre" else grab_post, cf),
                              (put_pre if side == "pre" else put_post, base)):
                handle = (module.register_forward_pre_hook(hook, with_kwargs=True) if side == "pre"
                          else module.register_forward_hook(hook))
                try:
                    logits = model(**enc).logits[:, -1]
                finally:
                    handle.remove()
        means.append(float((logits.gather(1, a[:, None]) - logits.gather(1, b[:, None])).mean()))
    return means


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer, resolve
    from causalab.pipeline import run_document

    resolved = resolve("causalab:tiny-llama")
    rows = _rows()
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(resolved.path)
    ours_times, hook_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pairs.json").write_text(json.dumps(rows))
        document = _document(resolved)
        run_document(document, out=f"{tmp}/warm", data_root=tmp)
        _hook_loop(model, tokenizer, rows)
        # Alternated, so a machine that slows down or speeds up weighs on both alike.
        for sample in range(SAMPLES):
            start = time.perf_counter()
            run_document(document, out=f"{tmp}/out{sample}", data_root=tmp)
            ours_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            hook_means = _hook_loop(model, tokenizer, rows)
            hook_times.append(time.perf_counter() - start)
        tables = sorted(Path(tmp, "out0").glob("*/logit_diff.json"))
        engine_means = {t.parent.name: sum(r["value"] for r in json.loads(t.read_text())) / len(rows)
                        for t in tables}
    ours, hooks = statistics.median(ours_times), statistics.median(hook_times)
    print(f"points {len(engine_means)} rows {len(rows)}")
    print(f"causalab {ours:.3f} s  hooks {hooks:.3f} s  (medians of {SAMPLES}, alternated)")
    print(f"max |mean difference| {max(abs(a - b) for a, b in zip(sorted(engine_means.values()), sorted(hook_means))):.2e}")
    print(f"ratio {ours / hooks:.2f}")


if __name__ == "__main__":
    main()
