"""Write the shipped weekday and counting tables under documents/data/ (docs/format.md §4.3).

The tables are committed; this script is how they were made and how to check them. It uses the
standard library only, except ``--check``, which tokenizes the aligned pairs with the built-in
tiny Llama's tokenizer to confirm both prompts of every row have one length.

    .venv/bin/python scripts/make_data.py            # rewrite the tables
    .venv/bin/python scripts/make_data.py --check    # also check weekdays_aligned on tiny-llama
"""
from __future__ import annotations

import argparse
import sys
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "documents" / "data"
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NUMBERS = ("one", "two", "three", "four")
# Days that are one token on the tiny-Llama hub fixture as well as on the built-in tokenizer,
# so these pairs align on both.
ALIGNED = (("Monday", "Friday"), ("Friday", "Saturday"), ("Saturday", "Sunday"),
           ("Sunday", "Monday"), ("Monday", "Saturday"), ("Friday", "Sunday"))
TEST_PAIRS = 12
# Carved from the training pairs: the rows a fit evaluates each epoch on (its early stop and its
# curve), so the test pairs are scored once, after the fit, and select nothing.
VALID_PAIRS = 6
SPLIT_SEED = 0


def prompt(day: str) -> str:
    return f"If today is {day}, tomorrow is"


def tomorrow(day: str) -> str:
    return " " + DAYS[(DAYS.index(day) + 1) % 7]


def pair_row(base: str, cf: str, split: str, *, variables: bool = True) -> dict:
    """One interchange row: the base prompt and one counterfactual, answers space-prefixed.

    With ``variables`` the counterfactual's entity sits in ``counterfactual_inputs_variables``;
    without, it is the top-level ``cf_entity`` column (the weekdays_full layout).
    """
    row: dict = {"input": prompt(base), "counterfactual_inputs": [prompt(cf)]}
    if variables:
        row["counterfactual_inputs_variables"] = [{"entity": cf}]
    row["entity"] = base
    if not variables:
        row["cf_entity"] = cf
    row |= {
        "base_answer": tomorrow(base), "cf_answer": tomorrow(cf),
        "answer": tomorrow(base), "label": tomorrow(cf),
        "split": split, "example_id": f"{base[:3]}-{cf[:3]}",
    }
    return row


def weekdays_train() -> list[dict]:
    pairs = (("Thursday", "Saturday"), ("Friday", "Sunday"), ("Saturday", "Thursday"),
             ("Sunday", "Friday"))
    return [pair_row(b, c, "all") for b, c in pairs]


def weekdays_data() -> list[dict]:
    # Disjoint from weekdays/train, so a fit on one and an eval on the other shares no rows.
    pairs = (("Tuesday", "Thursday", "train"), ("Wednesday", "Friday", "train"),
             ("Monday", "Friday", "test"), ("Sunday", "Saturday", "test"))
    return [pair_row(b, c, s) for b, c, s in pairs]


def weekdays_full() -> list[dict]:
    """All 42 ordered pairs of distinct days: 12 drawn for test by a fixed-seed shuffle, then 6
    of the other 30 for validation (``valid``), the 24 left to train."""
    pairs = [(b, c) for b in DAYS for c in DAYS if b != c]
    test = set(random.Random(SPLIT_SEED).sample(range(len(pairs)), TEST_PAIRS))
    rest = [i for i in range(len(pairs)) if i not in test]
    valid = set(random.Random(SPLIT_SEED + 1).sample(rest, VALID_PAIRS))
    return [pair_row(b, c, "test" if i in test else "valid" if i in valid else "train",
                     variables=False) for i, (b, c) in enumerate(pairs)]


def weekdays_aligned() -> list[dict]:
    return [pair_row(b, c, "all") for b, c in ALIGNED]


def weekdays_said(said: tuple[str, ...]) -> list[dict]:
    """Generation rows: ``said`` is a word expected somewhere in the generated continuation."""
    rows = weekdays_train()
    for row, word in zip(rows, said):
        row["said"] = word
    return rows


# The tiny Llama's weights are random, so its greedy continuations are not weekdays: these
# words were read off its 6-token continuations so that generated_answer.json meets every case
# once per reason: found ("The", "owing"), missing (" Saturday"), found twice (" 62").
SAID = ("The", " Saturday", "owing", " 62")


def weekdays_chat() -> list[dict]:
    """Chat rows: a worked example turn, then the question (user / assistant / user)."""
    rows = []
    for base, cf in (("Thursday", "Saturday"), ("Sunday", "Friday"), ("Monday", "Wednesday")):
        def chat(day: str) -> list[dict]:
            return [
                {"role": "user", "content": "If today is Tuesday, what day is tomorrow?"},
                {"role": "assistant", "content": "Wednesday"},
                {"role": "user", "content": f"If today is {day}, what day is tomorrow?"},
            ]
        rows.append({
            "chat": chat(base), "counterfactual_chat": [chat(cf)],
            "counterfactual_chat_variables": [{"entity": cf}], "entity": base,
            "base_answer": tomorrow(base), "cf_answer": tomorrow(cf),
            "answer": tomorrow(base), "label": tomorrow(cf), "split": "all",
            "example_id": f"{base[:3]}-{cf[:3]}",
        })
    return rows


def counting_train() -> list[dict]:
    """How many days lie between two weekdays, answered with a number word (" one"…" four")."""
    def ask(day: str) -> str:
        return f"The number of days from Monday to {day} is"
    days = DAYS[1:5]
    rows = []
    for i, day in enumerate(days):
        cf = days[(i + 2) % 4]
        rows.append({
            "input": ask(day), "counterfactual_inputs": [ask(cf)],
            "counterfactual_inputs_variables": [{"entity": cf}], "entity": day,
            "base_answer": " " + NUMBERS[i], "cf_answer": " " + NUMBERS[days.index(cf)],
            "answer": " " + NUMBERS[i], "label": " " + NUMBERS[days.index(cf)],
            "split": "all", "example_id": f"{day[:3]}-{cf[:3]}",
        })
    return rows


TABLES = {
    "weekdays/train.json": weekdays_train,
    "weekdays/data.json": weekdays_data,
    "weekdays_full/data.json": weekdays_full,
    "weekdays_aligned/data.json": weekdays_aligned,
    "weekdays/said.json": lambda: weekdays_said(SAID),
    "weekdays/chat.json": weekdays_chat,
    "counting/train.json": counting_train,
}


def write(root: Path = ROOT) -> list[Path]:
    written = []
    for name, make in TABLES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(make(), indent=2, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def check_aligned() -> None:
    """Both prompts of every aligned row tokenize to one length on the built-in tiny Llama."""
    from causalab.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve("causalab:tiny-llama").path)
    for row in weekdays_aligned():
        lengths = [len(tokenizer(text)["input_ids"])
                   for text in (row["input"], row["counterfactual_inputs"][0])]
        if lengths[0] != lengths[1]:
            raise SystemExit(f"{row['example_id']}: prompts tokenize to {lengths}")
    print("weekdays_aligned: every row's two prompts have one length")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check alignment on tiny-llama")
    args = parser.parse_args()
    # A checkout without `make setup` has no installed package: run against this tree.
    sys.path.insert(0, str(REPO))
    for path in write():
        print(path.relative_to(ROOT.parents[1]))
    if args.check:
        check_aligned()


if __name__ == "__main__":
    main()
