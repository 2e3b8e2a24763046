"""The memory budget (``--memory``, ``run.memory``, ``memory=``): read, refused, and spent by the planner."""
from __future__ import annotations

import json

import pytest
import torch

from causalab import memory


def _values(path) -> list:
    return [row["value"] for row in json.loads(path.read_text())]


@pytest.mark.parametrize("text,expected", [("6GiB", ("bytes", 6 * 2 ** 30)),
                                           ("512MiB", ("bytes", 512 * 2 ** 20)),
                                           ("1.5GB", ("bytes", 1_500_000_000)),
                                           ("80%", ("share", 0.8))],
                         ids=["gibibytes", "mebibytes", "decimal", "share"])
def test_a_budget_is_bytes_with_a_unit_or_a_share_of_free_memory(text, expected):
    assert memory.parse(text) == pytest.approx(expected)


@pytest.mark.parametrize("door,path", [("cli", ("--memory",)), ("hydra", ("run", "memory")),
                                       ("python", ("memory",))],
                         ids=["command_line", "hydra", "python"])
@pytest.mark.parametrize("bad", ["lots", "0GiB", "150%", "6 parsecs"],
                         ids=["word", "zero", "over_all", "unit"])
def test_a_bad_budget_is_refused_in_one_line_naming_the_option_as_each_door_spells_it(
        door, path, bad):
    from causalab.errors import UsageError
    from causalab.options import run_options

    with pytest.raises(UsageError) as refused:
        run_options(door, memory=bad)
    assert refused.value.path == path
    assert "\n" not in str(refused.value)


def test_the_weights_size_is_read_from_the_headers_in_the_run_dtype(tiny):
    from safetensors.torch import load_file
    from pathlib import Path

    resolved = tiny("tiny-llama")
    tensors = {k: v for f in Path(resolved.path).glob("*.safetensors") for k, v in load_file(f).items()}
    stored = sum(t.numel() * t.element_size() for t in tensors.values())
    assert memory.weights_bytes(resolved.path) == stored
    assert memory.weights_bytes(resolved.path, "bf16") == sum(t.numel() * 2 for t in tensors.values())


def test_weights_over_the_budget_are_refused_before_loading_naming_both_sizes(
        tiny, kit, tmp_path, monkeypatch):
    from causalab.engine import weights as load
    from causalab.errors import ModelError
    from causalab.pipeline import run_document

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(load, "_load", never)
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = kit.patching_document(tiny("tiny-llama"))
    with pytest.raises(ModelError) as refused:
        run_document(document, out=str(tmp_path / "out"), data_root=data_root, memory="1KiB")
    assert refused.value.path == ("model", "key")
    weights = memory.weights_bytes(tiny("tiny-llama").path, "fp32")
    assert memory.gib(weights) in str(refused.value)
    assert f"memory budget of {memory.gib(1024)} on cpu" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_command_line_refuses_a_budget_below_the_weights_in_one_line(tiny, kit, tmp_path,
                                                                          capsys):
    from causalab.cli.main import main

    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = tmp_path / "doc.json"
    document.write_text(json.dumps(kit.patching_document(tiny("tiny-llama"))))
    out = tmp_path / "out"
    status = main(["run", str(document), "--memory", "64KiB", "--no-track", "--out", str(out),
                   "--data-root", data_root])
    err = capsys.readouterr().err.strip()
    assert status != 0 and len(err.splitlines()) == 1 and err.startswith("error: model.key:")
    assert "64 KiB" not in err and "more than the memory budget" in err
    assert not out.exists() or not any(out.iterdir())


def _tight(resolved, tokens: int, grad: bool) -> str:
    """A budget whose trace share holds one row of ``tokens`` tokens, not two: what this
    process holds now with the runtime imported, its floor's margin, the weights, and room for
    about two and a half such rows."""
    from causalab.engine.budget import row_bytes
    from causalab.engine.state import ModelFacts
    from causalab.models import load_config

    facts = ModelFacts.of(load_config(resolved.path))
    room = int(2.5 * row_bytes(facts, tokens, 4, grad=grad))
    memory.import_runtime()
    floor = memory.floor_bytes(memory.used_bytes(), resolved.path)
    return f"{(floor + memory.weights_bytes(resolved.path) + room) // 1024}KiB"



@pytest.mark.parametrize("kind", ["patching", "attribution"])
def test_a_tight_budget_cuts_smaller_windows_and_writes_the_same_tables(
        kind, tiny, kit, tmp_path, cuts):
    from causalab.pipeline import run_document
    from tests.engine.test_attribution import document as attribution_document

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = (kit.patching_document(resolved) if kind == "patching"
                else attribution_document(kit, resolved, "attention_premix", unit="head"))
    loose, tight = tmp_path / "loose", tmp_path / "tight"
    run_document(document, out=str(loose), data_root=data_root)
    assert all(len(cut) == 1 for cut in cuts)
    cuts.clear()
    run_document(document, out=str(tight), data_root=data_root, memory=_tight(resolved, 12, kind == "attribution"))
    assert any(len(cut) > 1 for cut in cuts)
    # A row's numbers do not depend on the rows it shares a window with, up to the kernels'
    # summation order (tests/engine/test_batching.py's bound).
    assert _values(tight / "logit_diff.json") == pytest.approx(_values(loose / "logit_diff.json"),
                                                               abs=1e-5)


def test_explain_traces_prints_the_budget_and_each_traces_peak(tiny, kit, tmp_path, capsys):
    from causalab.cli.main import main

    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = tmp_path / "doc.json"
    document.write_text(json.dumps(kit.patching_document(tiny("tiny-llama"))))
    assert main(["explain", "--traces", str(document), "--memory", "6GiB",
                 "--data-root", data_root]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].startswith("memory budget 6.0 GiB; held before any trace ~")  # after the legend
    traces = [line for line in lines if line.startswith("  ") and ". " in line]
    assert traces and all("; peak ~" in line for line in traces)


def test_a_trace_estimate_grows_with_its_rows_and_with_a_graph(tiny):
    from causalab.engine.budget import row_bytes
    from causalab.engine.state import ModelFacts
    from causalab.models import load_config

    facts = ModelFacts.of(load_config(tiny("tiny-llama").path))
    assert row_bytes(facts, 16, 4, grad=True) > row_bytes(facts, 16, 4) > row_bytes(facts, 8, 4)
    assert torch.finfo(torch.bfloat16).bits == 8 * memory.ITEMSIZE["bf16"]


def test_a_model_an_earlier_run_loaded_is_not_counted_twice_in_the_budget(tmp_path):
    """A second run in one process (a notebook, a bench) measures its budget with the weights
    already in: counting them again left it no room (one-row windows, tables that moved)."""
    from causalab.compile.plan import ModelRef
    from causalab.engine import weights as load
    from causalab.models.standin import standin

    path = str(standin("llama-small", dtype="fp32", home=tmp_path))
    ref = ModelRef(key=path, revision="", dtype="fp32", attn_implementation=None, path=path)
    size = memory.weights_bytes(path)
    load._load.cache_clear()
    fresh = load.measure_budget(ref, "64GiB")
    model = load._load(path, "fp32", None, "cpu")
    assert load.budget_of(fresh, model).held >= fresh.before + size  # its pages may lag
    again = load.measure_budget(ref, "64GiB")
    assert load._load(path, "fp32", None, "cpu") is model  # from the cache
    held = load.budget_of(again, model).held
    assert held < again.before + size // 2, (held, again.before, size)
    load._load.cache_clear()


def test_a_budget_above_the_weights_but_below_the_process_floor_is_refused_before_loading(
        tiny, kit, tmp_path):
    """The weights + 10 % hold the weights, not the process: refused before the model loads,
    in one line naming the weights, the floor (this process's runtime, measured, and the load's
    margin) and the budget, and the least budget that holds them, which is then accepted."""
    from causalab.engine import weights as load
    from causalab.errors import ModelError
    from causalab.pipeline import run_document

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = kit.patching_document(resolved)
    weights = memory.weights_bytes(resolved.path, "fp32")
    load._load.cache_clear()  # a model cached by an earlier test would not count as a load
    loads = load._LOADS[0]
    budget = f"{int(weights * 1.1) // 1024}KiB"
    with pytest.raises(ModelError) as refused:
        run_document(document, out=str(tmp_path / "out"), data_root=data_root, memory=budget)
    message = str(refused.value)
    assert load._LOADS[0] == loads and "\n" not in message
    assert refused.value.path == ("model", "key")
    assert memory.gib(weights) in message and "the process's floor" in message
    assert f"+ the load and smallest trace {memory.gib(memory.load_margin(resolved.path))}" \
        in message
    assert f"memory budget of {memory.gib(int(weights * 1.1) // 1024 * 1024)}" in message
    least = message.rsplit("give at least ", 1)[1]
    run_document(document, out=str(tmp_path / "held"), data_root=data_root,
                 memory=f"{int(least.removesuffix('MiB')) + 64}MiB")
    assert load._LOADS[0] == loads + 1 and (tmp_path / "held" / "logit_diff.json").exists()


def test_the_floor_counts_a_vocabulary_and_none_on_an_accelerator(tiny, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 1000}}))
    assert memory.load_margin(folder) == memory.LOAD_MARGIN + 1000 * memory.VOCAB_MARGIN
    assert memory.load_margin(tmp_path / "nowhere") == memory.LOAD_MARGIN
    assert memory.load_margin(folder, "cuda:0") == 0
    assert memory.floor_bytes(10, folder) == 10 + memory.load_margin(folder)


def test_a_run_whose_measured_peak_passes_the_budget_says_where_in_one_note():
    """The watch reads this process's real peak: a budget of 1 MiB from a start of 0 was
    passed (a Python process alone holds more), once and said once; a budget far above the
    peak was held and says nothing."""
    from causalab.engine.budget import Budget
    from causalab.engine.entry import BudgetWatch
    from causalab.engine.events import Events

    class Notes(Events):
        def __init__(self):
            self.lines = []

        def note(self, line):
            self.lines.append(line)

    assert memory.peak_bytes() > 2 * 2 ** 20
    passed, held = Notes(), Notes()
    small = BudgetWatch(Budget(total=2 ** 20, held=0, itemsize=4), passed, start=0)
    large = BudgetWatch(Budget(total=2 ** 50, held=0, itemsize=4), held, start=0)
    for where in ("point a", "point b"):
        small.check(where)
        large.check(where)
    assert len(passed.lines) == 1 and passed.lines[0].startswith("memory: the budget of 1 MiB")
    assert "by the end of point a" in passed.lines[0] and "\n" not in passed.lines[0]
    assert held.lines == []


@pytest.mark.slow
def test_smollm2_is_refused_at_its_weights_plus_ten_percent_and_held_at_the_least_budget():
    """The only test of the floor on a real built-in (tests/QUARANTINE.md): SmolLM2-135M in
    fp32 through ``causalab run`` in a fresh process, tracked as the command line is by
    default (scripts/bench/floor.py's measure): ``--memory`` at the weights + 10 % is refused
    in one line naming the floor; at the least budget that refusal names, the run finishes
    with a peak resident set at most the budget + 5 %."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
    from floor import measure

    found = measure("smollm2-135m", "fp32")
    assert found["refused_at_weights+10%"], found["refusal"]
    assert "its weights take 513 MiB in fp32 and the process's floor" in found["refusal"]
    assert found["ran"] and found["peak/budget"] <= 1 + memory.PEAK_SLACK, found
    assert found["notes"] == []
