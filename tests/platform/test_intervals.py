"""Every score carries its 95 % interval: printed, in MLflow beside the score, in a Result, on a
sweep's parent and in its summary.html.

The oracles are written here, without the code under test: a proportion's Clopper-Pearson
ends are scipy's beta quantiles; a mean's percentile bootstrap is every one of the n**n
resamples enumerated (a few rows), or, for a saved 12-row table, a million resamples drawn
one batch at a time, to the Monte Carlo error that leaves; the paired probabilities are the
closed forms 1 - (k/n)**n of resamples that draw none of a point's k tied rows.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
from mlflow import MlflowClient
from scipy.stats import beta

import causalab
from causalab import uncertainty
from causalab.progress import Summary

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
HEADS = str(REPO / "documents" / "v2" / "head_patching.json")
HALF_GRID = 0.0005 + 1e-12  # a resample's mean rounded to the 0.001 grid moves this far


def clopper_pearson(successes: int, rows: int) -> tuple[float, float]:
    """The exact binomial interval as scipy's beta quantiles give it."""
    low = 0.0 if successes == 0 else float(beta.ppf(0.025, successes, rows - successes + 1))
    high = 1.0 if successes == rows else float(beta.ppf(0.975, successes + 1, rows - successes))
    return low, high


def every_resample(values) -> tuple[float, float]:
    """The percentile bootstrap over all n**n resamples, enumerated: the least mean with 2.5 %
    of resamples at or below it, the greatest with 2.5 % at or above it."""
    values = numpy.asarray(values, dtype=numpy.float64)
    means = numpy.sort([values[list(index)].mean()
                        for index in itertools.product(range(len(values)), repeat=len(values))])
    tail = int(numpy.ceil(0.025 * len(means)))
    return float(means[tail - 1]), float(means[len(means) - tail])


def sampled(values, resamples=1_000_000) -> tuple[tuple[float, float], float]:
    """The percentile bootstrap from ``resamples`` drawn resamples, and the Monte Carlo
    tolerance that leaves on each end (six standard errors of a 2.5 % quantile)."""
    values = numpy.asarray(values, dtype=numpy.float64)
    rng = numpy.random.default_rng(12345)
    means = numpy.concatenate([values[rng.integers(0, len(values), size=(100_000, len(values)))]
                               .mean(axis=1) for _ in range(resamples // 100_000)])
    low, high = numpy.percentile(means, [2.5, 97.5])
    tolerance = 6 * 2.67 * means.std() / numpy.sqrt(resamples) + 0.001
    return (float(low), float(high)), tolerance


def test_twelve_of_twelve_has_a_lower_end_below_one():
    low, high = uncertainty.interval([1.0] * 12)
    assert (round(low, 3), high) == (0.735, 1.0)
    assert (low, high) == pytest.approx(clopper_pearson(12, 12), abs=1e-12)
    assert uncertainty.interval([0.0] * 12) == pytest.approx(clopper_pearson(0, 12), abs=1e-12)


@pytest.mark.parametrize("successes,rows", [(0, 1), (1, 1), (7, 12), (1, 3), (50, 100),
                                            (999, 1000), (0, 300)])
def test_a_proportion_s_interval_is_clopper_pearson(successes, rows):
    values = [1.0] * successes + [0.0] * (rows - successes)
    assert uncertainty.interval(values) == pytest.approx(clopper_pearson(successes, rows),
                                                         abs=1e-9)


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_a_mean_s_interval_is_the_bootstrap_over_every_resample(rows):
    values = numpy.random.default_rng(rows).normal(scale=3.0, size=rows)
    found, expected = uncertainty.interval(values), every_resample(values)
    assert abs(found[0] - expected[0]) <= HALF_GRID and abs(found[1] - expected[1]) <= HALF_GRID
    assert uncertainty.interval([]) is None


def test_a_long_table_s_interval_agrees_with_a_million_drawn_resamples():
    values = numpy.random.default_rng(7).standard_t(3, size=300) * 4
    (low, high), tolerance = sampled(values)
    found = uncertainty.interval(values)
    assert abs(found[0] - low) <= tolerance and abs(found[1] - high) <= tolerance


def test_the_interval_does_not_move_with_anything_but_the_rows():
    values = numpy.random.default_rng(3).normal(size=12)
    assert uncertainty.interval(values) == uncertainty.interval(values[::-1].copy())


def test_the_printed_line_shows_the_interval_between_the_mean_and_the_row_count():
    summary, point = Summary(), SimpleNamespace(name="k=4")
    values = [1.0] * 8 + [0.0] * 4
    summary.metric(point, "test", "iia", float(numpy.mean(values)), len(values))
    summary.interval(point, "test", "iia", *uncertainty.interval(values))
    summary.metric(point, "test", "ce", None, 0)  # no row scored: no interval either
    low, high = clopper_pearson(8, 12)
    assert (f"{low:.2f}", f"{high:.2f}") == ("0.35", "0.90")
    assert summary.render() == f"k=4  test: iia=0.667 [{low:.2f}, {high:.2f}] (12) ce=-- (0)"


def test_paired_probabilities_call_identical_points_tied_and_a_clear_winner_not():
    rows = [f"r{i}" for i in range(12)]
    same = {"a": dict.fromkeys(rows, 1.0), "b": dict.fromkeys(rows, 1.0),
            "c": {r: float(i % 2) for i, r in enumerate(rows)}}
    probability = uncertainty.beats(same)
    assert probability["a"]["b"] == probability["b"]["a"] == 0.0
    # a beats c unless a resample draws none of c's six zeros: 1 - (6/12)**12
    assert probability["a"]["c"] == pytest.approx(1 - 0.5 ** 12, abs=1e-12)
    assert probability["c"]["a"] == 0.0
    assert uncertainty.tied_first(["a", "b", "c"], probability) == ["a", "b"]


def test_paired_probabilities_of_continuous_rows_count_every_resample():
    first = numpy.random.default_rng(5).normal(size=6)
    other = first + numpy.random.default_rng(6).normal(size=6)
    rows = {"a": {f"r{i}": v for i, v in enumerate(first)},
            "b": {f"r{i}": v for i, v in enumerate(other)}}
    wins = [first[list(i)].mean() > other[list(i)].mean()
            for i in itertools.product(range(6), repeat=6)]
    probability = uncertainty.beats(rows)
    assert probability["a"]["b"] == pytest.approx(numpy.mean(wins), abs=2e-3)
    assert probability["a"]["b"] + probability["b"]["a"] == pytest.approx(1.0, abs=2e-3)


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
            values = table[table["eligible"]]["value"].tolist()
            if name == "iia":  # a proportion
                expected, tolerance = clopper_pearson(int(sum(values)), len(values)), 1e-9
            else:
                expected, tolerance = sampled(values)
            stored = (metrics[f"{name}/patch.lo"], metrics[f"{name}/patch.hi"])
            assert stored == pytest.approx(expected, abs=tolerance), (point, name)
            assert stored[0] <= metrics[f"{name}/patch"] <= stored[1]
            found = result.scores[directory]
            assert (found[f"{name}/patch.lo"], found[f"{name}/patch.hi"]) == stored


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
    # das beats a point unless a resample draws none of its wrong rows: 1 - (right/12)**12.
    # One wrong row of twelve is beaten in 65 % of resamples, within noise, so tied.
    dbm, neurons = 1 - (11 / 12) ** 12, 1 - (5 / 12) ** 12
    assert dbm < 0.95 <= neurons
    assert ranked["beats"]["method=das"]["method=dbm"] == pytest.approx(dbm, abs=1e-12)
    assert ranked["beats"]["method=das"]["method=neurons"] == pytest.approx(neurons, abs=1e-12)
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
