"""Engine-walk fixtures: built-in tiny models, a small pair table, documents and a hook oracle.

The oracle is a plain transformers model with torch hooks, loaded independently of nnterp,
fed the same left-padded ids with position ids taken from the mask.
"""
from __future__ import annotations

import copy
import json
import os
from types import SimpleNamespace

import pytest
import torch

FAMILIES = ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2"]
# Where the engine's models land in these tests: CAUSALAB_TEST_DEVICE=cuda runs them on the
# accelerator (scripts/bench/device.sh), while the hook oracles stay on the CPU.
DEVICE = os.environ.get("CAUSALAB_TEST_DEVICE", "cpu")

# Prompts of different token lengths, so a batch pads some rows and not others.
PAIRS = [
    ("If today is Monday, tomorrow is", "If today is Friday, tomorrow is", " Tuesday", " Saturday"),
    ("Today is Sunday, so tomorrow is", "If today is Wednesday, tomorrow is", " Monday", " Thursday"),
    ("If today is Tuesday, then the day after today is", "Today is Saturday, tomorrow is",
     " Wednesday", " Sunday"),
]


def pair_rows(pairs=PAIRS, cf_answers=None) -> list[dict]:
    rows = []
    for i, (base, cf, base_answer, cf_answer) in enumerate(pairs):
        rows.append({"input": base, "counterfactual_inputs": [cf], "base_answer": base_answer,
                     "cf_answer": cf_answer if cf_answers is None else cf_answers[i],
                     "example_id": f"pair-{i}"})
    return rows


@pytest.fixture(autouse=True)
def _test_device(monkeypatch):
    """With CAUSALAB_TEST_DEVICE set, a model loaded for the CPU (every test's default) is
    loaded on that device instead; tables and tensors compared with the oracles come back to
    the CPU as JSON numbers or through ``.cpu()`` where a test reads them."""
    if DEVICE == "cpu":
        return
    from causalab.engine import weights as load

    original = load.load_model
    monkeypatch.setattr(load, "load_model", lambda ref, device_map="cpu": original(
        ref, device_map=DEVICE if device_map == "cpu" else device_map))


@pytest.fixture
def no_receipt(monkeypatch):
    """A run without its fidelity receipt (the schedule lists none either): for tests that
    count a run's traces, windows or forwards, which the receipt's one trace would shift."""
    from causalab.engine import fidelity

    monkeypatch.setattr(fidelity, "receipt_pass", lambda plan, config: None)


@pytest.fixture(scope="session")
def tiny():
    """``tiny("tiny-llama")`` -> the resolved built-in (materialised once per session)."""
    from causalab.models import resolve

    found = {}

    def _get(name: str):
        if name not in found:
            found[name] = resolve("causalab:" + name)
        return found[name]
    return _get


def write_table(root, name: str, rows: list[dict]) -> str:
    """Write ``rows`` as ``<root>/<name>.json`` and return the data root."""
    path = root / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))
    return str(root)


def patching_document(resolved, *, component="block_output", layer=0, pos=-1,
                      table="pairs", extra_reads=None) -> dict:
    """Swap the counterfactual's value at ``component[layer]`` into the base run; score it."""
    sites = {"target": {"component": component, "layers": [layer]}, "head": {"component": "lm_head"}}
    reads = {"v_cf": {"site": "target", "pos": pos, "input": "counterfactual"},
             "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}}
    reads.update(extra_reads or {})
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": sites,
        "interventions": {"patch": {
            "reads": reads,
            "writes": {"patch": {"site": "target", "pos": pos, "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"iia": {"kind": "match", "of": "logits", "expected": "cf_answer"},
                        "logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"}},
        }},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": table, "counterfactual": table},
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"},
                                      {"value": "iia", "file_path": "iia.json"}]}},
    }


def with_rows(document: dict, table: str) -> dict:
    changed = copy.deepcopy(document)
    for step in changed["steps"].values():
        step["rows"] = {role: table for role in step["rows"]}
    return changed


@pytest.fixture(scope="session")
def oracle():
    """``oracle(path)`` -> (plain transformers model, tokenizer), loaded without nnterp."""
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    loaded = {}

    def _get(path: str):
        if path not in loaded:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            loaded[path] = (model, load_tokenizer(path))
        return loaded[path]
    return _get


def encode(tokenizer, prompts: list[str]) -> dict:
    """Left-padded ids, mask and position ids from the mask, as the engine feeds them."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return {"input_ids": enc["input_ids"], "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def patched_forward(model, tokenizer, rows: list[dict], layer: int = 0) -> tuple:
    """The hook oracle: block ``layer``'s output at the last column captured from the
    counterfactual's own forward by one torch hook and swapped into the base forward by
    another. Returns the logits ``(rows, columns, vocab)``, the head over every column, and
    the block's patched output ``(rows, columns, d)``."""
    base = encode(tokenizer, [r["input"] for r in rows])
    cf = encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])
    blocks = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    store = {}

    def grab(module, args, output):
        store["v"] = (output[0] if isinstance(output, tuple) else output)[:, -1].clone()

    def put(module, args, output):
        tensor = (output[0] if isinstance(output, tuple) else output).clone()
        tensor[:, -1] = store["v"]
        store["out"] = tensor
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor
    with torch.no_grad():
        for hook, enc in ((grab, cf), (put, base)):
            handle = blocks[layer].register_forward_hook(hook)
            try:
                logits = model(**enc).logits
            finally:
                handle.remove()
    return logits, store["out"]


def run_compiled(document: dict, data_root: str, out, *, batch_size=None):
    """Compile and walk ``document``; returns the plan, its results filled."""
    import causalab.compile
    from causalab.engine.weights import load_model
    from causalab.engine.walk import run_plan

    plan = causalab.compile.compile_document(document, data_root=data_root)
    model = load_model(plan.model)
    run_plan(plan, model, out=str(out), batch_size=batch_size)
    return plan


def unplaceable_write(resolved, root) -> tuple[dict, str]:
    """(document, data root) whose zeroing write is anchored at each row's ``entity``, and
    the third row's entity is in no prompt: the write has an empty window there (R1)."""
    rows = pair_rows()
    for row, entity in zip(rows, ["Monday", "Sunday", "Caturday"]):
        row["entity"] = entity
    data_root = write_table(root, "pairs", rows)
    document = patching_document(resolved)
    patch = document["interventions"]["patch"]
    patch["writes"]["patch"]["pos"] = {"index": -1, "scope": {"variable": "entity"}}
    patch["writes"]["patch"]["operand"] = 0.0
    return document, data_root


def step(plan, name: str):
    return next(node for node in plan.children if getattr(node, "name", None) == name)


@pytest.fixture(scope="session")
def kit():
    """The helpers above, for test modules (conftest is not importable under importlib mode)."""
    return SimpleNamespace(pair_rows=pair_rows, write_table=write_table, encode=encode,
                           patched_forward=patched_forward,
                           patching_document=patching_document, with_rows=with_rows,
                           run_compiled=run_compiled, step=step, PAIRS=PAIRS, FAMILIES=FAMILIES,
                           unplaceable_write=unplaceable_write)
