"""Compile-room fixtures: the four built-in tiny checkpoints' configs and tokenizers, tiny tables.

Configs and tokenizers only; no test here loads a weight.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

FAMILIES = ("llama", "gpt2", "gemma2", "qwen2")


@dataclass
class Point:
    """A lowered point as the document room hands it over: label, coordinates, document."""

    document: dict
    label: str = ""
    coordinates: dict = field(default_factory=dict)


@pytest.fixture(scope="session")
def builtin():
    """family -> (ModelRef, config, tokenizer) of ``causalab:tiny-<family>``."""
    from causalab.compile.plan import ModelRef
    from causalab.models import load_config, load_tokenizer, resolve

    out = {}
    for family in FAMILIES:
        found = resolve(f"causalab:tiny-{family}")
        ref = ModelRef(key=f"causalab:tiny-{family}", revision=found.revision, dtype="fp32",
                       attn_implementation=None, path=found.path)
        out[family] = (ref, load_config(found.path), load_tokenizer(found.path))
    return out


ROWS = [
    {"input": "If today is Thursday, tomorrow is",
     "counterfactual_inputs": ["If today is Saturday, tomorrow is"],
     "counterfactual_inputs_variables": [{"entity": "Saturday"}],
     "entity": "Thursday", "base_answer": " Friday", "cf_answer": " Sunday",
     "split": "train", "example_id": "Thu-Sat"},
    {"input": "If today is Friday, tomorrow is",
     "counterfactual_inputs": ["If today is Sunday, tomorrow is"],
     "counterfactual_inputs_variables": [{"entity": "Sunday"}],
     "entity": "Friday", "base_answer": " Saturday", "cf_answer": " Monday",
     "split": "train", "example_id": "Fri-Sun"},
    {"input": "If today is Monday, tomorrow is",
     "counterfactual_inputs": ["If today is Tuesday, tomorrow is"],
     "counterfactual_inputs_variables": [{"entity": "Tuesday"}],
     "entity": "Monday", "base_answer": " Tuesday", "cf_answer": " Wednesday",
     "split": "test", "example_id": "Mon-Tue"},
]


@pytest.fixture
def data_root(tmp_path):
    """A data root holding ``days.json`` (2 train, 1 test rows)."""
    (tmp_path / "days.json").write_text(json.dumps(ROWS))
    return tmp_path


@pytest.fixture
def patching(builtin):
    """A fresh copy of the smallest interchange (documents/v2/patching.json) on ``days``."""
    return _patching(builtin["llama"][0])


def _patching(family_ref) -> dict:
    return {
        "model": {"key": family_ref.key, "revision": family_ref.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"},
                  "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": [0]},
                  "head": {"component": "lm_head"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": -1, "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap",
                                 "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"iia": {"kind": "match", "of": "logits", "expected": "cf_answer"},
                        "logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"}}}},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": "days#train", "counterfactual": "days#train"},
                            "saves": [{"value": "iia", "file_path": "iia.json"}]}},
    }


@pytest.fixture
def compile_doc(builtin, data_root):
    """Compile a document dict (one point) against ``causalab:tiny-<family>``."""
    from causalab.compile import compile_point

    def run(document: dict, family: str = "llama", label: str = ""):
        ref, config, tokenizer = builtin[family]
        attn = document["model"].get("attn_implementation")
        ref = type(ref)(**{**ref.__dict__, "attn_implementation": attn})
        return compile_point(Point(document, label), None, model=ref, config=config,
                             tokenizer=tokenizer, data_root=str(data_root))
    return run
