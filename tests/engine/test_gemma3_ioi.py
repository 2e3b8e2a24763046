"""IOI on Gemma-3-270M: an outsider's prompts in the fast suite, the shipped experiments' science
in the slow one.

The fast tests write an IOI document with names, places and templates that neither the
repository's IOI table nor its SmolLM2 tests contain, and run it through
``causalab.pipeline.run_document``: Gemma-3 prefers IO over S on at least 90 % of rows, and
swapping the END residual from the name-swapped prompt moves at most 10 % of answers at block 2
and at least 80 % at block ``LATE`` (the answer is written at END by late heads, Wang et al.
2022). One interchange is recomputed with plain torch hooks on a transformers model. The slow
tests run every ``experiment=ioi_*`` rendered for ``model=gemma3`` on the shipped table.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "documents" / "data"
KEY = "causalab:gemma3-270m"
NAMES = ("Hannah", "Isaac", "Martin", "Nora", "Felix", "Clara", "Simon", "Hugo", "Vera", "Diana",
         "Edgar", "Fiona", "Gavin", "Ian", "Jack", "Liam", "Mia", "Noah", "Walter", "Zoe")
PLACES = ("harbour", "bakery", "garden", "gym")
THINGS = ("ticket", "book", "letter", "basket")
TEMPLATES = (
    "After {A} and {B} finished lunch at the {place}, {S} handed the {thing} to",
    "Late one evening {A} and {B} sat near the {place}, where {S} showed the {thing} to",
    "While {A} and {B} waited outside the {place}, {S} passed a {thing} to",
    "Once {A} and {B} had cleaned the {place}, {S} threw the {thing} to",
)
EARLY, LATE = 2, 15
LAYERS = 18


def _prompt(template: str, io: str, s: str, order: str, place: str, thing: str) -> str:
    first, second = (io, s) if order == "ABBA" else (s, io)
    return template.format(A=first, B=second, S=s, place=place, thing=thing)


def outsider_rows(per_cell: int = 3) -> list[dict]:
    """24 rows: every template x order, names drawn from a lexicon the repository's table lacks."""
    draw, rows = random.Random(11), []
    for t, template in enumerate(TEMPLATES):
        for order in ("ABBA", "BABA"):
            for i in range(per_cell):
                io, s = draw.sample(NAMES, 2)
                place, thing = draw.choice(PLACES), draw.choice(THINGS)
                rows.append({
                    "input": _prompt(template, io, s, order, place, thing),
                    "counterfactual_inputs": [_prompt(template, s, io, order, place, thing)],
                    "base_answer": " " + io, "cf_answer": " " + s,
                    "example_id": f"g{t}-{order}-{i}"})
    return rows


def outsider_document(revision: str) -> dict:
    """Behaviour and END patching at blocks ``EARLY`` and ``LATE``, without the conf groups."""
    logits = {"site": "head", "pos": -1, "model": "patched", "input": "base"}
    return {
        "header": {"description": "An outsider's IOI check on Gemma-3: END patching, early/late."},
        "model": {"key": KEY, "revision": revision, "dtype": "fp32",
                  "attn_implementation": "eager"},
        "roles": {"base": {"field": "input"},
                  "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"resid": {"component": "block_output", "layers": [{"sweep": [EARLY, LATE]}]},
                  "head": {"component": "lm_head"}},
        "interventions": {
            "behavior": {
                "reads": {"logits": {"site": "head", "pos": -1, "input": "base"}},
                "metrics": {"io_minus_s": {"kind": "logit_diff", "of": "logits",
                                           "a": "base_answer", "b": "cf_answer"}}},
            "patch": {
                "reads": {"v_cf": {"site": "resid", "pos": -1, "input": "counterfactual"},
                          "logits": logits},
                "writes": {"swap": {"site": "resid", "pos": -1, "mechanism": "swap",
                                    "operand": "v_cf"}},
                "models": {"patched": {"input": "base", "writes": ["swap"]}},
                "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits",
                                           "a": "cf_answer", "b": "base_answer"}}}},
        "steps": {
            "behavior": {"kind": "observe", "interventions": "behavior",
                         "rows": {"base": "outsider/ioi"},
                         "saves": [{"value": "io_minus_s", "file_path": "io_minus_s.json"}]},
            "patch": {"kind": "observe", "interventions": "patch",
                      "rows": {"base": "outsider/ioi", "counterfactual": "outsider/ioi"},
                      "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def _values(path: Path) -> dict[str, float]:
    return {row["example_id"]: row["value"] for row in json.loads(path.read_text())
            if row["eligible"]}


@pytest.fixture(scope="module")
def outsider(tmp_path_factory, gemma3_dir):
    from causalab.models import BUILTINS
    from causalab.pipeline import run_document

    root = tmp_path_factory.mktemp("outsider")
    (root / "data" / "outsider").mkdir(parents=True)
    rows = outsider_rows()
    (root / "data" / "outsider" / "ioi.json").write_text(json.dumps(rows))
    document = outsider_document(BUILTINS["gemma3-270m"]["revision"])
    run_document(document, out=str(root / "out"), data_root=str(root / "data"))
    return root / "out", rows


def test_the_outsiders_names_are_single_tokens_and_absent_from_the_repository_table(gemma3_dir):
    from causalab.models import load_tokenizer

    tokenizer = load_tokenizer(gemma3_dir)
    shipped = (DATA / "ioi" / "data.json").read_text()
    smollm2_tests = (REPO / "tests" / "engine" / "test_smollm2_ioi.py").read_text()
    for name in NAMES:
        assert len(tokenizer(" " + name, add_special_tokens=False)["input_ids"]) == 1, name
        assert name not in shipped and f'"{name}"' not in smollm2_tests, name
    for template in TEMPLATES:
        assert template.split("{B}")[1].split("{place}")[0] not in shipped, template


def test_gemma3_prefers_io_over_s_on_at_least_90_percent_of_an_outsiders_rows(outsider):
    out, rows = outsider
    diffs = _values(out / f"layers={EARLY}" / "io_minus_s.json")
    assert len(diffs) == len(rows)
    assert sum(value > 0 for value in diffs.values()) >= 0.9 * len(rows), diffs


def test_end_patching_moves_few_answers_at_block_2_and_most_near_the_last_blocks(outsider):
    # Moved: the patched run prefers the counterfactual's answer (S) over the base's (IO).
    out, rows = outsider
    early = _values(out / f"layers={EARLY}" / "logit_diff.json")
    late = _values(out / f"layers={LATE}" / "logit_diff.json")
    assert len(early) == len(late) == len(rows)
    assert sum(value > 0 for value in early.values()) <= 0.1 * len(rows), early
    assert sum(value > 0 for value in late.values()) >= 0.8 * len(rows), late


def test_the_late_interchange_agrees_with_plain_torch_hooks(outsider, gemma3_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    out, rows = outsider
    tokenizer = load_tokenizer(gemma3_dir)
    model = AutoModelForCausalLM.from_pretrained(gemma3_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    layer, kept = model.model.layers[LATE], {}

    def forward(texts, edit):
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        handle = layer.register_forward_hook(lambda module, args, output: edit(output))
        try:
            with torch.no_grad():
                return model(**batch, position_ids=positions).logits[:, -1]
        finally:
            handle.remove()

    def keep(output):
        kept["end"] = output[:, -1].clone()

    def swap(output):
        output = output.clone()
        output[:, -1] = kept["end"]
        return output
    forward([row["counterfactual_inputs"][0] for row in rows], keep)
    logits = forward([row["input"] for row in rows], swap)
    table = _values(out / f"layers={LATE}" / "logit_diff.json")
    for i, row in enumerate(rows):
        cf, base = (tokenizer(row[c], add_special_tokens=False)["input_ids"][0]
                    for c in ("cf_answer", "base_answer"))
        assert table[row["example_id"]] == pytest.approx(
            (logits[i, cf] - logits[i, base]).item(), abs=2e-3)
