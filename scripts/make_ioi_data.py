"""Write the indirect-object-identification table documents/data/ioi/data.json (Wang et al. 2022).

Every row is one template filled with two names: the indirect object (IO) and the subject (S),
which the prompt names twice (S1, then S2 right before the verb). ABBA puts IO first, BABA puts S
first; the answer is " IO". Each row carries two counterfactuals: the same prompt with IO and S
exchanged everywhere (``counterfactual_inputs[0]``, answer " S" = ``cf_answer``) and the same
prompt with two unrelated names (``counterfactual_inputs[1]``, answer ``unrelated_answer``).
Positions are anchored by variable, not by index: ``S1`` and ``S2`` are the prompt's text up to
and including that name, ``END`` is the whole prompt, so ``{"index": -1, "scope": {"variable":
"S2"}}`` is the second subject token in every template whatever its length.

The names, places, objects and templates below are the lexicon; the table is committed, and this
script is how it was made. ``--check`` confirms with the real SmolLM2 tokenizer that every name is
one token with its leading space and that both counterfactuals tokenize to the base's length.

    .venv/bin/python scripts/make_ioi_data.py            # rewrite the table
    .venv/bin/python scripts/make_ioi_data.py --check    # also check tokens on smollm2-135m
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "documents" / "data" / "ioi" / "data.json"
NAMES = ("Mary", "John", "Alice", "Bob", "Sarah", "Tom", "James", "Emma", "Michael", "Lisa",
         "David", "Anna", "Paul", "Kate", "Mark", "Laura", "Peter", "Susan", "Daniel", "Rachel",
         "Kevin", "Karen", "Brian", "Jessica", "Eric", "Amy", "Steven", "Helen", "Jason", "Linda",
         "Ryan", "Nancy")
PLACES = ("store", "park", "school", "hospital", "restaurant", "station", "office", "garden",
          "library", "beach")
OBJECTS = ("drink", "book", "ring", "bag", "letter", "ball", "gift", "key", "flower", "note")
# {A} is named first, {B} second; {S} is the subject named again. Every template starts with a
# word that is not a name, so the text up to S1 occurs once in the prompt.
TEMPLATES = (
    "When {A} and {B} went to the {place}, {S} gave a {object} to",
    "After {A} and {B} arrived at the {place}, {S} handed a {object} to",
    "While {A} and {B} were at the {place}, {S} passed a {object} to",
    "Then, {A} and {B} had a long day at the {place}. {S} gave a {object} to",
    "Yesterday {A} and {B} walked to the {place}, and {S} offered a {object} to",
    "When {A} and {B} got to the {place}, {S} sent a {object} to",
    "Later, {A} and {B} met at the {place}. {S} brought a {object} to",
    "Once {A} and {B} left the {place}, {S} showed a {object} to",
    "Today {A} and {B} visited the {place}, where {S} threw a {object} to",
    "As {A} and {B} sat in the {place}, {S} lent a {object} to",
)
PER_TEMPLATE_ORDER = 6
SEED = 0
# The templates held out for test (3 of 10, drawn once with SEED): train and test rows share
# no template, so a held-out score measures a fit's reach to wordings it never saw.
TEST_TEMPLATES = tuple(sorted(random.Random(SEED).sample(range(len(TEMPLATES)), 3)))


def fill(template: str, io: str, s: str, order: str, place: str, thing: str) -> dict:
    """The prompt and its position anchors for one (IO, S) filling of ``template``."""
    first, second = (io, s) if order == "ABBA" else (s, io)
    text = template.format(A=first, B=second, S=s, place=place, object=thing)
    head = template.split("{S}")[0].format(A=first, B=second, place=place, object=thing)
    s1_end = text.index(f" {s}") + 1 + len(s) if order == "ABBA" else text.index(s) + len(s)
    return {"text": text, "S1": text[:s1_end], "S2": head + s, "END": text, "io": io, "s": s}


def make_row(template_id: int, order: str, names: list[str], place: str, thing: str,
             split: str) -> dict:
    """One row: base, name-swapped and unrelated-name counterfactuals, answers and anchors."""
    io, s, other_io, other_s = names
    template = TEMPLATES[template_id]
    base = fill(template, io, s, order, place, thing)
    swapped = fill(template, s, io, order, place, thing)
    unrelated = fill(template, other_io, other_s, order, place, thing)
    anchors = ("S1", "S2", "END", "io", "s")
    return {
        "input": base["text"],
        "counterfactual_inputs": [swapped["text"], unrelated["text"]],
        "counterfactual_inputs_variables": [{k: swapped[k] for k in anchors},
                                            {k: unrelated[k] for k in anchors}],
        **{k: base[k] for k in anchors},
        "base_answer": " " + io, "s_answer": " " + s, "cf_answer": " " + s,
        "unrelated_answer": " " + other_io, "order": order, "template": template_id,
        "split": split, "example_id": f"t{template_id}-{order}-{io}-{s}",
    }


def rows(seed: int = SEED) -> list[dict]:
    """Every template x order, ``PER_TEMPLATE_ORDER`` fillings each; the rows of
    :data:`TEST_TEMPLATES` are the test split."""
    chooser = random.Random(seed)
    made = []
    for template_id in range(len(TEMPLATES)):
        for order in ("ABBA", "BABA"):
            for _ in range(PER_TEMPLATE_ORDER):
                names = chooser.sample(NAMES, 4)
                made.append(make_row(template_id, order, names, chooser.choice(PLACES),
                                     chooser.choice(OBJECTS), "train"))
    return split_by(made, "template", TEST_TEMPLATES)


def split_by(table: list[dict], column: str, held_out) -> list[dict]:
    """``table`` with ``split`` "test" on the rows whose ``column`` is in ``held_out``, else
    "train": the two splits share no value of ``column``."""
    return [{**row, "split": "test" if row[column] in held_out else "train"} for row in table]


def check(table: list[dict]) -> list[str]:
    """Problems on the real SmolLM2 tokenizer: multi-token names, unequal prompt lengths."""
    from causalab.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve("causalab:smollm2-135m").path)
    problems = [f"name {name!r} is not one token with its space" for name in NAMES
                if len(tokenizer(" " + name, add_special_tokens=False)["input_ids"]) != 1]
    for row in table:
        lengths = {len(tokenizer(text)["input_ids"])
                   for text in [row["input"], *row["counterfactual_inputs"]]}
        if len(lengths) != 1:
            problems.append(f"{row['example_id']}: prompts of lengths {sorted(lengths)}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="tokenize on smollm2-135m")
    args = parser.parse_args()
    table = rows()
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {len(table)} rows to {TABLE.relative_to(REPO)}")
    problems = check(table) if args.check else []
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
