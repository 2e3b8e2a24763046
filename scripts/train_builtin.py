"""Train the ``weekday-*`` built-ins on the weekday task and write them into the package.

    .venv/bin/python scripts/train_builtin.py                 # all four families
    .venv/bin/python scripts/train_builtin.py weekday-llama   # one

Deterministic: weights start from the registry's seed (the same build as a tiny built-in), the
batch is the whole training set, one CPU thread and deterministic algorithms, so a rerun writes
bit-identical tensors and prints the same revision. Training stops at the first check where every
training prompt and at least 95% of held-out prompts are right and still are ``--extra`` steps
later (the margin). The registry's pinned ``revision`` must be updated by hand with what this prints.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from causalab.models import BUILTINS  # noqa: E402
from causalab.models.build import build_model, write_directory  # noqa: E402
from causalab.models.revision import directory_digest  # noqa: E402
from causalab.models.resolve import WEIGHTS  # noqa: E402
from causalab.models.weekday import held_out_rows, one_step_rows, train_rows  # noqa: E402

CHECK_EVERY = 50
# GPT-2 (learned absolute positions, LayerNorm) memorises the arithmetic table at weight decay 0.1
# and then drifts below 95% held-out; stronger decay makes it keep the rule.
RECIPES = {"weekday-gpt2": {"weight_decay": 1.0}}


def encode(tokenizer, rows):
    """Left-padded inputs with explicit positions (GPT-2's are absolute) and answer ids."""
    batch = tokenizer([prompt for prompt, _ in rows], return_tensors="pt", padding=True)
    positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    answers = [tokenizer(answer, add_special_tokens=False)["input_ids"] for _, answer in rows]
    assert all(len(ids) == 1 for ids in answers), "every answer must be one token"
    targets = torch.tensor([ids[0] for ids in answers])
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "position_ids": positions}, targets


def accuracy(model, inputs, targets) -> float:
    with torch.no_grad():
        logits = model(**inputs, logits_to_keep=1).logits[:, -1]
    return (logits.argmax(-1) == targets).float().mean().item()


def train(name: str, *, max_steps: int, extra: int, lr: float, weight_decay: float):
    """The trained model and tokenizer for registry entry ``name``, with a log line per check."""
    model, tokenizer = build_model(BUILTINS[name])
    inputs, targets = encode(tokenizer, train_rows())
    held_inputs, held_targets = encode(tokenizer, held_out_rows())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                                  betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50)
                                                 * max(0.1, 1 - step / max_steps))
    stop_at = None
    for step in range(1, max_steps + 1):
        model.train()
        logits = model(**inputs, logits_to_keep=1).logits[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % CHECK_EVERY and step != stop_at:
            continue
        model.eval()
        seen, held = accuracy(model, inputs, targets), accuracy(model, held_inputs, held_targets)
        print(f"{name} step {step} loss {loss.item():.4f} train {seen:.3f} held-out {held:.3f}",
              flush=True)
        good = seen == 1.0 and held >= 0.95
        if step == stop_at and good:
            break
        # Margin: stop only if the criterion still holds ``extra`` steps after it first did.
        stop_at = (stop_at or step + extra) if good else None
    return model.eval(), tokenizer


def report(name: str, model, tokenizer) -> dict:
    facts = {}
    for label, rows in (("one-step", one_step_rows()), ("train", train_rows()),
                        ("held-out", held_out_rows())):
        facts[label] = accuracy(model, *encode(tokenizer, rows))
    print(name, " ".join(f"{k} {v:.3f}" for k, v in facts.items()), flush=True)
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=[n for n, e in BUILTINS.items()
                                                      if e["kind"] == "weekday"])
    parser.add_argument("--out", default=str(WEIGHTS), help="folder for <name>/ directories")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--extra", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=None,
                        help="default 0.1, or the family's entry in RECIPES")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    for name in args.names:
        start = time.time()
        decay = args.weight_decay or RECIPES.get(name, {}).get("weight_decay", 0.1)
        model, tokenizer = train(name, max_steps=args.max_steps, extra=args.extra, lr=args.lr,
                                 weight_decay=decay)
        facts = report(name, model, tokenizer)
        directory = Path(args.out) / name
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink()
        write_directory(model, tokenizer, directory)
        print(f"{name} revision {directory_digest(directory)} "
              f"({time.time() - start:.0f} s, held-out {facts['held-out']:.3f})", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
