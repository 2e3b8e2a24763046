"""``model.control: random_init``: the same architecture, its weights re-initialised, seeded.

The control a reviewer asks for (DAS has been reported to reach high interchange accuracy on
randomly initialised models): every parameter differs from the checkpoint's, two loads agree
bit for bit, and the weights are transformers' own initialisation of the same config under
seed 0, built here without causalab.
"""
from __future__ import annotations

import dataclasses

import torch

import causalab.compile
from causalab.engine import weights as load


def test_random_init_is_the_seeded_initialisation_of_the_same_architecture(tiny, kit, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    resolved = tiny("weekday-llama")  # trained here (a tiny one is an initialisation itself)
    data_root = kit.write_table(tmp_path, "pairs", kit.pair_rows())
    document = kit.patching_document(resolved)
    document["model"]["control"] = "random_init"
    plan = causalab.compile.compile_document(document, data_root=data_root)
    assert plan.model.control == "random_init"
    trained = load.load_model(dataclasses.replace(plan.model, control=None))._model.state_dict()
    control = load.load_model(plan.model)._model.state_dict()
    assert set(control) == set(trained)
    assert all(not torch.equal(control[k], trained[k]) for k in trained if "norm" not in k)
    torch.manual_seed(0)
    expected = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolved.path))
    for key, value in expected.state_dict().items():
        assert torch.equal(control[key], value), key
    load._load.cache_clear()  # a second load builds it again: the same weights
    again = load.load_model(plan.model)._model.state_dict()
    assert all(torch.equal(again[k], control[k]) for k in control)
