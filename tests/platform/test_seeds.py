"""A fit's ``seed`` is a coordinate like any other; a sweep over it is summarised on the parent.

The tiny Llama's DAS document, its fit's seed swept over three values (one epoch each): three
points, and a parent whose ``seeds.json`` and ``<score>.seeds.*`` metrics are the mean, the
standard deviation and the percentile-bootstrap interval of the three points' stored scores
over every one of the 27 resamples, computed here with numpy.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy
import pytest
from mlflow import MlflowClient

import causalab

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")


@pytest.mark.slow  # three fits and a tracked store: ~20 s of CPU, over a minute on a busy machine
def test_a_sweep_over_a_fits_seed_is_summarised_across_seeds(tmp_path):
    document = json.loads((REPO / "documents" / "v2" / "das.json").read_text(encoding="utf-8"))
    document["steps"]["fit"].update(seed={"sweep": [0, 1, 2]}, epochs=1)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = causalab.run(document, track=True, tracking_uri=uri, experiment="seeds",
                          data_root=DATA)
    assert sorted(result.runs) == ["seed=0", "seed=1", "seed=2"]
    client = MlflowClient(uri)
    runs = {label: client.get_run(run_id) for label, run_id in result.runs.items()}
    parent_id = next(iter(runs.values())).data.tags["mlflow.parentRunId"]
    summary = json.loads(Path(client.download_artifacts(parent_id, "seeds.json", str(tmp_path)))
                         .read_text(encoding="utf-8"))
    (group,) = summary
    key = group["score"]
    scores = numpy.array([runs[f"seed={s}"].data.metrics[key] for s in group["seeds"]])
    assert sorted(group["seeds"]) == ["0", "1", "2"]
    assert group["mean"] == pytest.approx(scores.mean(), abs=1e-12)
    assert group["sd"] == pytest.approx(scores.std(ddof=1), abs=1e-12)
    # 27 equally likely resamples: the 2.5 % tails are the least and the greatest mean (each
    # 1/27 of them), to the 0.001 grid the means are convolved on (format.md §7.10).
    means = [scores[list(index)].mean() for index in itertools.product(range(3), repeat=3)]
    assert [group["lo"], group["hi"]] == pytest.approx([min(means), max(means)], abs=5e-4)
    parent = client.get_run(parent_id).data.metrics
    for part in ("mean", "sd", "lo", "hi"):
        assert parent[f"{key}.seeds.{part}"] == pytest.approx(group[part], abs=1e-9)
