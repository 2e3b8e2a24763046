"""Sweep lowering (docs/format.md §10): spellings, named axes, Cartesian order, labels, limits."""
from __future__ import annotations

import pytest

from causalab.document import lower, validate
from causalab.document.sweep import find_wrappers
from causalab.document.vocab import MAX_POINTS
from causalab.errors import DocumentError
from document_examples import dbm, patching

LAYER = ("sites", "target", "layers")


def _with(doc: dict, path: tuple, value) -> dict:
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def test_an_unswept_document_is_one_point_with_an_empty_label():
    doc = patching()
    (point,) = lower(doc)
    assert point.label == "" and point.coordinates == {} and point.document == doc
    assert point.document is not doc


def test_a_range_lowers_with_python_semantics_and_labels_by_its_key():
    doc = _with(patching(), LAYER + (0,), {"sweep": {"range": [0, 6, 2]}})
    points = lower(doc)
    assert [p.label for p in points] == ["layers=0", "layers=2", "layers=4"]
    assert [p.document["sites"]["target"]["layers"] for p in points] == [[0], [2], [4]]
    assert [p.coordinates for p in points] == [{"layers": 0}, {"layers": 2}, {"layers": 4}]


def test_a_negative_step_range_counts_down():
    doc = _with(patching(), LAYER + (0,), {"sweep": {"range": [3, 0, -1]}})
    assert [p.document["sites"]["target"]["layers"][0] for p in lower(doc)] == [3, 2, 1]


def test_a_single_element_list_is_labelled_by_its_element():
    doc = _with(patching(), LAYER, {"sweep": [[0], [1]]})
    assert [p.label for p in lower(doc)] == ["layers=0", "layers=1"]


def test_a_longer_list_value_is_labelled_as_compact_json():
    doc = patching()
    doc["sites"]["target"]["units"] = {"sweep": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    points = lower(doc)
    assert [p.label for p in points] == ["units=[0,1,2,3]", "units=[4,5,6,7]"]
    assert points[1].document["sites"]["target"]["units"] == [4, 5, 6, 7]


def test_an_objective_weight_is_labelled_objective():
    labels = [p.label for p in lower(dbm())]
    assert labels == ["objective=0.0001", "objective=0.002", "objective=0.01", "objective=0.05"]
    weights = [p.document["steps"]["fit"]["objective"][1][0] for p in lower(dbm())]
    assert weights == [0.0001, 0.002, 0.01, 0.05]


def test_independent_axes_cross_with_the_first_appearing_outermost():
    doc = patching()
    doc["sites"]["target"] = {"component": "attention_premix",
                              "layers": [{"sweep": [10, 11]}], "heads": {"sweep": [[0], [1], [2]]}}
    labels = [p.label for p in lower(doc)]
    assert labels == ["layers=10,heads=0", "layers=10,heads=1", "layers=10,heads=2",
                      "layers=11,heads=0", "layers=11,heads=1", "layers=11,heads=2"]


def test_a_named_axis_moves_its_wrappers_together():
    doc = patching()
    iv = doc["interventions"]["patch"]
    doc["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 16]}}]
    iv["reads"]["v_cf"]["pos"] = {"sweep": [-4, -1], "as": "pos"}
    iv["writes"]["patch"]["pos"] = {"sweep": [-4, -1], "as": "pos"}
    points = lower(doc)
    assert len(points) == 32
    assert points[1].label == "layers=0,pos=-1"
    for p in points:
        body = p.document["interventions"]["patch"]
        assert body["reads"]["v_cf"]["pos"] == body["writes"]["patch"]["pos"]


def test_a_slash_in_a_label_becomes_an_underscore():
    doc = _with(patching(), ("steps", "patch", "rows", "base"),
                {"sweep": ["weekdays/train", "weekdays/data#test"]})
    assert [p.label for p in lower(doc)] == ["base=weekdays_train", "base=weekdays_data#test"]


def test_wrappers_are_found_in_reading_order_inside_lists_and_objects():
    doc = dbm()
    doc["sites"]["target"]["layers"] = [{"sweep": [0, 1]}]
    paths = [path for path, _ in find_wrappers(doc)]
    assert paths == [("sites", "target", "layers", 0), ("steps", "fit", "objective", 1, 0)]


def test_the_point_limit_is_checked_from_axis_lengths_before_building():
    doc = patching()
    doc["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 10**12]}}]
    doc["sites"]["target"]["units"] = {"sweep": {"range": [0, 10**12]}}
    with pytest.raises(DocumentError) as caught:
        lower(doc)
    assert caught.value.path == ("sites", "target", "layers", 0)


def test_exactly_max_points_is_allowed():
    doc = _with(patching(), ("steps", "patch", "rows", "base"),
                {"sweep": {"range": [0, MAX_POINTS]}})
    assert len(lower(doc)) == MAX_POINTS


@pytest.mark.parametrize("path", [("model", "revision"), ("header", "description")],
                         ids=["model", "header"])
def test_model_and_header_cannot_be_swept(path):
    doc = _with(patching(), path, {"sweep": ["a", "b"]})
    with pytest.raises(DocumentError) as caught:
        lower(doc)
    assert caught.value.path == path


def test_an_object_with_other_keys_is_not_a_wrapper_and_the_schema_refuses_it():
    doc = _with(patching(), LAYER, {"sweep": [[0]], "values": 1})
    assert len(lower(doc)) == 1
    with pytest.raises(DocumentError) as caught:
        validate(doc)
    assert caught.value.path[:3] == LAYER


def test_every_point_is_validated_on_its_own():
    doc = _with(patching(), LAYER, {"sweep": [[0], [0, 1]]})
    with pytest.raises(DocumentError) as caught:
        validate(doc)
    assert caught.value.path == LAYER + ("sweep", 1)  # the second value, as authored


def test_a_wrapper_left_in_a_point_is_refused_by_validate_point():
    from causalab.document import validate_point

    doc = _with(patching(), LAYER, {"sweep": [[0], [1]]})
    with pytest.raises(DocumentError) as caught:
        validate_point(doc)
    assert caught.value.path == LAYER


def test_points_do_not_share_mutable_values():
    doc = _with(patching(), ("sites", "target", "units"), {"sweep": [[0, 1], [2, 3]], "as": "u"})
    first, second = lower(doc)
    first.document["sites"]["target"]["units"].append(9)
    assert second.document["sites"]["target"]["units"] == [2, 3]
    assert doc["sites"]["target"]["units"] == {"sweep": [[0, 1], [2, 3]], "as": "u"}


@pytest.mark.parametrize("extra", [{"foo": 1}, {"range": [0, 2]}], ids=["foo", "range"])
def test_an_object_with_a_sweep_and_keys_no_wrapper_has_is_refused_as_a_bad_sweep(extra):
    # It lowers as data (it is no wrapper), then used to be the field's wrong type:
    # "Input should be a valid integer".
    doc = _with(patching(), LAYER, [{"sweep": [0, 1], **extra}])
    with pytest.raises(DocumentError) as caught:
        validate(doc)
    assert caught.value.path == LAYER + (0,)
    assert caught.value.message == f'a sweep holds only "sweep" and "as"; found {next(iter(extra))}'


def test_a_sweep_among_a_sweeps_values_is_refused_where_it_sits():
    doc = _with(patching(), LAYER, [{"sweep": [0, {"sweep": [1, 2]}]}])
    with pytest.raises(DocumentError) as caught:
        lower(doc)
    assert caught.value.path == LAYER + (0, "sweep", 1)


def test_wrappers_tied_with_as_are_labelled_by_each_of_their_keys_when_they_differ():
    doc = patching()
    doc["sites"]["target"] = {"component": "attention_premix",
                              "layers": {"sweep": [[23], [23]], "as": "pair"},
                              "heads": {"sweep": [[3], [0]], "as": "pair"}}
    points = lower(doc)
    assert [p.label for p in points] == ["layers=23,heads=3", "layers=23,heads=0"]
    assert points[1].coordinates == {"layers": [23], "heads": [0]}


def test_tied_wrappers_under_one_key_are_labelled_by_the_axis_with_every_value():
    doc = patching()
    doc["sites"]["target"]["layers"] = {"sweep": [[1], [1]], "as": "pair"}
    doc["sites"]["head"]["layers"] = {"sweep": [[0], [1]], "as": "pair"}
    assert [p.label for p in lower(doc)] == ["pair=(1,0)", "pair=(1,1)"]


def test_colliding_labels_of_named_axes_give_no_hint_to_name_them():
    doc = _with(patching(), LAYER, {"sweep": [[0], [0]], "as": "layer"})
    with pytest.raises(DocumentError) as caught:
        lower(doc)
    assert caught.value.path == LAYER and '"as"' not in caught.value.message
    unnamed = _with(patching(), LAYER, {"sweep": [[0], [0]]})
    with pytest.raises(DocumentError) as caught:
        lower(unnamed)
    assert '"as"' in caught.value.message
