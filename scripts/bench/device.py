"""The accelerator half of ``device.sh``: the 8B shape in bf16 on one device, causalab against hand-written hooks.

On the Llama-3.1-8B stand-in (``causalab.models.standin``, written on the device's generator),
loaded once, over ``--rows`` weekday pairs: a head sweep over one layer's heads, attribution
over every head and a DAS fit at one layer (k = 16, a few updates), each run by causalab under
``--memory`` and timed, with the device's peak memory; the head sweep and attribution are then
computed again by hand-written torch hooks on the same model and device (a pre-hook on each
``o_proj`` swapping one head's slice at the last column; autograd through zero leaves added
there) and the largest difference of any value printed. A DAS fit has no hand-written twin
here: its cost and peak are what is measured. One table at the end; ``--dry`` (no device):
the same on the CPU with a small stand-in.

    python3 scripts/bench/device.py --device cuda --memory 120GiB
    python3 scripts/bench/device.py --dry
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from scale import Peak, attribution, das, head_sweep, pairs  # noqa: E402

GIB = 2 ** 30


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str, cpu_peak: int) -> int:
    return torch.cuda.max_memory_allocated() if device.startswith("cuda") else cpu_peak


def causalab_run(document: dict, rows: list, device: str, memory: str) -> dict:
    """Run through ``run_document`` on ``device``: seconds, peak bytes, tables by point."""
    from causalab.pipeline import run_document

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pairs.json").write_text(json.dumps(rows))
        _peak_reset(device)
        start = time.perf_counter()
        with Peak() as rss:
            run_document(document, out=f"{tmp}/out", data_root=tmp, device_map=device,
                         memory=memory)
        seconds = time.perf_counter() - start
        tables = {str(t.parent.relative_to(Path(tmp, "out"))): json.loads(t.read_text())
                  for t in sorted(Path(tmp, "out").rglob("logit_diff.json"))}
    return {"seconds": seconds, "peak": _peak(device, rss.peak), "tables": tables}


class Hooks:
    """Hand-written head patching and head attribution on the transformers Llama underneath."""

    def __init__(self, model, tokenizer, rows: list, device: str):
        self.model, self.device = model, device
        config = model.config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.base, self.cf = (self._encode(tokenizer, [r[f] if f == "input" else r[f][0]
                                                       for r in rows])
                              for f in ("input", "counterfactual_inputs"))
        ids = [[tokenizer(r[c], add_special_tokens=False)["input_ids"][0] for r in rows]
               for c in ("cf_answer", "base_answer")]
        self.a, self.b = (torch.tensor(i, device=device) for i in ids)

    def _encode(self, tokenizer, prompts):
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
        mask = enc["attention_mask"]
        return {"input_ids": enc["input_ids"].to(self.device), "attention_mask": mask.to(self.device),
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0).to(self.device)}

    def _o_proj(self, layer: int):
        return self.model.model.layers[layer].self_attn.o_proj

    def _diff(self, logits):
        rows = torch.arange(logits.shape[0], device=logits.device)
        return (logits[rows, self.a] - logits[rows, self.b]).float()

    def _last(self, batch, hooks: list):
        handles = [self._o_proj(layer).register_forward_pre_hook(hook) for layer, hook in hooks]
        try:
            return self.model(**batch, logits_to_keep=1).logits[:, -1]
        finally:
            for handle in handles:
                handle.remove()

    def heads(self, layer: int, heads: int) -> dict:
        """``head -> per-row logit diff`` with that head's last-column input to ``o_proj``
        swapped in from the counterfactual."""
        kept = {}
        with torch.no_grad():
            self._last(self.cf, [(layer, lambda m, args: kept.update(v=args[0][:, -1].clone()))])
            found = {}
            for head in range(heads):
                cut = slice(head * self.head_dim, (head + 1) * self.head_dim)

                def put(module, args, cut=cut):
                    x = args[0].clone()
                    x[:, -1, cut] = kept["v"][:, cut]
                    return (x,)
                found[head] = self._diff(self._last(self.base, [(layer, put)])).cpu()
        return found

    def attribution(self) -> torch.Tensor:
        """``(layers, rows, heads)``: Σ over each head's slice of (cf − base) · ∂metric/∂input
        at the last column, the gradient through a zero leaf added to every ``o_proj`` input."""
        layers = len(self.model.model.layers)
        cf, base, leaves = {}, {}, {}
        with torch.no_grad():
            self._last(self.cf, [(l, lambda m, a, l=l: cf.update({l: a[0][:, -1].clone()}))
                                 for l in range(layers)])

        def shift(layer):
            def hook(module, args):
                base[layer] = args[0][:, -1].detach().clone()
                leaves[layer] = torch.zeros_like(args[0], requires_grad=True)
                return (args[0] + leaves[layer],)
            return hook
        with torch.enable_grad():
            metric = self._diff(self._last(self.base, [(l, shift(l)) for l in range(layers)]))
            grads = torch.autograd.grad(metric.sum(), [leaves[l] for l in range(layers)])
        out = []
        for l in range(layers):
            product = ((cf[l] - base[l]).float() * grads[l][:, -1].float())
            out.append(product.reshape(product.shape[0], -1, self.head_dim).sum(-1).cpu())
        return torch.stack(out)


def compare_heads(tables: dict, hooks: dict, layer: int) -> tuple[float, int]:
    worst, count = 0.0, 0
    for point, rows in tables.items():
        head = int(point.split("heads=")[1].split("/")[0].strip("[]")) if "heads=" in point else None
        if head is None:
            continue
        for row in rows:
            index = int(row["example_id"])
            worst = max(worst, abs(row["value"] - float(hooks[head][index])))
            count += 1
    return worst, count


def compare_attribution(tables: dict, effects: torch.Tensor) -> tuple[float, int]:
    worst, count = 0.0, 0
    for rows in tables.values():
        for row in rows:
            place = row["coordinates"]
            expected = effects[place["layers"], int(row["example_id"]), place["heads"]]
            worst = max(worst, abs(row["effect"] - float(expected)))
            count += 1
    return worst, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="CPU, a small stand-in, few rows")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--memory", default="80%")
    args = parser.parse_args(argv)
    if args.dry:
        args.device, args.shape, args.rows = "cpu", "llama-tiny", 6
    from causalab import memory
    from causalab.engine.weights import load_model
    from causalab.models import load_config
    from causalab.models.revision import directory_digest, recorded
    from causalab.models.standin import standin
    from causalab.compile.plan import ModelRef

    start = time.perf_counter()
    path = str(standin(args.shape, generator_device=args.device))
    made = time.perf_counter() - start
    revision = recorded(path) or directory_digest(path)
    model_node = {"key": path, "revision": revision, "dtype": "bf16"}
    config = load_config(path)
    layers, heads, middle = config.num_hidden_layers, config.num_attention_heads, config.num_hidden_layers // 2
    rows = pairs(args.rows)
    weights = memory.weights_bytes(path, "bf16")
    lines = [("stand-in", f"{args.shape} written in {made:.0f} s, weights {weights / GIB:.2f} GiB bf16")]
    budget = memory.budget_bytes(args.memory, "cuda:0" if args.device.startswith("cuda") else "cpu")
    lines.append(("budget", f"{args.memory} = {budget / GIB:.1f} GiB on {args.device}"))
    results = {}
    for name, document in (("heads", head_sweep(model_node, [middle], heads)),
                           ("attribution", attribution(model_node)),
                           ("das", das(model_node, middle, pairs_per_update=8))):
        results[name] = causalab_run(document, rows, args.device, args.memory)
        found = results[name]
        lines.append((f"causalab {name}", f"{found['seconds']:.1f} s, peak {found['peak'] / GIB:.2f} GiB "
                      f"({found['peak'] / budget:.0%} of the budget)"))
        print(*lines[-1], sep=": ", flush=True)
    ref = ModelRef(key=path, revision=revision, dtype="bf16", attn_implementation=None, path=path)
    hf = load_model(ref, device_map=args.device)._model
    from causalab.models import load_tokenizer

    hooks = Hooks(hf, load_tokenizer(path), rows, args.device)
    start = time.perf_counter()
    by_head = hooks.heads(middle, heads)
    worst, count = compare_heads(results["heads"]["tables"], by_head, middle)
    lines.append(("hooks heads", f"{time.perf_counter() - start:.1f} s, largest difference "
                                 f"{worst:.3g} over {count} values"))
    start = time.perf_counter()
    effects = hooks.attribution()
    worst, count = compare_attribution(results["attribution"]["tables"], effects)
    lines.append(("hooks attribution", f"{time.perf_counter() - start:.1f} s, largest difference "
                  f"{worst:.3g} over {count} values"))
    width = max(len(label) for label, _ in lines)
    print("\n" + "\n".join(f"{label:<{width}}  {text}" for label, text in lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
