"""Write the indirect-object-identification tables under documents/data/ (Wang et al. 2022).

Every row is one template filled with two names: the indirect object (IO) and the subject (S),
which the prompt names twice (S1, then S2 right before the verb). ABBA puts IO first, BABA puts S
first; the answer is " IO". Each row carries two counterfactuals: the same prompt with IO and S
exchanged everywhere (``counterfactual_inputs[0]``, answer " S" = ``cf_answer``) and the same
prompt with two unrelated names (``counterfactual_inputs[1]``, answer ``unrelated_answer``).
Positions are anchored by variable, not by index: ``S1`` and ``S2`` are the prompt's text up to
and including that name, ``END`` is the whole prompt, so ``{"index": -1, "scope": {"variable":
"S2"}}`` is the second subject token in every template whatever its length.

Splits: the test rows are the templates of the held-out families (:data:`TEST_FAMILIES`), whose
frames and words no training template shares; ``valid`` is :data:`VALID_ROWS` rows carved from
the training ones, for a fit's per-epoch evaluation; the rest train. ``ioi/data.json`` shares
names across splits; ``ioi_names/data.json`` also holds out the names of its test rows.

The names, places, objects and templates below are the lexicon; the tables are committed, and
this script is how they were made. ``--check`` confirms with the real SmolLM2 tokenizer that every name is
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
NAMES_TABLE = REPO / "documents" / "data" / "ioi_names" / "data.json"
NAMES = ("Mary", "John", "Alice", "Bob", "Sarah", "Tom", "James", "Emma", "Michael", "Lisa",
         "David", "Anna", "Paul", "Kate", "Mark", "Laura", "Peter", "Susan", "Daniel", "Rachel",
         "Kevin", "Karen", "Brian", "Jessica", "Eric", "Amy", "Steven", "Helen", "Jason", "Linda",
         "Ryan", "Nancy")
PLACES = ("store", "park", "school", "hospital", "restaurant", "station", "office", "garden",
          "library", "beach")
OBJECTS = ("drink", "book", "ring", "bag", "letter", "ball", "gift", "key", "flower", "note")
# {A} is named first, {B} second; {S} is the subject named again. Every template starts with a
# word that is not a name, so the text up to S1 occurs once in the prompt. Each template has a
# family, the frame it is built on; a family is all train or all test.
TEMPLATES = (
    ("When {A} and {B} went to the {place}, {S} gave a {object} to", "clause first"),
    ("After {A} and {B} arrived at the {place}, {S} handed a {object} to", "clause first"),
    ("While {A} and {B} were at the {place}, {S} passed a {object} to", "clause first"),
    ("Then, {A} and {B} had a long day at the {place}. {S} gave a {object} to", "two sentences"),
    ("Yesterday {A} and {B} walked to the {place}, and {S} offered a {object} to", "main clause"),
    ("When {A} and {B} got to the {place}, {S} sent a {object} to", "clause first"),
    ("Later, {A} and {B} met at the {place}. {S} brought a {object} to", "two sentences"),
    ("Once {A} and {B} left the {place}, {S} showed a {object} to", "clause first"),
    ("Today {A} and {B} visited the {place}, where {S} threw a {object} to", "main clause"),
    ("As {A} and {B} sat in the {place}, {S} lent a {object} to", "clause first"),
    # Held out: two frames no training template uses, in words none of them has besides the
    # task's own ("and", "the", "a", "to"); tests/compile/test_corpus.py checks the overlap.
    ("Because {A} and {B} stayed late inside the {place}, {S} mailed a {object} to", "because"),
    ("Since {A} and {B} worked all morning near the {place}, {S} tossed a {object} to",
     "because"),
    ("Relaxing by the {place}, {A} and {B} chatted until {S} finally delivered a {object} to",
     "participle first"),
)
PER_TEMPLATE_ORDER = 6
SEED = 0
# The families held out for test: train and test rows share no template and no frame, so a
# held-out score measures a fit's reach to wordings it never saw.
TEST_FAMILIES = ("because", "participle first")
# Carved from the training rows (a seeded draw): what a fit evaluates each epoch, so the test
# rows are scored once, after it.
VALID_ROWS = 12
# documents/data/ioi_names/: the same split, and the test rows' names also held out (the last
# eight names fill only test rows; the first 24 only train and valid ones).
TEST_NAMES = NAMES[24:]


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
    template, family = TEMPLATES[template_id]
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
        "family": family, "split": split, "example_id": f"t{template_id}-{order}-{io}-{s}",
    }


def rows(seed: int = SEED, held_out_names: bool = False) -> list[dict]:
    """Every template x order, ``PER_TEMPLATE_ORDER`` fillings each; the rows of
    :data:`TEST_FAMILIES` are the test split, :data:`VALID_ROWS` of the others (a seeded
    draw) the validation split. ``held_out_names``: test rows are filled from
    :data:`TEST_NAMES` only, every other row from the other names."""
    chooser = random.Random(seed)
    made = []
    for template_id, (_, family) in enumerate(TEMPLATES):
        test = family in TEST_FAMILIES
        names = NAMES if not held_out_names else TEST_NAMES if test else \
            NAMES[:len(NAMES) - len(TEST_NAMES)]
        for order in ("ABBA", "BABA"):
            drawn: set[tuple[str, str]] = set()
            for _ in range(PER_TEMPLATE_ORDER):
                picked = chooser.sample(names, 4)
                while tuple(picked[:2]) in drawn:  # an (IO, S) pair once per template and order
                    picked = chooser.sample(names, 4)
                drawn.add(tuple(picked[:2]))
                made.append(make_row(template_id, order, picked, chooser.choice(PLACES),
                                     chooser.choice(OBJECTS), "test" if test else "train"))
    training = [i for i, row in enumerate(made) if row["split"] == "train"]
    for i in random.Random(seed + 1).sample(training, VALID_ROWS):
        made[i]["split"] = "valid"
    return made


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
    tables = ((TABLE, rows()), (NAMES_TABLE, rows(held_out_names=True)))
    for path, written in tables:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(written, indent=1) + "\n")
        print(f"wrote {len(written)} rows to {path.relative_to(REPO)}")
    problems = [p for _, written in tables for p in check(written)] if args.check else []
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
