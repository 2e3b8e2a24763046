"""Small realistic documents for the document-room tests; each call returns a fresh dict."""
from __future__ import annotations

MODEL = {"key": "causalab:tiny-llama", "revision": "0" * 64, "dtype": "fp32"}
ROLES = {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}}
TRAIN = "weekdays/data#train"
TEST = "weekdays/data#test"


def _sites() -> dict:
    return {"target": {"component": "block_output", "layers": [0]},
            "head": {"component": "lm_head"}}


def _interchange(featurizer: str = "identity") -> dict:
    return {
        "reads": {
            "v_cf": {"site": "target", "pos": -1, "input": "counterfactual",
                     "featurizer": featurizer},
            "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"},
        },
        "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap",
                             "operand": "v_cf", "featurizer": featurizer}},
        "models": {"patched": {"input": "base", "writes": ["patch"]}},
        "metrics": {
            "iia": {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer"},
            "ce": {"kind": "cross_entropy", "of": "logits", "target": "cf_answer"},
        },
    }


def patching() -> dict:
    """Swap the counterfactual's residual into the base run, score and save two tables."""
    return {
        "header": {"description": "smallest interchange"},
        "model": dict(MODEL),
        "roles": dict(ROLES),
        "sites": _sites(),
        "interventions": {"patch": _interchange()},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": TRAIN, "counterfactual": TRAIN},
                            "outputs": {"source": "v_cf"},
                            "saves": [{"value": "iia", "file_path": "iia.json"},
                                      {"value": "source", "file_path": "source.safetensors"}]}},
    }


def _fit(params: list, objective: list, metric: str, mode: str) -> dict:
    return {"kind": "fit", "interventions": "das",
            "rows": {"base": TRAIN, "counterfactual": TRAIN},
            "params": params, "objective": objective, "epochs": 3, "pairs": 2, "seed": 0,
            "optimizer": {"name": "adamw", "lr": 1e-3},
            "early_stop": {"metric": metric, "mode": mode, "patience": 2},
            "eval": {"rows": {"base": TEST, "counterfactual": TEST},
                     "saves": [{"value": "iia", "file_path": "heldout_iia.json"}]},
            "saves": [{"value": "train/loss", "file_path": "loss.safetensors"}]}


def das() -> dict:
    """Fit a Cayley subspace, score the train rows, export it through a weights step."""
    return {
        "model": dict(MODEL),
        "roles": dict(ROLES),
        "sites": _sites(),
        "featurizers": {"rot": {"kind": "subspace", "k": 8}},
        "interventions": {"das": _interchange("rot")},
        "steps": {
            "fit": _fit(["rot"], [[1.0, "ce"]], "iia", "max"),
            "score": {"kind": "observe", "interventions": "das",
                      "rows": {"base": TRAIN, "counterfactual": TRAIN},
                      "saves": [{"value": "iia", "file_path": "train_iia.json"}]},
            "export": {"kind": "weights", "names": ["rot"],
                       "saves": [{"value": "rot", "file_path": "rot.safetensors"}]},
        },
    }


def dbm() -> dict:
    """A gate fitted with cross-entropy plus a swept L1 weight on its mask; annealed."""
    doc = das()
    doc["featurizers"] = {"mask": {"kind": "gate"}}
    doc["interventions"] = {"das": _interchange("mask")}
    fit = _fit(["mask"], [[1.0, "ce"], [{"sweep": [0.0001, 0.002, 0.01, 0.05]}, "mask.mask"]],
               "ce", "min")
    fit["anneal"] = {"mask": {"start": 1.0, "end": 0.05}}
    doc["steps"] = {"fit": fit, "export": {"kind": "weights", "names": ["mask"],
                                           "saves": [{"value": "mask",
                                                      "file_path": "mask.safetensors"}]}}
    return doc


def decode_probe() -> dict:
    """Decode three tokens, read lm_head at a swept generated step, save the ids."""
    return {
        "model": dict(MODEL),
        "roles": {"base": {"field": "input"}},
        "sites": {"head": {"component": "lm_head"}},
        "interventions": {"probe": {
            "decode": 3,
            "reads": {"step": {"site": "head", "input": "base",
                               "pos": {"frame": "generated", "index": {"sweep": [0, 1, 2]}}}},
            "metrics": {"p": {"kind": "token_prob", "of": "step", "token": "base_answer"}},
        }},
        "steps": {"probe": {"kind": "observe", "interventions": "probe",
                            "rows": {"base": TRAIN},
                            "saves": [{"value": "p", "file_path": "p.json"},
                                      {"value": "original.generated",
                                       "file_path": "ids.safetensors"}]}},
    }


def point(doc: dict, index: int = 0) -> dict:
    """A swept example's ``index``-th point, lowered."""
    from causalab.document import lower

    return lower(doc)[index].document
