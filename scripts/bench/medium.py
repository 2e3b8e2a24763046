"""Benchmark: a medium Llama (d=256, 4 layers) over 42 weekday pairs, side by side in one process.

W1, an 8-point patching sweep (block_output and mlp_output at layers 0–3, last token), run
three ways: hand-written torch hooks per point (a counterfactual forward capturing the place,
then a base forward replacing it), the same hooks with every counterfactual value captured
in one forward first, and causalab (``run_document``). W2, a DAS update at the middle layer
(k=16 rotation of block_output[1] at the last token, cross-entropy on the counterfactual
answer): a hand-written update that recomputes the counterfactual per step, one with it
cached, and causalab's fit (its wall time over its number of updates, a held-out eval per
epoch included). Ratios are medians of SAMPLES timings over the hooks-per-point time; the
correctness line compares every way's numbers to the hooks'.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/medium.py
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from patching import _rows  # noqa: E402

SAMPLES = 5
PLACES = [(c, layer) for c in ("block_output", "mlp_output") for layer in range(4)]
DAS_LAYER, DAS_K, DAS_EPOCHS, DAS_LR = 1, 16, 2, 1e-2


def _medium(directory: Path) -> Path:
    """A seeded random Llama, d=256, 4 layers, with the built-in weekday tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from causalab.models import resolve

    directory.mkdir(parents=True, exist_ok=True)
    source = Path(resolve("causalab:weekday-llama").path)
    for name in source.iterdir():
        if name.name.startswith("tokenizer") or name.name == "special_tokens_map.json":
            shutil.copy(name, directory / name.name)
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=8, intermediate_size=1024, vocab_size=vocab,
                         max_position_embeddings=128, tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    return directory


def _document(path: Path) -> dict:
    sites = [{"component": c, "layers": [layer]} for c, layer in PLACES]
    return {
        "model": {"key": str(path), "revision": "main", "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"sweep": sites, "as": "place"}, "head": {"component": "lm_head"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": -1, "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"}},
        }},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": "pairs", "counterfactual": "pairs"},
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def _encode(tokenizer, prompts):
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    enc["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return enc


def _module(model, component: str, layer: int):
    block = model.model.layers[layer]
    return block if component == "block_output" else block.mlp


def _last(output):
    return output[0] if isinstance(output, tuple) else output


def _forward(model, enc, module, hook):
    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(**enc).logits[:, -1]
    finally:
        handle.remove()


def _replace(value):
    def put(mod, args, output):
        tensor = _last(output).clone()
        tensor[:, -1] = value
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    return put


def _grab(store, key):
    def grab(mod, args, output):
        store[key] = _last(output)[:, -1].clone()
    return grab


def _diff(logits, a, b) -> float:
    return float((logits.gather(1, a[:, None]) - logits.gather(1, b[:, None])).mean())


def _hooks_per_point(model, base, cf, a, b) -> list[float]:
    means = []
    for component, layer in PLACES:
        module, store = _module(model, component, layer), {}
        _forward(model, cf, module, _grab(store, "v"))
        means.append(_diff(_forward(model, base, module, _replace(store["v"])), a, b))
    return means


def _hooks_cached(model, base, cf, a, b) -> list[float]:
    store, handles = {}, []
    for place in PLACES:
        handles.append(_module(model, *place).register_forward_hook(_grab(store, place)))
    try:
        with torch.no_grad():
            model(**cf)
    finally:
        for handle in handles:
            handle.remove()
    return [_diff(_forward(model, base, _module(model, *place), _replace(store[place])), a, b)
            for place in PLACES]


def _timed(fn) -> tuple[float, object]:
    times, value = [], None
    fn()
    for _ in range(SAMPLES):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def _causalab_sweep(document: dict, tmp: str) -> list[float]:
    from causalab.pipeline import run_document

    out = tempfile.mkdtemp(dir=tmp)
    run_document(document, out=out, data_root=tmp)
    means = {}
    for table in Path(out).glob("*/logit_diff.json"):
        # A point's directory is named by its sweep value: place={"component":…,"layers":[l]}.
        place = json.loads(table.parent.name.split("=", 1)[1])
        values = [r["value"] for r in json.loads(table.read_text())]
        means[(place["component"], place["layers"][0])] = sum(values) / len(values)
    return [means[place] for place in PLACES]


def patching(model, tokenizer, rows, document, tmp) -> dict:
    base = _encode(tokenizer, [r["input"] for r in rows])
    cf = _encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])
    ids = lambda key: torch.tensor([tokenizer(r[key], add_special_tokens=False)["input_ids"][0]
                                    for r in rows])
    a, b = ids("cf_answer"), ids("base_answer")
    hooks, want = _timed(lambda: _hooks_per_point(model, base, cf, a, b))
    cached, got_cached = _timed(lambda: _hooks_cached(model, base, cf, a, b))
    ours, got = _timed(lambda: _causalab_sweep(document, tmp))
    error = max(abs(x - y) for x, y in zip(want + want, got_cached + got))
    return {"hooks_s": hooks, "cached_ratio": cached / hooks, "causalab_ratio": ours / hooks,
            "max_abs_error": error}


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory() as tmp:
        path = _medium(Path(tmp) / "medium")
        rows = _rows()
        (Path(tmp) / "pairs.json").write_text(json.dumps(rows))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = load_tokenizer(str(path))
        w1 = patching(model, tokenizer, rows, _document(path), tmp)
        print(f"W1 patching sweep, {len(PLACES)} points x {len(rows)} rows "
              f"(medians of {SAMPLES}): hooks per point {w1['hooks_s'] * 1000:.0f} ms = 1.00x, "
              f"hooks cf cached {w1['cached_ratio']:.2f}x, causalab {w1['causalab_ratio']:.2f}x "
              f"(target <= 0.40x); max |diff| vs hooks {w1['max_abs_error']:.2e}")
        if w1["max_abs_error"] > 1e-4:
            raise SystemExit("W1: causalab and the hooks disagree")


if __name__ == "__main__":
    main()
