"""Attribute steps in MLflow: the run carries its table, heatmap and grid; a parent holding an
exact sweep and an attribution run of the same heads gets the scatter of one against the other.

Runs the tiny Llama's head sweep (documents/v2/head_patching.json, swept over both layers) and
its attribution twin into a SQLite store in a temporary folder, both under one parent, as a
multirun nests them.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from causalab.pipeline import run_document
from causalab.tracking import TrackingEvents
from causalab.plots import attribution_maps as attribution_plots
from causalab.tracking import pictures
from causalab.tracking import runs as store

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")


def attribution_twin(exact: dict) -> dict:
    """The head sweep's interchange, every head of its layer scored by one attribute step."""
    document = copy.deepcopy(exact)
    document["sites"]["head_out"].pop("heads")
    document["sites"]["head_out"]["layers"] = [0]
    document["steps"] = {"attribute": {
        "kind": "attribute", "interventions": "patch", "rows": exact["steps"]["patch"]["rows"],
        "layers": "all", "unit": "head", "metrics": ["logit_diff"], "verify": 1,
        "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}}
    return document


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    root = tmp_path_factory.mktemp("attribution-tracking")
    uri = store.resolve_uri(str(root / "store"))
    mlflow = store.client(uri)
    experiment = store.experiment_id(mlflow, "attribution", uri)
    parent = store.create_run(mlflow, experiment, "multirun", {store.KIND: "multirun"})
    exact = json.loads((REPO / "documents" / "v2" / "head_patching.json").read_text())
    exact["sites"]["head_out"]["layers"] = [{"sweep": [0, 1]}]
    for name, document in (("exact", exact), ("attribution", attribution_twin(exact))):
        out = root / name
        with TrackingEvents(tracking_uri=uri, experiment="attribution", out=str(out),
                            parent_run_id=parent, run_name=name) as events:
            run_document(document, out=str(out), data_root=DATA, events=events)
    pictures.log_comparison(mlflow, parent, experiment, title="heads")
    return mlflow, experiment, parent


def _artifacts(mlflow, run_id: str, folder: str = "") -> set[str]:
    found = set()
    for entry in mlflow.list_artifacts(run_id, folder or None):
        found |= _artifacts(mlflow, run_id, entry.path) if entry.is_dir else {entry.path}
    return found


def test_an_attribution_run_carries_its_table_its_head_heatmap_and_its_grid(tracked):
    mlflow, experiment, parent = tracked
    runs = [r for r in store.descendants(mlflow, experiment, parent)
            if pictures.TAG in r.data.tags]
    assert len(runs) == 1
    files = _artifacts(mlflow, runs[0].info.run_id)
    assert {"logit_diff.json", "plots/head_heatmap.png", "attribution/attribute.json",
            "attribute.verify.json", "plots/attribute_verify.png"} <= files
    assert json.loads(runs[0].data.tags[pictures.TAG]) == ["attribute"]


def test_a_verified_attribution_run_logs_its_bound_as_a_metric(tracked, tmp_path):
    mlflow, experiment, parent = tracked
    run = next(r for r in store.descendants(mlflow, experiment, parent)
               if pictures.TAG in r.data.tags)
    local = mlflow.download_artifacts(run.info.run_id, "attribute.verify.json", str(tmp_path))
    report = json.loads(Path(local).read_text())["logit_diff"]
    assert run.data.metrics["attribute/logit_diff/verify_bound"] == pytest.approx(
        report["bound"]["largest_exact_bound"])


def test_the_parent_plots_attribution_against_the_exact_sweep_of_the_same_heads(tracked):
    mlflow, experiment, parent = tracked
    assert pictures.COMPARISON in _artifacts(mlflow, parent)
    sweep = [r for r in store.children(mlflow, experiment, parent)
             if pictures.TAG not in r.data.tags]
    assert "plots/head_heatmap.png" in _artifacts(mlflow, sweep[0].info.run_id)


def test_units_pair_by_their_coordinates_as_the_exact_points_label_them():
    exact = [({"heads": [h], "layers": 1}, {"logit_diff/patch": float(h), "iia/patch": 0.5,
                                            "n/logit_diff/patch": 4.0})
             for h in range(3)]
    grid = {"logit_diff": [({"layers": 1, "heads": h}, 10.0 - h) for h in range(4)]}
    assert attribution_plots.pairs(exact, grid) == {"logit_diff": [(0.0, 10.0), (1.0, 9.0),
                                                                    (2.0, 8.0)]}
    assert attribution_plots.spearman([0.0, 1.0, 2.0], [10.0, 9.0, 8.0]) == pytest.approx(-1.0)


def test_an_edge_step_run_carries_its_tables_its_faithfulness_plot_and_area(tmp_path):
    exact = json.loads((REPO / "documents" / "v2" / "head_patching.json").read_text())
    document = copy.deepcopy(exact)
    document["sites"]["head_out"].pop("heads")  # one point: the edge step has no sweep
    document["steps"] = {"circuit": {
        "kind": "attribute", "interventions": "patch", "rows": exact["steps"]["patch"]["rows"],
        "metrics": ["logit_diff"], "edges": True, "circuit_k": [3, 10]}}
    uri = store.resolve_uri(str(tmp_path / "store"))
    out = tmp_path / "out"
    with TrackingEvents(tracking_uri=uri, experiment="edges", out=str(out),
                        run_name="edges") as events:
        run_document(document, out=str(out), data_root=DATA, events=events)
    mlflow = store.client(uri)
    run = mlflow.search_runs([store.experiment_id(mlflow, "edges", uri)])[0]
    files = _artifacts(mlflow, run.info.run_id)
    assert {"circuit.edges.json", "circuit.nodes.json", "circuit.faithfulness.json",
            "plots/circuit_faithfulness.png"} <= files
    curve = json.loads((out / "circuit.faithfulness.json").read_text())
    assert run.data.metrics["circuit/logit_diff/faithfulness_area"] == pytest.approx(
        curve["area"])
    # MIB's scores beside it; the random tiny Llama's gap (about 0.002 logit) is below the
    # floor, so the run says so.
    assert run.data.metrics["circuit/logit_diff/cpr"] == pytest.approx(curve["mib"]["cpr"])
    assert run.data.metrics["circuit/logit_diff/cmd"] == pytest.approx(curve["mib"]["cmd"])
    assert curve["floor"]["below"]
    assert json.loads(run.data.tags["causalab.below_floor"]) == ["circuit/logit_diff"]


def test_a_tolerances_record_is_logged_under_safe_metric_keys():
    from causalab.plots import verification
    from causalab.document.names import mlflow_key

    bound = {"largest_exact_bound": 0.01, "tolerance": 0.05, "verified": 6, "rounds": 3,
             "stopped": "bound", "unverified": 2}
    found = verification.numbers({"attribute": {"logit_diff": {"bound": bound}}})
    assert found == {"attribute/logit_diff/verify_bound": 0.01,
                     "attribute/logit_diff/verify_tolerance": 0.05,
                     "attribute/logit_diff/verify_units": 6,
                     "attribute/logit_diff/verify_rounds": 3}
    assert all(mlflow_key(key) == key for key in found)
