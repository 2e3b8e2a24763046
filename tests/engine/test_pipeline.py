"""The run pipeline: compile first, load once, events around points, the on-disk layout."""
from __future__ import annotations

import json

import pytest

from causalab.engine.events import Events
from causalab.errors import CompileError


class Recorder(Events):
    def __init__(self, skip=()):
        self.calls, self.skip = [], set(skip)

    def run_start(self, document, points):
        self.calls.append(("run_start", len(points)))

    def point_start(self, point):
        self.calls.append(("point_start", point.name))
        return point.name not in self.skip

    def point_end(self, point, written, error):
        self.calls.append(("point_end", point.name, tuple(written), type(error).__name__ if error else None))

    def metric(self, point, step, name, mean, eligible):
        self.calls.append(("metric", point.name, name, eligible))

    def run_end(self, written):
        self.calls.append(("run_end", len(written)))


def _swept(kit, resolved) -> dict:
    document = kit.patching_document(resolved)
    document["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 2]}}]
    return document


def test_a_sweep_writes_one_directory_per_point_and_reports_each_point(tiny, kit, tmp_path):
    from causalab.pipeline import run_document

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    events = Recorder()
    out = tmp_path / "out"
    written = run_document(_swept(kit, resolved), out=str(out), data_root=data_root, events=events)
    names = [str(p).replace(str(out) + "/", "") for p in written]
    assert names == ["document.json", "run.json",
                     "layers=0/document.json", "layers=0/logit_diff.json", "layers=0/iia.json",
                     "layers=1/document.json", "layers=1/logit_diff.json", "layers=1/iia.json"]
    assert json.loads((out / "document.json").read_text()) == _swept(kit, resolved)
    point = json.loads((out / "layers=1" / "document.json").read_text())
    assert point["sites"]["target"]["layers"] == [1]
    kinds = [call[0] for call in events.calls]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert ("point_end", "layers=0", ("layers=0/document.json", "layers=0/logit_diff.json",
                                      "layers=0/iia.json"), None) in events.calls
    assert ("metric", "layers=1", "iia", 3) in events.calls


def test_a_point_the_listener_vetoes_is_skipped(tiny, kit, tmp_path):
    from causalab.pipeline import run_document

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    out = tmp_path / "out"
    run_document(_swept(kit, resolved), out=str(out), data_root=data_root,
                 events=Recorder(skip={"layers=0"}))
    assert not (out / "layers=0").exists() and (out / "layers=1" / "iia.json").exists()


def test_a_point_that_raises_is_reported_with_its_error_then_raised(tiny, kit, tmp_path):
    from causalab.errors import RunError
    from causalab.pipeline import run_document

    document, data_root = kit.unplaceable_write(tiny("tiny-llama"), tmp_path / "data")
    events = Recorder()
    with pytest.raises(RunError):
        run_document(document, out=str(tmp_path / "out"), data_root=data_root, events=events)
    assert events.calls[-1] == ("point_end", "<root>", (), "RunError")


def test_a_compile_refusal_fires_before_any_event_or_file(tiny, kit, tmp_path):
    from causalab.pipeline import run_document

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = kit.patching_document(resolved, layer=7)
    events = Recorder()
    with pytest.raises(CompileError) as caught:
        run_document(document, out=str(tmp_path / "out"), data_root=data_root, events=events)
    assert caught.value.path[:2] == ("sites", "target")
    assert events.calls == [] and not (tmp_path / "out").exists()


def test_each_entry_of_a_list_step_reports_its_metrics_under_its_own_step_name(tiny, kit, tmp_path):
    import copy

    from causalab.engine.events import Events
    from causalab.pipeline import run_document

    class Recording(Events):
        def __init__(self):
            self.metrics = []

        def metric(self, point, step, name, mean, eligible):
            self.metrics.append((step, name))

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = kit.patching_document(resolved)
    document["interventions"]["other"] = copy.deepcopy(document["interventions"]["patch"])
    document["steps"]["patch"]["interventions"] = ["patch", "other"]
    document["steps"]["patch"]["saves"] = []
    events = Recording()
    run_document(document, out=str(tmp_path / "out"), data_root=data_root, events=events)
    assert sorted(events.metrics) == [("patch/other", "iia"), ("patch/other", "logit_diff"),
                                      ("patch/patch", "iia"), ("patch/patch", "logit_diff")]


def test_an_ended_point_keeps_no_results_once_its_end_is_reported(tiny, kit, tmp_path):
    """What a point computed is in its files; the run does not hold it to the end."""
    from causalab.pipeline import run_document

    class Holder(Events):
        def __init__(self):
            self.points, self.at_end = [], []

        def point_start(self, point):
            self.points.append(point)

        def point_end(self, point, written, error):
            self.at_end.append(sorted(point.children[0].results))

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    holder = Holder()
    run_document(_swept(kit, resolved), out=str(tmp_path / "out"), data_root=data_root,
                 events=holder)
    assert len(holder.points) == 2
    assert all("reads" in names for names in holder.at_end), holder.at_end
    for point in holder.points:
        assert all(not node.results for node in point.children)


def test_an_operand_placed_on_no_row_is_refused_at_compile_naming_the_read(tiny, kit, tmp_path):
    # An anchor absent from every prompt places nothing: refused before the model loads (C23).
    from causalab.errors import CompileError
    from causalab.pipeline import run_document

    document = kit.patching_document(tiny("tiny-llama"))
    document["interventions"]["patch"]["reads"]["v_cf"]["pos"] = {
        "index": -1, "scope": {"variable": "cf_answer"}}
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    with pytest.raises(CompileError) as caught:
        run_document(document, out=str(tmp_path / "out"), data_root=data_root)
    assert caught.value.path == ("interventions", "patch", "reads", "v_cf", "pos")
    assert "selects no token on any row" in caught.value.message


@pytest.mark.parametrize("operand_pos", [{"all": True}], ids=["wider_than_the_write"])
def test_an_operand_over_other_positions_than_its_write_is_refused_at_the_operand(
        tiny, kit, tmp_path, operand_pos):
    # Widths only rows show (an `all` read, an anchor absent from every prompt) used to reach
    # the mechanism and fail there with a broadcast error wrapped by nnsight.
    from causalab.errors import RunError
    from causalab.pipeline import run_document

    document = kit.patching_document(tiny("tiny-llama"))
    document["interventions"]["patch"]["reads"]["v_cf"]["pos"] = operand_pos
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    with pytest.raises(RunError) as caught:
        run_document(document, out=str(tmp_path / "out"), data_root=data_root)
    assert caught.value.path == ("interventions", "patch", "writes", "patch", "operand")
    assert "1 written" in caught.value.message
