"""Every score carries its 95 % bootstrap interval: printed, in MLflow beside the score, in a
Result, on a sweep's parent and in its summary.html.

The interval is checked against a percentile bootstrap written here, one resample at a time
(``numpy.random.default_rng(0)``, 1000 resamples of the rows, the 2.5th and 97.5th
percentiles of their means), over the values of the saved metric table: the same seed and
resamples as docs/format.md §7.10 documents, computed without the code under test.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
from mlflow import MlflowClient

import causalab
from causalab import uncertainty
from causalab.progress import Summary

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
HEADS = str(REPO / "documents" / "v2" / "head_patching.json")


def bootstrap(values, seed=0, resamples=1000) -> tuple[float, float]:
    """The percentile bootstrap of the mean, one resample at a time."""
    values = numpy.asarray(values, dtype=numpy.float64)
    rng = numpy.random.default_rng(seed)
    means = [values[rng.integers(0, len(values), size=len(values))].mean()
             for _ in range(resamples)]
    low, high = numpy.percentile(means, [2.5, 97.5])
    return float(low), float(high)


@pytest.mark.parametrize("rows", [1, 12, 300])
def test_the_interval_is_the_seeded_percentile_bootstrap(rows, monkeypatch):
    values = numpy.random.default_rng(rows).normal(size=rows)
    assert uncertainty.interval(values) == pytest.approx(bootstrap(values), abs=1e-12)
    monkeypatch.setattr(uncertainty, "_CHUNK", 7 * rows)  # resamples drawn a few at a time
    assert uncertainty.interval(values) == pytest.approx(bootstrap(values), abs=1e-12)
    assert uncertainty.interval([]) is None


def test_the_printed_line_shows_the_interval_between_the_mean_and_the_row_count():
    summary, point = Summary(), SimpleNamespace(name="k=4")
    values = [1.0] * 8 + [0.0] * 4
    summary.metric(point, "test", "iia", float(numpy.mean(values)), len(values))
    summary.interval(point, "test", "iia", *uncertainty.interval(values))
    summary.metric(point, "test", "ce", None, 0)  # no row scored: no interval either
    low, high = bootstrap(values)
    assert summary.render() == f"k=4  test: iia=0.667 [{low:.2f}, {high:.2f}] (12) ce=-- (0)"


def test_paired_probabilities_call_identical_points_tied_and_a_clear_winner_not():
    rows = [f"r{i}" for i in range(12)]
    same = {"a": dict.fromkeys(rows, 1.0), "b": dict.fromkeys(rows, 1.0),
            "c": {r: float(i % 2) for i, r in enumerate(rows)}}
    probability = uncertainty.beats(same)
    assert probability["a"]["b"] == probability["b"]["a"] == 0.0
    assert probability["a"]["c"] == 1.0  # 1.0 everywhere beats a coin on every resample
    assert uncertainty.tied_first(["a", "b", "c"], probability) == ["a", "b"]
    # The paired probability written here: the same resampled rows for both points.
    rng = numpy.random.default_rng(0)
    c = numpy.array([same["c"][r] for r in sorted(rows)])
    wins = [c[i].mean() < 1.0 for i in (rng.integers(0, 12, size=12) for _ in range(1000))]
    assert probability["a"]["c"] == pytest.approx(numpy.mean(wins))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    result = causalab.run(HEADS, track=True, tracking_uri=uri, experiment="intervals",
                          data_root=DATA)
    return result, MlflowClient(uri)


def test_each_point_logs_its_scores_interval_beside_the_score(swept):
    result, client = swept
    assert sorted(result.runs) == ["heads=0", "heads=1", "heads=2", "heads=3"]
    for point, run_id in result.runs.items():
        directory = next(d for d, c in result.coordinates.items() if f"heads={c['heads'][0]}"
                         == point)
        metrics = client.get_run(run_id).data.metrics
        for name in ("iia", "logit_diff"):
            table = result.tables[f"{directory}/{name}.json"]
            expected = bootstrap(table[table["eligible"]]["value"].tolist())
            stored = (metrics[f"{name}/patch.lo"], metrics[f"{name}/patch.hi"])
            # Stored as doubles; the table's values went through JSON's shortest repr.
            assert stored == pytest.approx(expected, abs=1e-9), (point, name)
            assert stored[0] <= metrics[f"{name}/patch"] <= stored[1]
            found = result.scores[directory]
            assert (found[f"{name}/patch.lo"], found[f"{name}/patch.hi"]) == \
                pytest.approx(expected, abs=1e-9)


def test_the_parent_and_its_summary_page_carry_the_intervals(swept, tmp_path):
    result, client = swept
    parent = client.get_run(client.get_run(next(iter(result.runs.values())))
                            .data.tags["mlflow.parentRunId"])
    assert {"iia/patch", "iia/patch.lo", "iia/patch.hi"} <= set(parent.data.metrics)
    page = Path(client.download_artifacts(parent.info.run_id, "summary.html", str(tmp_path)))
    text = page.read_text(encoding="utf-8")
    for directory, scores in result.scores.items():
        shown = f"{scores['iia/patch.lo']:.2f}, {scores['iia/patch.hi']:.2f}]"
        assert shown in text, directory


def _paired(first, other, seed=0, resamples=1000) -> float:
    """P(first's mean > other's) over the same resampled rows (in example-id order, as
    docs/format.md §7.10 says), one resample at a time."""
    ids = sorted(f"r{i}" for i in range(len(first)))
    first = numpy.array([first[int(i[1:])] for i in ids])
    other = numpy.array([other[int(i[1:])] for i in ids])
    rng = numpy.random.default_rng(seed)
    wins = [first[i].mean() > other[i].mean()
            for i in (rng.integers(0, len(first), size=len(first)) for _ in range(resamples))]
    return float(numpy.mean(wins))


def test_the_ranking_names_every_point_tied_first_and_the_probabilities_behind_it():
    from causalab.scores import ranking

    rows = [f"r{i}" for i in range(12)]
    values = {"das": [1.0] * 12, "full": [1.0] * 12, "dbm": [1.0] * 11 + [0.0],
              "neurons": [1.0] * 5 + [0.0] * 7}
    points = [({"method": m}, {"iia/test": float(numpy.mean(v))}) for m, v in values.items()]
    tables = [dict(zip(rows, v)) for v in values.values()]
    ranked = ranking.rank(points, ["method"], tables)
    assert ranked["order"] == ["method=das", "method=full", "method=dbm", "method=neurons"]
    assert ranked["beats"]["method=das"]["method=full"] == 0.0  # identical rows: tied
    for other in ("dbm", "neurons"):
        assert ranked["beats"]["method=das"][f"method={other}"] == pytest.approx(
            _paired(values["das"], values[other]))
    # One wrong row of twelve is beaten in ~65 % of resamples: within noise, so tied.
    assert _paired(values["das"], values["dbm"]) < 0.95 <= _paired(values["das"],
                                                                    values["neurons"])
    assert ranked["first"] == ["method=das", "method=full", "method=dbm"]
    assert ranking.line(ranked) == ("tied first on iia/test (P(beats) < 0.95): method=das, "
                                    "method=full, method=dbm")
    # Without the rows, only equal means are tied.
    assert ranking.rank(points, ["method"], [None] * 4)["first"] == ["method=das", "method=full"]
    metrics = {"iia/test": 1.0}
    assert summary_metrics(points, ranked) == metrics


def summary_metrics(points, ranked):
    from causalab.scores import summary

    return summary.parent_metrics(points, ["method"], ranked["indices"])


def test_the_sweep_parent_carries_its_ranking(swept, tmp_path):
    import json

    result, client = swept
    parent_id = client.get_run(next(iter(result.runs.values()))).data.tags["mlflow.parentRunId"]
    parent = client.get_run(parent_id)
    stored = json.loads(Path(client.download_artifacts(parent_id, "ranking.json", str(tmp_path)))
                        .read_text(encoding="utf-8"))
    assert json.loads(parent.data.tags["causalab.first"]) == stored["first"]
    assert stored["compared"] == "paired bootstrap" and stored["score"] == "iia/patch"
    assert sorted(stored["order"]) == sorted(result.runs)
    assert set(stored["beats"]) == set(result.runs)


def test_the_sweep_parent_carries_the_fidelity_receipt(swept):
    result, client = swept
    parent_id = client.get_run(next(iter(result.runs.values()))).data.tags["mlflow.parentRunId"]
    tags = client.get_run(parent_id).data.tags
    assert float(tags["causalab.receipt.max_abs_dlogit"]) <= 1e-5  # tests/engine/test_fidelity.py
    assert tags["causalab.receipt.dtype"] == "fp32" and int(tags["causalab.receipt.rows"]) > 0
    for library in ("torch", "transformers", "nnsight", "nnterp", "causalab"):
        assert tags[f"causalab.receipt.{library}"], library
