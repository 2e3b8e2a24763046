"""Metric kinds against hand formulas, eligibility as an intersection, and the docs/format.md §13 table rows."""
from __future__ import annotations

import importlib
import inspect
import math

import pytest
import torch

from causalab.compile.plan import MetricOp
from causalab.engine.metrics import METRICS, NON_FINITE, metric_table, score
from causalab.errors import RunError

LOGITS = torch.tensor([[2.0, -1.0, 0.5, 3.0],
                       [0.0, 4.0, -2.0, 1.0],
                       [1.0, 1.0, 5.0, -3.0]])


def _softmax_row(row):
    peak = max(row)
    exps = [math.exp(v - peak) for v in row]
    return [e / sum(exps) for e in exps]


def _ids(*values):
    return torch.tensor(values, dtype=torch.long)


def test_the_metric_table_has_the_vocabulary_kinds_with_columns_in_compute_order():
    vocab = importlib.import_module("causalab.document.vocab")
    assert set(METRICS) == set(vocab.METRIC_KINDS)
    for kind, fn in METRICS.items():
        names = tuple(inspect.signature(fn).parameters)[1:]
        row = vocab.METRIC_KINDS[kind]
        assert names == (*row.get("reads", ()), *row["columns"]), kind


def test_match_is_one_where_the_argmax_is_the_token():
    got = METRICS["match"](LOGITS, _ids(3, 0, 2))
    assert got.tolist() == [1.0, 0.0, 1.0]


def test_logit_diff_is_the_difference_of_two_raw_logits():
    got = METRICS["logit_diff"](LOGITS, _ids(0, 1, 3), _ids(3, 2, 2))
    assert got.tolist() == [2.0 - 3.0, 4.0 - (-2.0), -3.0 - 5.0]


def test_cross_entropy_is_the_negative_log_softmax_of_the_target():
    got = METRICS["cross_entropy"](LOGITS, _ids(1, 1, 0))
    expected = [-math.log(_softmax_row(row)[t]) for row, t in zip(LOGITS.tolist(), (1, 1, 0))]
    assert torch.allclose(got, torch.tensor(expected), rtol=1e-6)


def test_token_logit_and_token_prob_read_one_token_raw_and_softmaxed():
    assert METRICS["token_logit"](LOGITS, _ids(2, 3, 1)).tolist() == [0.5, 1.0, 1.0]
    got = METRICS["token_prob"](LOGITS, _ids(2, 3, 1))
    expected = [_softmax_row(row)[t] for row, t in zip(LOGITS.tolist(), (2, 3, 1))]
    assert torch.allclose(got, torch.tensor(expected), rtol=1e-6)


@pytest.mark.parametrize("kind", ["logit_diff", "cross_entropy", "token_logit", "token_prob"])
def test_scored_values_keep_their_gradient(kind):
    logits = LOGITS.clone().requires_grad_(True)
    ids = [_ids(0, 1, 2), _ids(3, 3, 3)] if kind == "logit_diff" else [_ids(0, 1, 2)]
    torch.autograd.backward(METRICS[kind](logits, *ids).sum())
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_half_precision_logits_are_scored_in_float32():
    got = METRICS["token_prob"](LOGITS.to(torch.bfloat16), _ids(2, 3, 1))
    assert got.dtype == torch.float32


def _metric(kind="logit_diff", eligible=(0, 2, 3), columns=("a", "b"),
            token_ids=((0, 1, 2, 3, 1), (3, 3, 0, 2, -1))):
    return MetricOp("iia", kind, "logits", "patched", "base", columns, token_ids, eligible,
                    "logit", "logit_diff/v1")


def test_only_rows_in_both_eligibility_halves_are_scored_by_indexing():
    # pass rows 0..4; the read placed rows 0, 1 and 3 (flat: one logits row each);
    # the column half keeps 0, 2, 3; the scored set is {0, 3}.
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0],
                           [9.0, 9.0, 9.0, 9.0],
                           [5.0, 7.0, 11.0, 13.0]])
    values, rows = score(_metric(), logits, (0, 1, 3))
    assert rows == (0, 3)
    assert values.tolist() == [1.0 - 4.0, 13.0 - 11.0]


def test_a_rectangular_unit_window_is_squeezed_and_scored_in_row_order():
    logits = LOGITS[:, None, :].expand(3, 1, 4).clone()
    metric = _metric(eligible=(0, 1, 2), token_ids=((0, 1, 3), (1, 0, 2)))
    values, rows = score(metric, logits, (0, 1, 2))
    assert rows == (0, 1, 2)
    assert values.tolist() == [2.0 - (-1.0), 4.0 - 0.0, -3.0 - 5.0]


def test_an_empty_eligible_intersection_is_refused_at_the_metric():
    with pytest.raises(RunError) as caught:
        score(_metric(eligible=(2, 4)), torch.randn(2, 4), (0, 1))
    assert caught.value.path == ("iia",)


def test_the_table_has_one_row_per_example_including_excluded_ones():
    metric = _metric()
    table = metric_table(metric, torch.tensor([0.5, float("nan")]), (0, 3),
                         positions=[(9,), (8,), (), (9,)],
                         reasons=["", "", "alignment_missing", ""],
                         example_ids=["a", "b", "c", "d"], produced_by="f" * 64)
    assert [row["example_id"] for row in table] == ["a", "b", "c", "d"]
    assert [row["value"] for row in table] == [0.5, None, None, None]
    assert [row["eligible"] for row in table] == [True, False, False, False]
    assert [row["positions"] for row in table] == [[9], [8], [], [9]]
    assert [row["reason"] for row in table] == ["", "", "alignment_missing", NON_FINITE]
    assert list(table[0]) == ["example_id", "metric", "value", "eligible", "positions", "reason",
                              "unit", "estimand_version", "produced_by"]
    assert {(r["metric"], r["unit"], r["estimand_version"], r["produced_by"]) for r in table} == \
        {("iia", "logit", "logit_diff/v1", "f" * 64)}


def test_a_pass_without_dynamic_positions_writes_null_positions_and_empty_reasons():
    table = metric_table(_metric(eligible=(0, 1)), [1.0, 2.0], (0, 1), None, None,
                         ["0", "1", "2"], "d", name="steer/iia")
    assert [row["positions"] for row in table] == [None, None, None]
    assert [row["reason"] for row in table] == ["", "", ""]
    assert [row["value"] for row in table] == [1.0, 2.0, None]
    assert table[0]["metric"] == "steer/iia"


def test_rows_whose_logits_overflowed_are_excluded_as_non_finite_never_scored_as_null():
    # A write that overflowed the dtype: row 1's logits are NaN, row 2's hold +inf, so its
    # logit difference is inf - inf. Only row 0 is a number; the mean a run logs is its value.
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0],
                           [float("nan")] * 4,
                           [float("inf"), 0.0, 0.0, float("inf")]])
    metric = _metric(eligible=(0, 1, 2), token_ids=((0, 0, 0), (3, 3, 3)))
    values, rows = score(metric, logits, (0, 1, 2))
    assert rows == (0,) and values.tolist() == [1.0 - 4.0]
    table = metric_table(metric, values, rows, None, None, ["a", "b", "c"], "d")
    assert [(r["value"], r["eligible"], r["reason"]) for r in table] == [
        (-3.0, True, ""), (None, False, NON_FINITE), (None, False, NON_FINITE)]


def test_a_match_on_nan_logits_is_excluded_though_its_argmax_is_a_number():
    logits = torch.tensor([[0.0, 5.0, 0.0, 0.0], [float("nan")] * 4])
    metric = _metric(kind="match", eligible=(0, 1), columns=("expected",), token_ids=((1, 1),))
    values, rows = score(metric, logits, (0, 1))
    assert rows == (0,) and values.tolist() == [1.0]


def test_a_metric_whose_every_row_overflowed_is_refused_at_the_metric():
    logits = torch.full((2, 4), float("nan"))
    with pytest.raises(RunError) as caught:
        score(_metric(eligible=(0, 1), token_ids=((0, 0), (1, 1))), logits, (0, 1))
    assert caught.value.path == ("iia",)
