"""IOI on SmolLM2-135M: an outsider's document, the shipped table, and the shipped suite's science.

The fast tests write an IOI document with names, places and templates the repository does not
contain into a temporary folder and run it through ``causalab.pipeline.run_document``: the model
prefers IO over S on at least 90 % of rows, and swapping the END residual from the name-swapped
prompt moves at most 10 % of answers at layer 2 and at least 80 % at layer 27 (Wang et al. 2022:
the answer is written at END by late heads). One interchange is recomputed with plain torch hooks
on a transformers model. The slow tests run the shipped documents/real/ioi_* on all 120 rows.
"""
from __future__ import annotations

import json
import random
import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "documents" / "real"
DATA = REPO / "documents" / "data"
KEY = "causalab:smollm2-135m"
NAMES = ("Oscar", "Ruth", "Victor", "Grace", "Henry", "Olivia", "George", "Sophia", "Frank",
         "Julia", "Oliver", "Leo", "Max", "Ella", "Sam", "Ivy", "Adam", "Rose", "Luke", "Carl")
PLACES = ("museum", "kitchen", "cafe", "zoo")
THINGS = ("cup", "map", "pen", "coin")
TEMPLATES = (
    "Before {A} and {B} started dinner at the {place}, {S} passed the {thing} to",
    "On Sunday {A} and {B} went to the {place}, and then {S} gave the {thing} to",
    "Because {A} and {B} were tired after the {place}, {S} handed the {thing} to",
    "The {place} was quiet when {A} and {B} arrived; {S} tossed the {thing} to",
)
EARLY, LATE = 2, 27
# Heads ioi_head_patching finds moving the END answer (36 test rows): L23 H3 most (S - IO -4.74
# -> -0.81), which attends to S; L23 H0 and H1 (-> -3.82, -4.16) and L24 H4, which pushes the
# other way (-> -6.67), attend to IO.
IO_HEADS = ((23, 0), (23, 1), (24, 4))
S_HEAD = (23, 3)


def _prompt(template: str, io: str, s: str, order: str, place: str, thing: str) -> str:
    first, second = (io, s) if order == "ABBA" else (s, io)
    return template.format(A=first, B=second, S=s, place=place, thing=thing)


def outsider_rows(per_cell: int = 3) -> list[dict]:
    """24 rows: every template x order, names drawn from a lexicon the repository lacks."""
    draw, rows = random.Random(7), []
    for t, template in enumerate(TEMPLATES):
        for order in ("ABBA", "BABA"):
            for i in range(per_cell):
                io, s = draw.sample(NAMES, 2)
                place, thing = draw.choice(PLACES), draw.choice(THINGS)
                rows.append({
                    "input": _prompt(template, io, s, order, place, thing),
                    "counterfactual_inputs": [_prompt(template, s, io, order, place, thing)],
                    "base_answer": " " + io, "cf_answer": " " + s,
                    "example_id": f"o{t}-{order}-{i}"})
    return rows


def outsider_document(revision: str) -> dict:
    """Behaviour and END patching at layers 2 and 27, written without the repo's conf groups."""
    logits = {"site": "head", "pos": -1, "model": "patched", "input": "base"}
    return {
        "header": {"description": "An outsider's IOI check: END residual patching, early/late."},
        "model": {"key": KEY, "revision": revision, "dtype": "fp32"},
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
                "metrics": {"moved": {"kind": "match", "of": "logits", "expected": "cf_answer"},
                            "logit_diff": {"kind": "logit_diff", "of": "logits",
                                           "a": "cf_answer", "b": "base_answer"}}}},
        "steps": {
            "behavior": {"kind": "observe", "interventions": "behavior",
                         "rows": {"base": "outsider/ioi"},
                         "saves": [{"value": "io_minus_s", "file_path": "io_minus_s.json"}]},
            "patch": {"kind": "observe", "interventions": "patch",
                      "rows": {"base": "outsider/ioi", "counterfactual": "outsider/ioi"},
                      "saves": [{"value": "moved", "file_path": "moved.json"},
                                {"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def _values(path: Path) -> dict[str, float]:
    return {row["example_id"]: row["value"] for row in json.loads(path.read_text())
            if row["eligible"]}


@pytest.fixture(scope="module")
def outsider(tmp_path_factory, smollm2_dir):
    from causalab.models import resolve
    from causalab.pipeline import run_document

    root = tmp_path_factory.mktemp("outsider")
    (root / "data" / "outsider").mkdir(parents=True)
    rows = outsider_rows()
    (root / "data" / "outsider" / "ioi.json").write_text(json.dumps(rows))
    document = outsider_document(resolve(KEY).revision)
    (root / "ioi.json").write_text(json.dumps(document))
    run_document(document, out=str(root / "out"), data_root=str(root / "data"))
    return root / "out", rows


def test_the_outsiders_names_are_single_tokens_and_absent_from_the_repository(smollm2_dir):
    from causalab.models import load_tokenizer

    tokenizer = load_tokenizer(smollm2_dir)
    shipped = (DATA / "ioi" / "data.json").read_text()
    for name in NAMES:
        assert len(tokenizer(" " + name, add_special_tokens=False)["input_ids"]) == 1, name
        assert f'"{name}"' not in shipped and f" {name} " not in shipped, name


def test_smollm2_prefers_io_over_s_on_at_least_90_percent_of_an_outsiders_rows(outsider):
    out, rows = outsider
    # The behaviour step reads no swept site, so every point holds the same table.
    diffs = _values(out / f"layers={EARLY}" / "io_minus_s.json")
    assert len(diffs) == len(rows)
    assert sum(value > 0 for value in diffs.values()) >= 0.9 * len(rows), diffs


def test_end_patching_moves_few_answers_at_layer_2_and_most_at_layer_27(outsider):
    # An answer moved when the patched run prefers the counterfactual's answer (S) over the
    # base's (IO): logit_diff = cf_answer - base_answer > 0. Top-1 is stricter (a template
    # can put " the" first): it is checked early, where it must stay near zero too.
    out, rows = outsider
    early = _values(out / f"layers={EARLY}" / "logit_diff.json")
    late = _values(out / f"layers={LATE}" / "logit_diff.json")
    assert len(early) == len(late) == len(rows)
    assert sum(value > 0 for value in early.values()) <= 0.1 * len(rows), early
    assert sum(value > 0 for value in late.values()) >= 0.8 * len(rows), late
    assert sum(_values(out / f"layers={EARLY}" / "moved.json").values()) <= 0.1 * len(rows)


def test_the_layer_27_interchange_agrees_with_plain_torch_hooks(outsider, smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    out, rows = outsider
    tokenizer = load_tokenizer(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    layer, kept = model.model.layers[LATE], {}

    def forward(texts, edit):
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        handle = layer.register_forward_hook(lambda module, args, output: edit(output))
        try:
            with torch.no_grad():
                return model(**batch).logits[:, -1]
        finally:
            handle.remove()

    def keep(output):
        kept["end"] = output[:, -1].clone()

    def swap(output):
        output = output.clone()
        output[:, -1] = kept["end"]
        return output
    # Left padding keeps END at the last index of every row; the two prompts of a row have one
    # length (single-token names), so the same index is END on both sides.
    forward([row["counterfactual_inputs"][0] for row in rows], keep)
    logits = forward([row["input"] for row in rows], swap)
    table = _values(out / f"layers={LATE}" / "logit_diff.json")
    for i, row in enumerate(rows):
        cf, base = (tokenizer(row[c], add_special_tokens=False)["input_ids"][0]
                    for c in ("cf_answer", "base_answer"))
        # fp32 over 30 layers, batch of 24 vs causalab's fused batch: differences ~1e-5 logits.
        assert table[row["example_id"]] == pytest.approx((logits[i, cf] - logits[i, base]).item(),
                                                         abs=2e-3)


def test_the_shipped_ioi_table_has_100_rows_both_orders_and_single_token_names(smollm2_dir):
    from causalab.models import load_tokenizer

    tokenizer = load_tokenizer(smollm2_dir)
    rows = json.loads((DATA / "ioi" / "data.json").read_text())
    assert len(rows) >= 100 and {row["order"] for row in rows} == {"ABBA", "BABA"}
    for row in rows:
        texts = [row["input"], *row["counterfactual_inputs"]]
        assert len({len(tokenizer(text)["input_ids"]) for text in texts}) == 1, row["example_id"]
        for column in ("base_answer", "cf_answer", "unrelated_answer"):
            assert len(tokenizer(row[column], add_special_tokens=False)["input_ids"]) == 1
        swapped, unrelated = row["counterfactual_inputs_variables"]
        assert (swapped["io"], swapped["s"]) == (row["s"], row["io"])
        assert {unrelated["io"], unrelated["s"]}.isdisjoint({row["io"], row["s"]})
        for anchor in ("S1", "S2"):
            assert row[anchor].endswith(row["s"]) and row["input"].count(row[anchor]) == 1


def test_the_ioi_table_is_what_its_script_makes():
    script = runpy.run_path(str(REPO / "scripts" / "make_ioi_data.py"))
    assert script["rows"]() == json.loads((DATA / "ioi" / "data.json").read_text())


def test_the_ioi_splits_share_no_template_and_say_the_names_they_share():
    """Held out by template family: DAS's test rows are wordings its fit never saw, and its
    validation rows are carved from the training templates. Names are not held out in this
    table (ioi_names holds them out): every test name also occurs in training."""
    table = json.loads((DATA / "ioi" / "data.json").read_text())
    train, valid, test = ([row for row in table if row["split"] == split]
                          for split in ("train", "valid", "test"))
    assert (len(train), len(valid), len(test)) == (108, 12, 36)
    assert len(train) + len(valid) + len(test) == len(table)
    templates = [{row["template"] for row in rows} for rows in (train + valid, test)]
    assert templates[0].isdisjoint(templates[1]) and len(templates[1]) == 3
    assert {row["template"] for row in valid} <= {row["template"] for row in train}
    names = [{row[key] for row in rows for key in ("io", "s")} for rows in (train, test)]
    assert names[1] <= names[0]


SHIPPED = ("ioi_behavior", "ioi_layer_sweep", "ioi_unrelated_sweep", "ioi_head_patching",
           "ioi_logit_lens", "ioi_das")


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_ioi_document_is_the_rendering_of_its_conf_twin(name):
    from causalab.document import digest
    from causalab.hydra.rendering import render

    shipped = json.loads((REAL / f"{name}.json").read_text())
    assert digest(render([f"experiment={name}", "model=smollm2"])) == digest(shipped)
    assert shipped["model"]["key"] == KEY


def _run_shipped(name: str, tmp_path_factory) -> Path:
    from causalab.pipeline import run_document

    out = tmp_path_factory.mktemp(name)
    run_document(json.loads((REAL / f"{name}.json").read_text()), out=str(out),
                 data_root=str(DATA))
    return out


def _mean(path: Path) -> float:
    values = list(_values(path).values())
    return sum(values) / len(values)


def _preferred(path: Path) -> float:
    """Fraction of rows whose patched run prefers the counterfactual's answer."""
    values = list(_values(path).values())
    return sum(value > 0 for value in values) / len(values)


@pytest.mark.slow
def test_the_shipped_behaviour_prefers_io_on_nearly_every_row(tmp_path_factory, smollm2_dir):
    out = _run_shipped("ioi_behavior", tmp_path_factory)
    # Measured: IO > S on 119 of 120 rows, mean IO - S 4.9, top-1 0.83.
    assert _preferred(out / "logit_diff.json") >= 0.95
    assert _mean(out / "logit_diff.json") >= 3.0


@pytest.mark.slow
def test_the_subject_moves_from_s2_to_end_between_the_middle_and_late_layers(
        tmp_path_factory, smollm2_dir):
    out = _run_shipped("ioi_layer_sweep", tmp_path_factory)
    end = {layer: _preferred(out / f"layers={layer},pos=END" / "logit_diff.json")
           for layer in range(30)}
    s2 = {layer: _preferred(out / f"layers={layer},pos=S2" / "logit_diff.json")
          for layer in range(30)}
    # Measured on the 36 test rows: END 0.03 through block 22, 0.92 from block 23; S2 0.92
    # through block 16, then 0.03 from block 24.
    assert all(end[layer] <= 0.1 for layer in range(0, 20)), end
    assert all(end[layer] >= 0.8 for layer in range(24, 30)), end
    assert all(s2[layer] >= 0.8 for layer in range(0, 15)), s2
    assert all(s2[layer] <= 0.1 for layer in range(25, 30)), s2


@pytest.mark.slow
def test_das_at_the_flip_layer_moves_the_answer_further_than_a_random_subspace_of_its_rank(
        tmp_path_factory, smollm2_dir):
    out = _run_shipped("ioi_das", tmp_path_factory)
    for k in (1, 4, 16):
        fitted = _mean(out / f"k={k}" / "test_logit_diff.json")
        control = _mean(out / f"k={k}" / "control_logit_diff.json")
        # Measured at k = 4: -2.55 against -4.40 for the random subspace (held-out families).
        assert fitted >= control + (0.5 if k == 1 else 1.5), (k, fitted, control)
    assert _mean(out / "k=16" / "test_iia.json") > _mean(out / "k=16" / "control_iia.json")


def _token_positions(tokenizer, text: str, name: str, width: int) -> list[int]:
    """Absolute (left-padded to ``width``) indices of the tokens spelling ``name``."""
    ids = tokenizer(text)["input_ids"]
    spellings = {tokenizer(form, add_special_tokens=False)["input_ids"][0]
                 for form in (" " + name, name)}
    return [width - len(ids) + j for j, token in enumerate(ids) if token in spellings]


@pytest.mark.slow
def test_the_top_heads_attend_from_end_to_the_names_they_move(tmp_path_factory, smollm2_dir):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    out = _run_shipped("ioi_attention", tmp_path_factory)
    rows = json.loads((DATA / "ioi" / "data.json").read_text())
    tokenizer = load_tokenizer(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    batch = tokenizer([row["input"] for row in rows], return_tensors="pt", padding=True)
    with torch.no_grad():
        oracle = model(**batch, output_attentions=True).attentions
    width = batch["input_ids"].shape[1]

    def mass(layer: int, head: int) -> tuple[float, float]:
        saved = load_file(str(out / f"layers={layer}" / "attention.safetensors"))["weight"]
        pattern = saved.reshape(len(rows), 9, width)[:, head]
        # Same eager kernel on the same padded batch: equal to float32 rounding.
        assert torch.allclose(pattern, oracle[layer][:, head, -1], atol=1e-5)
        on = [sum(float(pattern[i, _token_positions(tokenizer, r["input"], r[name], width)].sum())
                  for i, r in enumerate(rows)) / len(rows) for name in ("io", "s")]
        return on[0], on[1]
    # Measured on the 36 test rows: 0.60 / 0.27, 0.54 / 0.35, 0.63 / 0.27; L23 H3 0.05 / 0.62.
    for layer, head in IO_HEADS:
        on_io, on_s = mass(layer, head)
        assert on_io > on_s + 0.1, (layer, head, on_io, on_s)
    on_io, on_s = mass(*S_HEAD)
    assert on_s > on_io + 0.3, (S_HEAD, on_io, on_s)
