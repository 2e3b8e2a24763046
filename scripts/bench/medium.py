"""Benchmark: a medium Llama (d=256, 4 layers) over 42 weekday pairs, side by side in one process.

W1, an 8-point patching sweep (block_output and mlp_output at layers 0–3, last token), run
three ways: hand-written torch hooks per point (a counterfactual forward capturing the place,
then a base forward replacing it), the same hooks with every counterfactual value captured
in one forward first, and causalab (``run_document``). W2, a DAS update at the middle layer
(k=16 rotation of block_output[1] at the last token, cross-entropy on the counterfactual
answer): a hand-written update that recomputes the counterfactual per step, one with it
cached, and causalab's fit: one update (the median gap between two updates of an epoch, as
the engine reports them) against a hand-written one, and the whole fit (compile, a held-out
eval per epoch and the saves included) against the same number of hand-written updates.
Ratios are medians of SAMPLES timings over the hooks-per-point time, the ways alternated
round by round; the correctness lines compare every way's numbers to the hooks', and the
fit's loss curve with resume on and off (an update's minibatch takes its rows out of the
prefix kept over every row: float rounding apart, the same fit).

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
from safetensors.torch import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from patching import _rows, sweep_document  # noqa: E402

SAMPLES = 5
PLACES = [(c, layer) for c in ("block_output", "mlp_output") for layer in range(4)]
DAS_LAYER, DAS_K, DAS_EPOCHS, DAS_LR = 1, 16, 4, 1e-2


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
    return sweep_document({"key": str(path), "revision": "main", "dtype": "fp32"}, PLACES, -1)


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


def _alternated(ways: dict) -> tuple[dict, dict]:
    """``{name: (median seconds, last value)}`` of each way: one warm-up each, then SAMPLES
    rounds running every way once in turn, so a machine that slows down mid-run slows them
    all alike."""
    times: dict = {name: [] for name in ways}
    values = {name: fn() for name, fn in ways.items()}
    for _ in range(SAMPLES):
        for name, fn in ways.items():
            start = time.perf_counter()
            values[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(found) for name, found in times.items()}, values


def _causalab_sweep(document: dict, tmp: str, resume_mib: int | None = None) -> list[float]:
    from causalab.pipeline import run_document

    out = tempfile.mkdtemp(dir=tmp)
    run_document(document, out=out, data_root=tmp, resume_mib=resume_mib)
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
    times, got = _alternated({
        "hooks": lambda: _hooks_per_point(model, base, cf, a, b),
        "cached": lambda: _hooks_cached(model, base, cf, a, b),
        "ours": lambda: _causalab_sweep(document, tmp),
        "full": lambda: _causalab_sweep(document, tmp, resume_mib=0)})
    hooks = times["hooks"]
    error = max(abs(x - y) for name in ("cached", "ours", "full")
                for x, y in zip(got["hooks"], got[name]))
    return {"hooks_s": hooks, "cached_ratio": times["cached"] / hooks,
            "causalab_ratio": times["ours"] / hooks, "unresumed_ratio": times["full"] / hooks,
            "max_abs_error": error, "exact": got["ours"] == got["full"]}


def _das_document(path: Path) -> dict:
    """DAS at the middle of the stack: causalab's own document, on the train/eval tables."""
    document = json.loads((ROOT / "documents" / "v2" / "das.json").read_text())
    document.pop("header", None)
    document["model"] = {"key": str(path), "revision": "main", "dtype": "fp32"}
    document["sites"]["target"]["layers"] = [DAS_LAYER]
    document["featurizers"]["rot"]["k"] = DAS_K
    fit = document["steps"]["fit"]
    fit.update(epochs=DAS_EPOCHS, rows={"base": "train", "counterfactual": "train"})
    fit["optimizer"]["lr"] = DAS_LR
    fit["early_stop"]["patience"] = DAS_EPOCHS
    fit["eval"]["rows"] = {"base": "eval", "counterfactual": "eval"}
    document["steps"] = {"fit": fit}
    return document


def _hand_das(model, base, cf, target, rows: int, cached: bool) -> int:
    """DAS updates written by hand: per update a counterfactual forward (unless ``cached``),
    a base forward with the last token swapped in a k-dim subspace, backward, AdamW."""
    d = model.config.hidden_size
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(d, DAS_K) / d ** 0.5)
    optimizer = torch.optim.AdamW([weight], lr=DAS_LR)
    block = model.model.layers[DAS_LAYER]
    store: dict = {}
    if cached:
        _forward(model, cf, block, _grab(store, "all"))
    updates = 0
    for _ in range(DAS_EPOCHS):
        for start in range(0, rows, 16):
            index = torch.arange(start, min(start + 16, rows))
            if cached:
                source = store["all"][index]
            else:
                _forward(model, {k: v[index] for k, v in cf.items()}, block, _grab(store, "v"))
                source = store["v"]
            basis = torch.linalg.qr(weight)[0]

            def swap(mod, args, output):
                tensor = _last(output)
                x = tensor[:, -1]
                patched = tensor.clone()
                patched[:, -1] = x + ((source - x) @ basis) @ basis.T
                return patched
            handle = block.register_forward_hook(swap)
            try:
                logits = model(**{k: v[index] for k, v in base.items()}).logits[:, -1]
            finally:
                handle.remove()
            loss = torch.nn.functional.cross_entropy(logits, target[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
    return updates


class _UpdateClock:
    """An engine listener timing a fit's updates: the gap between two updates of one epoch
    is exactly one update (its pass, backward and step); an epoch's first update follows
    the previous epoch's eval and is not counted."""

    def __init__(self, per_epoch: int):
        from causalab.engine.events import Events

        self.per_epoch, self.stamps, self.gaps = per_epoch, [], []
        clock = self

        class Listener(Events):
            def fit_update(self, point, step, update, loss) -> None:
                clock.tick(update)
        self.listener = Listener()

    def tick(self, update: int) -> None:
        now = time.perf_counter()
        if update % self.per_epoch and self.stamps:
            self.gaps.append(now - self.stamps[-1])
        self.stamps.append(now)


def das(model, tokenizer, rows, path, tmp) -> dict:
    from causalab.pipeline import run_document

    train = rows[:32]
    base = _encode(tokenizer, [r["input"] for r in train])
    cf = _encode(tokenizer, [r["counterfactual_inputs"][0] for r in train])
    target = torch.tensor([tokenizer(r["cf_answer"], add_special_tokens=False)["input_ids"][0]
                           for r in train])
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    updates = _hand_das(model, base, cf, target, len(train), cached=False)
    document = _das_document(path)
    outs: dict = {"ours": [], "full": []}
    clock = _UpdateClock(per_epoch=updates // DAS_EPOCHS)

    def ours(kind: str, events) -> None:
        outs[kind].append(tempfile.mkdtemp(dir=tmp))
        run_document(document, out=outs[kind][-1], data_root=tmp, events=events,
                     resume_mib=0 if kind == "full" else None)
    times, _ = _alternated({
        "hooks": lambda: _hand_das(model, base, cf, target, len(train), cached=False),
        "cached": lambda: _hand_das(model, base, cf, target, len(train), cached=True),
        "ours": lambda: ours("ours", clock.listener),
        "full": lambda: ours("full", None)})
    hooks = times["hooks"]
    resumed_loss, full_loss = (load_file(next(Path(outs[kind][-1]).rglob("train_loss.safetensors")))
                               ["weight"] for kind in ("ours", "full"))
    return {"hooks_update_ms": hooks / updates * 1000, "cached_ratio": times["cached"] / hooks,
            "causalab_ratio": times["ours"] / hooks, "unresumed_ratio": times["full"] / hooks,
            "step_ratio": statistics.median(clock.gaps) / (hooks / updates),
            "gaps": len(clock.gaps), "updates": updates,
            "loss_error": float(((resumed_loss - full_loss).abs() / full_loss.abs()).max())}


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
              f"(without prefix resume {w1['unresumed_ratio']:.2f}x; target <= 0.40x); "
              f"max |diff| vs hooks {w1['max_abs_error']:.2e}; resumed "
              f"{'==' if w1['exact'] else '!='} unresumed")
        if w1["max_abs_error"] > 1e-4 or not w1["exact"]:
            raise SystemExit("W1: causalab and the hooks disagree")
        (Path(tmp) / "train.json").write_text(json.dumps(rows[:32]))
        (Path(tmp) / "eval.json").write_text(json.dumps(rows[32:]))
        w2 = das(model, tokenizer, rows, path, tmp)
        print(f"W2 DAS k={DAS_K} at block_output[{DAS_LAYER}], {w2['updates']} updates of 16 rows "
              f"(medians of {SAMPLES}): hooks per update {w2['hooks_update_ms']:.0f} ms = 1.00x, "
              f"hooks cf cached {w2['cached_ratio']:.2f}x; causalab per update "
              f"{w2['step_ratio']:.2f}x (median of {w2['gaps']} timed updates; target <= 0.40x); "
              f"causalab's whole fit {w2['causalab_ratio']:.2f}x (compile, a held-out eval per "
              f"epoch and the saves included; without prefix resume "
              f"{w2['unresumed_ratio']:.2f}x); resumed loss curve within "
              f"{w2['loss_error']:.1e} (relative) of the unresumed one")
        if w2["loss_error"] > 1e-5:
            raise SystemExit("W2: prefix resume changed the fit beyond float rounding")


if __name__ == "__main__":
    main()
