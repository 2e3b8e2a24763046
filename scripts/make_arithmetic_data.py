"""Write the single-digit addition table documents/data/arithmetic/data.json (MIB's arithmetic
task, made small: one-digit operands and sums, so every answer is one token on the real
built-ins and every prompt has one length).

Each row asks ``a + b`` after two worked examples (``1 + 2 = 3``, ``4 + 4 = 8``; those two sums
are not rows), ``a`` in 1..8, ``b`` in 0..8, ``a + b`` at most 9: 42 rows. The counterfactual
keeps ``a`` and changes ``b`` to another operand with a one-digit sum, chosen by
``(a + b) mod`` the number of choices, so the answer (``cf_answer``) always differs from the
base's (``base_answer``). Rows with an even ``a`` are ``train``, odd ones ``test``. Measured
with this script's ``--check``: SmolLM2-135M's top-1 is the sum on 38 of the 42 rows (22 tokens
a prompt), Gemma-3-270M's on 23 (23 tokens); docs/format.md §17.2 has the edge step's numbers.

    .venv/bin/python scripts/make_arithmetic_data.py            # rewrite the table
    .venv/bin/python scripts/make_arithmetic_data.py --check    # also score both real built-ins
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "documents" / "data" / "arithmetic" / "data.json"
PREFIX = "1 + 2 = 3\n4 + 4 = 8\n"
SHOWN = {(1, 2), (4, 4)}


def prompt(a: int, b: int) -> str:
    return f"{PREFIX}{a} + {b} = "


def rows() -> list[dict]:
    found = []
    for a in range(1, 9):
        for b in range(0, 10 - a):
            if (a, b) in SHOWN:
                continue
            choices = [x for x in range(0, 10 - a) if x != b]
            other = choices[(a + b) % len(choices)]
            found.append({"input": prompt(a, b), "counterfactual_inputs": [prompt(a, other)],
                          "a": str(a), "b": str(b), "cf_b": str(other),
                          "base_answer": str(a + b), "cf_answer": str(a + other),
                          "split": "train" if a % 2 == 0 else "test",
                          "example_id": f"add-{a}-{b}-to-{other}"})
    return found


def check(table: list[dict]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer, resolve

    for name in ("smollm2-135m", "gemma3-270m"):
        path = resolve(f"causalab:{name}").path
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = load_tokenizer(path)
        right, lengths = 0, set()
        for row in table:
            for text in (row["input"], row["counterfactual_inputs"][0]):
                lengths.add(len(tokenizer(text).input_ids))
            for cell in ("base_answer", "cf_answer"):
                assert len(tokenizer(row[cell], add_special_tokens=False).input_ids) == 1
            with torch.no_grad():
                logits = model(**tokenizer(row["input"], return_tensors="pt")).logits[0, -1]
            answer = tokenizer(row["base_answer"], add_special_tokens=False).input_ids[0]
            right += int(logits.argmax()) == answer
        assert len(lengths) == 1, (name, lengths)
        print(f"{name}: top-1 is the sum on {right} of {len(table)} rows; "
              f"{lengths.pop()} tokens a prompt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    table = rows()
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE.relative_to(REPO)}: {len(table)} rows")
    if args.check:
        check(table)


if __name__ == "__main__":
    main()
