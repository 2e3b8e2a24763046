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


def _run_rendered(name: str, tmp_path_factory) -> Path:
    """``experiment=<name> model=gemma3`` rendered and run on the shipped IOI table."""
    from causalab.pipeline import run_document
    from causalab.hydra.rendering import render

    out = tmp_path_factory.mktemp(name)
    run_document(render([f"experiment={name}", "model=gemma3"]), out=str(out),
                 data_root=str(DATA))
    return out


def _mean(path: Path) -> float:
    values = list(_values(path).values())
    return sum(values) / len(values)


def _preferred(path: Path) -> float:
    """Fraction of rows whose logit difference is positive."""
    values = list(_values(path).values())
    return sum(value > 0 for value in values) / len(values)


@pytest.mark.slow
def test_the_behaviour_prefers_io_on_every_row_of_the_shipped_table(tmp_path_factory,
                                                                    gemma3_dir):
    out = _run_rendered("ioi_behavior", tmp_path_factory)
    # Measured: IO > S on 120 of 120 rows (the smallest margin 1.87), mean 4.86, top-1 0.83.
    assert _preferred(out / "logit_diff.json") >= 0.95
    assert _mean(out / "logit_diff.json") >= 3.0 and _mean(out / "top1.json") >= 0.7


@pytest.mark.slow
def test_the_subject_leaves_s2_and_the_answer_reaches_end_between_blocks_11_and_13(
        tmp_path_factory, gemma3_dir):
    out = _run_rendered("ioi_layer_sweep", tmp_path_factory)
    end = {layer: _preferred(out / f"layers={layer},pos=END" / "logit_diff.json")
           for layer in range(LAYERS)}
    s2 = {layer: _preferred(out / f"layers={layer},pos=S2" / "logit_diff.json")
          for layer in range(LAYERS)}
    s1 = {layer: _preferred(out / f"layers={layer},pos=S1" / "logit_diff.json")
          for layer in range(LAYERS)}
    # Measured on the 120 rows: END 0.00 through block 10, 0.23 at 11, 0.52 at 12, 1.00 from
    # 13; S2 1.00 through 9, 0.97 at 10, 0.21 / 0.38 at 11 / 12, 0.00 from 13; S1 at most 0.04.
    assert all(end[layer] <= 0.1 for layer in range(0, 11)), end
    assert all(end[layer] >= 0.8 for layer in range(13, LAYERS)), end
    assert all(s2[layer] >= 0.8 for layer in range(0, 11)), s2
    assert all(s2[layer] <= 0.1 for layer in range(13, LAYERS)), s2
    assert all(value <= 0.1 for value in s1.values()), s1


@pytest.mark.slow
def test_end_takes_on_the_unrelated_prompts_answer_from_block_12(tmp_path_factory, gemma3_dir):
    out = _run_rendered("ioi_unrelated_sweep", tmp_path_factory)
    moved = {layer: _preferred(out / f"layers={layer}" / "logit_diff.json")
             for layer in range(LAYERS)}
    # Measured: 0.00 through block 11, 1.00 from block 12 (IIA top-1 0.62-0.89).
    assert all(moved[layer] <= 0.1 for layer in range(0, 12)), moved
    assert all(moved[layer] >= 0.9 for layer in range(12, LAYERS)), moved


@pytest.mark.slow
def test_the_lens_reads_io_over_s_at_end_only_from_block_11(tmp_path_factory, gemma3_dir):
    out = _run_rendered("ioi_logit_lens", tmp_path_factory)
    diff = {layer: _mean(out / f"layers={layer}" / "logit_diff.json") for layer in range(LAYERS)}
    # Measured: -0.44 ... +0.20 through block 10, 15.8 at 11, 17.4 at 12 (top-1 0.97), 4.9 at 17.
    assert all(abs(diff[layer]) < 1.5 for layer in range(0, 11)), diff
    assert all(diff[layer] > 3.0 for layer in range(11, LAYERS)), diff
    assert _mean(out / "layers=12" / "top1.json") >= 0.8


@pytest.mark.slow
def test_das_entering_block_14_moves_the_answer_further_than_a_random_subspace_of_its_rank(
        tmp_path_factory, gemma3_dir):
    out = _run_rendered("ioi_das", tmp_path_factory)
    for k in (1, 4, 16):
        fitted = _mean(out / f"k={k}" / "test_logit_diff.json")
        control = _mean(out / f"k={k}" / "control_logit_diff.json")
        # Measured on the 36 held-out-template rows: -2.49 / -0.31 / +3.20 against -5.08 / -5.06 / -3.98.
        assert fitted >= control + (1.0 if k == 1 else 2.0), (k, fitted, control)
    assert _mean(out / "k=16" / "test_iia.json") >= _mean(out / "k=16" / "control_iia.json") + 0.2
