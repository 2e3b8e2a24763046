"""A featurizer loaded from an earlier step (``file_path: "steps:<step>/<value>"``): what the
rule between the two nodes accepts and where it refuses, by JSON path."""
from __future__ import annotations

import pytest

from causalab.document import validate
from causalab.errors import DocumentError
from document_examples import TRAIN, das, patching

AT = ("featurizers", "basis", "file_path")


def harvest_then_apply(file_path: str = "steps:harvest/basis", k: int = 4) -> dict:
    """Harvest a rank-4 PCA basis at the site, then patch through it in the same document."""
    doc = patching()
    interchange = doc["interventions"]["patch"]
    for node in (interchange["reads"]["v_cf"], interchange["writes"]["patch"]):
        node["featurizer"] = "basis"
    doc["featurizers"] = {"basis": {"kind": "pca", "k": k, "file_path": file_path}}
    doc["interventions"]["harvest"] = {
        "reads": {"acts": {"site": "target", "pos": {"all": True}, "input": "base"}}}
    doc["steps"] = {"harvest": {"kind": "observe", "interventions": "harvest",
                                "rows": {"base": TRAIN},
                                "outputs": {"basis_out": {"read": "acts", "reduce": "pca", "k": 4},
                                            "dictionary": {"read": "acts", "reduce": "sae",
                                                           "k": 32},
                                            "mean": {"read": "acts", "reduce": "mean"}}},
                    **doc["steps"]}
    doc["steps"]["patch"].pop("outputs")
    doc["steps"]["patch"]["saves"] = [{"value": "iia", "file_path": "iia.json"}]
    return doc


def test_a_pca_basis_a_dictionary_and_a_fitted_rotation_load_from_earlier_steps():
    validate(harvest_then_apply("steps:harvest/basis_out"))
    doc = harvest_then_apply("steps:harvest/basis_out")
    doc["featurizers"]["basis"] = {"kind": "sae", "file_path": "steps:harvest/dictionary"}
    validate(doc)
    fitted = das()
    fitted["featurizers"]["applied"] = {"kind": "subspace", "k": 8, "file_path": "steps:export/rot"}
    fitted["interventions"]["apply"] = _through(fitted["interventions"]["das"], "applied")
    fitted["steps"]["apply"] = {"kind": "observe", "interventions": "apply",
                                "rows": {"base": TRAIN, "counterfactual": TRAIN}}
    validate(fitted)


def _through(body: dict, featurizer: str) -> dict:
    import copy

    body = copy.deepcopy(body)
    body["reads"]["v_cf"]["featurizer"] = featurizer
    body["writes"]["patch"]["featurizer"] = featurizer
    return body


@pytest.mark.parametrize("file_path, k, why", [
    ("steps:nowhere/basis_out", 4, "no step"),
    ("steps:harvest/absent", 4, "publishes no"),
    ("steps:harvest/mean", 4, "publishes no"),
    ("steps:harvest/dictionary", 4, "is a sae"),
    ("steps:harvest/basis_out", 2, "k: "),
], ids=["unknown_step", "unknown_value", "a_mean_is_no_featurizer", "kind_differs",
        "rank_differs"])
def test_a_step_source_that_names_nothing_loadable_is_refused_at_the_file_path(file_path, k, why):
    with pytest.raises(DocumentError) as refused:
        validate(harvest_then_apply(file_path, k))
    assert refused.value.path == AT
    assert why in refused.value.message


def test_a_step_that_uses_the_featurizer_before_its_source_step_has_run_is_refused_at_it():
    doc = harvest_then_apply("steps:harvest/basis_out")
    doc["steps"] = {"patch": doc["steps"]["patch"], "harvest": doc["steps"]["harvest"]}
    with pytest.raises(DocumentError) as refused:
        validate(doc)
    assert refused.value.path == ("steps", "patch")


def test_a_basis_read_at_another_site_is_refused_at_the_file_path():
    doc = harvest_then_apply("steps:harvest/basis_out")
    doc["sites"]["other"] = {"component": "block_output", "layers": [1]}
    doc["interventions"]["harvest"]["reads"]["acts"]["site"] = "other"
    with pytest.raises(DocumentError) as refused:
        validate(doc)
    assert refused.value.path == AT and "site" in refused.value.message
