"""``explain --traces``: the traces a run opens, listed by the run's own walk without weights.

A run and ``explain --traces`` are one walk (``entry.walk_points``) through two runners:
``runner.TraceRunner`` traces each job, ``dry_run.DryRunner`` records it. The oracle is the
run itself: every job ``runner.run_trace`` is handed during ``run_document``, recorded in
order, must equal the listed one in every field, for every corpus document and for the
sweeps whose schedule is the subtlest (drawn counterfactuals, windows of rows, split fused
runs, a fit in windows). Two things a run decides from numbers, and the tests say so where
they meet them: a fit's early stop (turned off here, ``_without_early_stop``: the dry run
lists every epoch) and which units ``verify`` patches (compared by count: the dry run patches
the first ``2 N``). ``explain --traces`` prints a schedule for every shipped document, weights
never loaded, and ``--json`` gives every job's fields.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from causalab.cli.main import main
from causalab.engine import dry_run, planner, runner
from causalab.engine.trace_jobs import TraceJob
from causalab.pipeline import compile_only, run_document
from day_pairs import EQUAL_PAIRS

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "documents" / "data"
CORPUS = sorted((REPO / "documents" / "v2").glob("*.json"))
SHIPPED = sorted((REPO / "documents").glob("*/*.json"))
SMOLLM2_DOCUMENTS = "ioi_"


def _bundles_missing(raw: dict) -> list[str]:
    paths = [f["file_path"] for f in raw.get("featurizers", {}).values() if f.get("file_path")]
    return [p for p in paths if not p.startswith("steps:") and not (REPO / p).is_file()]


def _planned(document: dict, data_root: str, batch_size=None) -> list:
    from causalab.models import load_config, load_tokenizer

    plan = compile_only(copy.deepcopy(document), data_root)
    model = plan.model or plan.children[0].model
    found = dry_run.schedule(plan, load_config(model.path), load_tokenizer(model.path),
                            batch_size=batch_size)
    return [planned.job for planned in found]


def _opened(document: dict, data_root: str, out: Path, monkeypatch, batch_size=None) -> list:
    seen = []
    original = runner.run_trace

    def record(model, job, live):
        seen.append(job)
        return original(model, job, live)
    with monkeypatch.context() as patch:
        patch.setattr(runner, "run_trace", record)
        run_document(copy.deepcopy(document), out=str(out), data_root=data_root,
                     batch_size=batch_size)
    return seen


def _without_early_stop(document: dict) -> dict:
    """A fit that runs every epoch: early stopping follows numbers no plan knows."""
    changed = copy.deepcopy(document)
    for step in changed.get("steps", {}).values():
        if step.get("kind") == "fit" and "early_stop" in step:
            step["early_stop"]["patience"] = step.get("epochs", 1) + 1
    return changed


def _same(planned: list, opened: list) -> None:
    """Equal in every field: no field of a job is left out of its comparison."""
    assert all(field.compare for field in dataclasses.fields(TraceJob))
    assert opened, "the run opened no trace"
    assert len(planned) == len(opened)
    for index, (want, got) in enumerate(zip(planned, opened)):
        assert want == got, (index, want, got)


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_corpus_document_opens_the_traces_its_schedule_lists(path, tmp_path, monkeypatch):
    document = _without_early_stop(json.loads(path.read_text()))
    if _bundles_missing(document):
        pytest.skip(f"artifact not shipped yet: {_bundles_missing(document)}")
    monkeypatch.chdir(REPO)  # bundle paths are relative to the working directory
    planned = _planned(document, str(DATA))
    _same(planned, _opened(document, str(DATA), tmp_path / "out", monkeypatch))


def _drawn_sweep(kit, resolved) -> dict:
    """A seven-place layer sweep whose counterfactuals are other rows' bases: one fill on
    the base rows serves the counterfactual and keeps the prefixes the sweep resumes from."""
    places = [("attention_output", 0), ("mlp_output", 0), ("block_output", 0),
              ("block_input", 1), ("attention_output", 1), ("mlp_output", 1),
              ("block_output", 1)]
    document = kit.patching_document(resolved)
    document["sites"]["target"] = {"sweep": [{"component": c, "layers": [layer]}
                                             for c, layer in places], "as": "place"}
    document["sites"]["head"] = {"component": "logits"}
    return document


def _drawn_rows(kit) -> list[dict]:
    prompts = [(base, answer) for base, _, answer, _ in kit.PAIRS]
    return [{"input": prompts[a][0], "counterfactual_inputs": [prompts[b][0]],
             "base_answer": prompts[a][1], "cf_answer": prompts[b][1], "example_id": f"pair-{i}"}
            for i, (a, b) in enumerate([(0, 1), (1, 2), (2, 0), (0, 2)])]


@pytest.mark.parametrize("batch_size,capacity", [(None, None), (3, 2), (1, None)],
                         ids=["whole", "windows-of-3-two-points-a-run", "row-by-row"])
def test_a_resumed_fused_sweep_opens_the_traces_its_schedule_lists(
        batch_size, capacity, tiny, kit, tmp_path, monkeypatch):
    data_root = kit.write_table(tmp_path / "data", "pairs", _drawn_rows(kit))
    document = _drawn_sweep(kit, tiny("tiny-llama"))
    if capacity is not None:
        monkeypatch.setattr(planner, "_capacity", lambda point, batch_size, cache=None: capacity)
    planned = _planned(document, data_root, batch_size)
    # Row by row nothing fuses, and an observe resumes only from a fused run's prefixes.
    assert any(job.copies > 1 for job in planned) == (batch_size != 1)
    assert any(job.resume is not None for job in planned) == (batch_size != 1)
    _same(planned, _opened(document, data_root, tmp_path / "out", monkeypatch, batch_size))


def test_a_fit_in_windows_opens_the_last_column_traces_its_schedule_lists(tiny, tmp_path,
                                                                          monkeypatch):
    document = _without_early_stop(json.loads((REPO / "documents/v2/das.json").read_text()))
    resolved = tiny("tiny-qwen2")
    document["model"] = {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"}
    document["steps"]["fit"].update(epochs=2, pairs=8, rows={
        "base": "weekdays_full/data", "counterfactual": "weekdays_full/data"})
    monkeypatch.chdir(REPO)
    planned = _planned(document, str(DATA), batch_size=5)
    assert any(job.tail for job in planned) and any(job.kind == "keys" for job in planned)
    _same(planned, _opened(document, str(DATA), tmp_path / "out", monkeypatch, batch_size=5))


def _shipped(path: Path, tmp_path: Path, request) -> Path:
    """``path``, or a copy on a stand-in of Llama-3.2-1B's shape for documents/real/'s
    weekday documents (the hub checkpoint is not at hand offline)."""
    if path.parent.name == "real" and path.stem.startswith(SMOLLM2_DOCUMENTS):
        request.getfixturevalue("smollm2_dir")
        return path
    if path.parent.name != "real":
        return path
    from causalab.models.readers import LLAMA_3_2_1B_SHAPE, shape_stand_in

    raw = json.loads(path.read_text())
    raw["model"]["key"] = shape_stand_in(tmp_path / "shape", LLAMA_3_2_1B_SHAPE)
    copied = tmp_path / path.name
    copied.write_text(json.dumps(raw))
    return copied


@pytest.mark.parametrize("path", SHIPPED, ids=[f"{p.parent.name}-{p.stem}" for p in SHIPPED])
def test_explain_traces_prints_the_schedule_of_every_shipped_document(path, tmp_path, capsys,
                                                                      monkeypatch, request):
    import causalab.engine.weights

    raw = json.loads(path.read_text())
    if _bundles_missing(raw):
        pytest.skip(f"artifact not shipped yet: {_bundles_missing(raw)}")
    document = _shipped(path, tmp_path, request)
    monkeypatch.chdir(REPO)

    def no_weights(*args, **kwargs):
        raise AssertionError("explain --traces loaded weights")
    monkeypatch.setattr(causalab.engine.weights, "_load", no_weights)
    status = main(["explain", "--traces", str(document), "--data-root", str(DATA)])
    out, err = capsys.readouterr()
    assert status == 0, err
    first, *legend = out.splitlines()[:3]
    # the fit's caveat only where the document fits; its words said once, below the count
    fits = '"kind": "fit"' in json.dumps(raw)
    assert first.endswith("a fit counted to its last epoch)") == fits and int(first.split()[0]) > 0
    assert legend == list(dry_run.LEGEND)
    assert "  1. " in out and " head " not in out




def test_an_attribute_step_in_windows_opens_the_traces_its_schedule_lists(tiny, kit, tmp_path,
                                                                         monkeypatch):
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    document = kit.patching_document(tiny("tiny-llama"))
    document["steps"] = {"attribute": {
        "kind": "attribute", "interventions": "patch", "layers": "all", "unit": "site",
        "rows": {"base": "pairs", "counterfactual": "pairs"}, "metrics": ["logit_diff"],
        "steps": 2, "positions": {"first": 0, "END": -1},
        "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}}
    planned = _planned(document, data_root, batch_size=2)
    # Per window of rows (2, then 1): the counterfactual, then a base forward per step.
    assert [(job.kind, len(job.rows), job.grad) for job in planned] == [
        ("attribute", 2, False), ("attribute", 2, True), ("attribute", 2, True),
        ("attribute", 1, False), ("attribute", 1, True), ("attribute", 1, True)]
    assert [tap.kind for tap in planned[2].taps][:1] == ["replace"]
    _same(planned, _opened(document, data_root, tmp_path / "out", monkeypatch, batch_size=2))


def test_explain_counts_an_attribute_steps_forwards_and_graddrops_backwards(tiny, kit, tmp_path,
                                                                           monkeypatch):
    from causalab.models import load_config, load_tokenizer

    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    document = kit.patching_document(tiny("tiny-llama"), component="attention_premix")
    document["steps"] = {"attribute": {
        "kind": "attribute", "interventions": "patch", "layers": "all", "unit": "head",
        "rows": {"base": "pairs", "counterfactual": "pairs"}, "metrics": ["logit_diff"],
        "graddrop": True}}
    plan = compile_only(copy.deepcopy(document), data_root)
    model = plan.model or plan.children[0].model
    found = dry_run.schedule(plan, load_config(model.path), load_tokenizer(model.path),
                            batch_size=2)
    # Two windows of rows (2, then 1), each a counterfactual and a base forward; each base
    # forward one backward and one per dropped layer of the 2.
    assert dry_run.text(found, batch_size=2).splitlines()[-1] == (
        "<root>/attribute: cost 4 forwards, 6 backwards per metric (GradDrop: 2 layers dropped one "
        "at a time)")
    _same([p.job for p in found],
          _opened(document, data_root, tmp_path / "out", monkeypatch, batch_size=2))


def test_explain_plans_verifys_fused_exact_patches_on_stand_in_units(tiny, kit, tmp_path,
                                                                     monkeypatch):
    from causalab.models import load_config, load_tokenizer

    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    document = kit.patching_document(tiny("tiny-llama"), component="attention_premix")
    document["steps"] = {"attribute": {
        "kind": "attribute", "interventions": "patch", "layers": "all", "unit": "head",
        "rows": {"base": "pairs", "counterfactual": "pairs"}, "metrics": ["logit_diff"],
        "verify": 2}}
    plan = compile_only(copy.deepcopy(document), data_root)
    model = plan.model or plan.children[0].model
    found = dry_run.schedule(plan, load_config(model.path), load_tokenizer(model.path))
    opened = _opened(document, data_root, tmp_path / "out", monkeypatch)
    # 2 N = 4 units, each patched once: fused copies of the rows, on stand-ins when planned
    # (how the copies split over traces depends on the layers of the units chosen).
    # Every unit taps END alone: all run as one trace of the last column over kept keys.
    for jobs in ([p.job for p in found], opened):
        assert sum(j.copies for j in jobs if j.kind == "forward") == 4
        assert [(j.kind, j.tail, j.resume) for j in jobs if j.kind in ("keys", "forward")] == [
            ("keys", False, None), ("forward", True, None)]
    assert {p.where for p in found if p.job.kind != "attribute"} == {
        "<root>/attribute verify (4 units chosen at run time)"}
    checks = sum(p.job.kind != "attribute" for p in found)
    assert dry_run.text(found).splitlines()[-1] == (
        f"<root>/attribute: cost 2 forwards, 1 backwards per metric; verify {checks} traces")


def test_explain_plans_a_tolerances_first_round_and_says_when_the_rounds_stop(tiny, kit,
                                                                             tmp_path):
    """The rounds after the first depend on exact effects the dry run does not have: it lists
    the first round's patches and names the tolerance and the cap."""
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    document = kit.patching_document(tiny("tiny-llama"), component="attention_premix")
    document["steps"] = {"attribute": {
        "kind": "attribute", "interventions": "patch", "layers": "all", "unit": "head",
        "rows": {"base": "pairs", "counterfactual": "pairs"}, "metrics": ["logit_diff"],
        "verify": {"bound": 0.05, "round": 1, "max_units": 6}}}
    from causalab.models import load_config, load_tokenizer

    plan = compile_only(copy.deepcopy(document), data_root)
    model = plan.model or plan.children[0].model
    found = dry_run.schedule(plan, load_config(model.path), load_tokenizer(model.path))
    assert sum(p.job.copies for p in found if p.job.kind == "forward") == 2
    assert {p.where for p in found if p.job.kind != "attribute"} == {
        "<root>/attribute verify (rounds of 2 units until the bound is below 0.05, at most 6 "
        "units chosen at run time)"}


def test_explain_traces_json_gives_every_field_of_every_job(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    document = REPO / "documents" / "v2" / "das_apply.json"
    status = main(["explain", "--traces", "--json", str(document), "--data-root", str(DATA)])
    out, err = capsys.readouterr()
    assert status == 0, err
    traces = json.loads(out)["traces"]
    fields = {field.name for field in dataclasses.fields(TraceJob)}
    assert len(traces) == 3 and all(set(trace["job"]) == fields for trace in traces)
    read = traces[1]["job"]
    assert (read["kind"], read["head"], read["stop"], read["rows"]) == ("reads", "none", True,
                                                                         [0, 1])
    assert read["batch"] == {"role": "counterfactual", "rows": 2, "tokens": 8}
    tap = read["taps"][0]
    assert (tap["kind"], tap["whole"], tap["op"]["name"]) == ("read", True, "v_cf")
    assert tap["op"]["address"]["component"] == "block_output"


def test_a_fit_that_may_stop_early_opens_a_prefix_of_the_listed_traces(tmp_path, monkeypatch):
    """Early stopping follows the eval's numbers: the dry run lists every epoch, and a run
    that stops opens the traces listed up to its last eval, in that order."""
    document = json.loads((REPO / "documents/v2/das.json").read_text())
    document["steps"]["fit"]["early_stop"]["patience"] = 1
    monkeypatch.chdir(REPO)
    planned = _planned(document, str(DATA))
    opened = _opened(document, str(DATA), tmp_path / "out", monkeypatch)
    assert opened and len(opened) <= len(planned)
    assert planned[:len(opened)] == opened


def test_an_edges_step_makes_the_hooked_forwards_explain_lists(tiny, kit, tmp_path,
                                                               monkeypatch):
    """An edges step opens no nnsight trace; its plain torch forwards (``edges._forward``)
    are listed as ``edges`` jobs, each on the rows and under the grad a run gives it."""
    from causalab.engine.attribution import edges
    from causalab.models import load_config, load_tokenizer

    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows(EQUAL_PAIRS))
    document = kit.patching_document(tiny("tiny-llama"), component="attention_output")
    document["steps"] = {"circuit": {
        "kind": "attribute", "interventions": "patch", "metrics": ["logit_diff"],
        "rows": {"base": "pairs", "counterfactual": "pairs"}, "edges": True, "steps": 2,
        "circuit_k": [4]}}
    plan = compile_only(copy.deepcopy(document), data_root)
    model = plan.model or plan.children[0].model
    found = dry_run.schedule(plan, load_config(model.path), load_tokenizer(model.path),
                             batch_size=2)
    listed = [(tuple(job.batch.input_ids[r] for r in job.rows), job.grad)
              for job in (p.job for p in found) if job.kind == "edges"]
    made = []
    original = edges._forward

    def record(model, batch, *args, **kwargs):
        made.append((tuple(map(tuple, batch["input_ids"].tolist())), torch.is_grad_enabled()))
        return original(model, batch, *args, **kwargs)
    monkeypatch.setattr(edges, "_forward", record)
    opened = _opened(document, data_root, tmp_path / "out", monkeypatch, batch_size=2)
    # 3 rows in windows of 2: per window cf, base, 2 steps; then base, cf, 3 circuit sizes
    # (0, 4, 110) and MIB's: of its sizes 0, 1, 2, 5, 11, 22, 55, 110 of the 110 edges, the
    # six the curve lacks by |score| and the six between the ends by signed score.
    assert len(listed) == 2 * (2 + 2) + 2 * (2 + 3 + 6 + 6)
    assert made == listed
    assert [p.job for p in found if p.job.kind != "edges"] == opened


# explain --traces over every shipped document in one fresh process (models already written),
# saying which of the heavy libraries it imported: the dry walk needs none of them (the engine imports torch at
# its first use, causalab.lazy), so the verb costs about what plain explain does.
_LIGHT = """
import contextlib, io, json, sys
from causalab.cli.main import main
data, paths, failed = sys.argv[1], sys.argv[2:], []
for path in paths:
    with contextlib.redirect_stdout(io.StringIO()):
        if main(["explain", path, "--data-root", data, "--traces"]):
            failed.append(path)
print(json.dumps({"failed": failed, "heavy": [m for m in ("torch", "transformers", "nnsight",
                                                          "nnterp") if m in sys.modules]}))
"""


def test_explain_traces_of_every_shipped_document_imports_no_torch():
    import subprocess
    import sys

    paths = [str(p) for p in CORPUS]
    for _ in range(2):  # the first run may write this session's built-in models (torch)
        done = subprocess.run([sys.executable, "-c", _LIGHT, str(DATA), *paths], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"failed": [], "heavy": []}, found
