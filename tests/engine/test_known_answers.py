"""Known answers: the science the trained ``causalab:weekday-llama`` shows through documents/known/.

Each document runs once per module through ``causalab.pipeline.run_document`` into a temporary
folder; the tests read the metric tables it wrote. Thresholds are the science, not tuning
knobs: a model that misses one is not good enough for the known-answer suite. Two numbers are
also checked against a plain transformers forward with hooks written here (behaviour and one
interchange), so a right-looking curve cannot come from a wrong pipeline.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KNOWN = REPO / "documents" / "known"
DATA = REPO / "documents" / "data"
ROWS = json.loads((DATA / "weekdays_full" / "data.json").read_text())
TEST_IDS = [row["example_id"] for row in ROWS if row["split"] == "test"]
DAY, LAST, BEFORE_DAY = -4, -1, -5


def _document(name: str) -> dict:
    from causalab.document import load_json

    return load_json((KNOWN / f"{name}.json").read_text())


def _run(name: str, tmp_path_factory) -> Path:
    from causalab.pipeline import run_document

    out = tmp_path_factory.mktemp(name)
    run_document(_document(name), out=str(out), data_root=str(DATA))
    return out


def _values(path: Path) -> dict[str, float]:
    """example_id -> value of the eligible rows of one metric table."""
    return {row["example_id"]: row["value"] for row in json.loads(path.read_text())
            if row["eligible"]}


def _mean(path: Path, ids: list[str] | None = None) -> float:
    values = _values(path)
    picked = [values[i] for i in ids] if ids is not None else list(values.values())
    return sum(picked) / len(picked)


def _num_layers() -> int:
    from causalab.models import load_config, resolve

    model = _document("layer_sweep")["model"]
    return load_config(resolve(model["key"], model["revision"]).path).num_hidden_layers


@pytest.fixture(scope="module")
def behavior(tmp_path_factory) -> Path:
    return _run("behavior", tmp_path_factory)


@pytest.fixture(scope="module")
def layer_sweep(tmp_path_factory) -> Path:
    return _run("layer_sweep", tmp_path_factory)


@pytest.fixture(scope="module")
def das(tmp_path_factory) -> Path:
    return _run("das", tmp_path_factory)


@pytest.fixture(scope="module")
def dbm(tmp_path_factory) -> Path:
    return _run("dbm", tmp_path_factory)


@pytest.fixture(scope="module")
def logit_lens(tmp_path_factory) -> Path:
    return _run("logit_lens", tmp_path_factory)


@pytest.fixture(scope="module")
def oracle():
    """The checkpoint the documents pin, as a plain transformers model and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer, resolve

    model = _document("behavior")["model"]
    path = resolve(model["key"], model["revision"]).path
    network = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return network.requires_grad_(False), load_tokenizer(path)


def _last_logits(oracle, texts: list[str], hook=None):
    """Last-position logits (rows, vocab); ``hook`` = (layer, fn(hidden) -> hidden) rewrites the
    residual stream entering that block (its first positional argument)."""
    import torch

    network, tokenizer = oracle
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    handle = None
    if hook is not None:
        layer, edit = hook

        def rewrite(module, args):
            return (edit(args[0]),) + args[1:]
        handle = network.model.layers[layer].register_forward_pre_hook(rewrite)
    try:
        with torch.no_grad():
            return network(**batch).logits[:, -1]
    finally:
        if handle is not None:
            handle.remove()


def _token(oracle, text: str) -> int:
    (only,) = oracle[1](text, add_special_tokens=False)["input_ids"]
    return only


def test_every_known_document_pins_the_trained_weekday_llama_at_its_revision():
    from causalab.models import resolve

    names = sorted(path.stem for path in KNOWN.glob("*.json"))
    assert names == ["behavior", "das", "dbm", "layer_sweep", "logit_lens"]
    for name in names:
        model = _document(name)["model"]
        assert model["key"] == "causalab:weekday-llama", name
        assert model["revision"] == resolve(model["key"]).revision, name


def test_the_weekday_llama_answers_at_least_95_percent_of_the_held_out_pairs(behavior):
    assert _mean(behavior / "top1.json", TEST_IDS) >= 0.95
    assert _mean(behavior / "top1.json") >= 0.95


def test_the_behaviour_tables_agree_with_a_plain_forward(behavior, oracle):
    logits = _last_logits(oracle, [row["input"] for row in ROWS])
    probs = logits.softmax(-1)
    p_answer, top1 = _values(behavior / "p_answer.json"), _values(behavior / "top1.json")
    for i, row in enumerate(ROWS):
        answer = _token(oracle, row["base_answer"])
        assert p_answer[row["example_id"]] == pytest.approx(probs[i, answer].item(), abs=1e-5)
        assert top1[row["example_id"]] == float(logits[i].argmax().item() == answer)


def _sweep_iia(layer_sweep: Path, pos: int) -> list[float]:
    """IIA of the stream entering each block (block_input[L]) at one position, L = 0.."""
    return [_mean(layer_sweep / f"layers={layer},pos={pos}" / "iia.json")
            for layer in range(_num_layers())]


def test_patching_the_token_before_the_day_never_moves_the_answer(layer_sweep):
    iia = _sweep_iia(layer_sweep, BEFORE_DAY)
    assert all(value <= 0.1 for value in iia), f"before the day, entering blocks 0..: {iia}"


def test_the_day_token_carries_the_day_into_block_0_and_not_after_it(layer_sweep):
    # Block 0's attention copies the day to the last token; from then on the day token's own
    # stream no longer reaches the answer.
    entering_0, *later = _sweep_iia(layer_sweep, DAY)
    assert entering_0 >= 0.9, f"day token entering block 0: IIA {entering_0:.3f}"
    assert all(value <= 0.1 for value in later), f"day token entering blocks 1..: {later}"


def test_the_last_token_carries_the_day_from_the_stream_leaving_block_0_onward(layer_sweep):
    entering_0, *later = _sweep_iia(layer_sweep, LAST)
    assert entering_0 <= 0.1, f"last token entering block 0: IIA {entering_0:.3f}"
    assert all(value >= 0.9 for value in later), f"last token entering blocks 1..: {later}"


@pytest.mark.parametrize("where", ["day token into block 0", "last token into the last block"])
def test_one_layer_sweep_point_agrees_with_a_plain_interchange(layer_sweep, oracle, where):
    layer, pos = (0, DAY) if where.startswith("day") else (_num_layers() - 1, LAST)
    counterfactual = [row["counterfactual_inputs"][0] for row in ROWS]
    captured = {}

    def keep(hidden):
        captured["source"] = hidden[:, pos].clone()
        return hidden

    def swap(hidden):
        hidden = hidden.clone()
        hidden[:, pos] = captured["source"]
        return hidden
    _last_logits(oracle, counterfactual, (layer, keep))
    logits = _last_logits(oracle, [row["input"] for row in ROWS], (layer, swap))
    table = _values(layer_sweep / f"layers={layer},pos={pos}" / "logit_diff.json")
    for i, row in enumerate(ROWS):
        expected = (logits[i, _token(oracle, row["cf_answer"])]
                    - logits[i, _token(oracle, row["base_answer"])]).item()
        assert table[row["example_id"]] == pytest.approx(expected, abs=1e-4)


def test_das_moves_the_held_out_day_far_above_a_random_subspace_of_the_same_rank(das):
    ranks = _document("das")["featurizers"]["rot"]["k"]["sweep"]
    held_out = {k: _mean(das / f"k={k}" / "test_iia.json") for k in ranks}
    control = {k: _mean(das / f"k={k}" / "control_iia.json") for k in ranks}
    best = max(ranks, key=lambda k: (held_out[k], -k))
    summary = ", ".join(f"k={k}: {held_out[k]:.3f} vs control {control[k]:.3f}" for k in ranks)
    assert held_out[best] >= 0.9, summary
    assert held_out[best] - control[best] >= 0.5, summary


def test_the_fitted_rotation_is_saved_as_a_stamped_bundle_of_its_rank(das):
    from safetensors import safe_open

    site = _document("das")["sites"]["target"]
    for k in _document("das")["featurizers"]["rot"]["k"]["sweep"]:
        with safe_open(str(das / f"k={k}" / "rot.safetensors"), "pt") as bundle:
            stamp = bundle.metadata()
            assert tuple(bundle.get_tensor("weight").shape) == (int(stamp["d"]), k)
        assert (stamp["kind"], stamp["k"], stamp["site"]) == ("subspace", str(k), "target")
        assert (stamp["component"], stamp["layer"]) == (site["component"], str(site["layers"][0]))


def test_a_heavier_mask_penalty_keeps_no_more_units(dbm):
    from safetensors.torch import load_file

    weights = _document("dbm")["steps"]["fit"]["objective"][1][0]["sweep"]
    kept = [int((load_file(str(dbm / f"objective={w}" / "mask.safetensors"))["weight"] > 0).sum())
            for w in weights]
    assert kept == sorted(kept, reverse=True), dict(zip(weights, kept))
    assert kept[-1] < kept[0], dict(zip(weights, kept))


def test_the_logit_lens_at_the_last_layer_reads_the_model_s_own_answer(logit_lens, behavior):
    last = logit_lens / f"layers={_num_layers() - 1}"
    lens, own = _values(last / "p_answer.json"), _values(behavior / "p_answer.json")
    assert lens.keys() == own.keys()
    for example_id, value in own.items():
        assert lens[example_id] == pytest.approx(value, abs=1e-5)
    assert _mean(last / "top1.json") >= 0.95


@pytest.mark.parametrize("name", ["behavior", "layer_sweep", "das", "dbm", "logit_lens"])
def test_each_known_document_is_what_its_hydra_experiment_renders_on_model_llama(name):
    from causalab.document import digest
    from causalab.hydra.rendering import render

    experiment = "das" if name == "das" else f"known_{name}"
    rendered = render([f"experiment={experiment}", "model=llama"])
    assert digest(rendered) == digest(_document(name))
