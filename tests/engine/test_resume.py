"""Prefix resume: a forward whose taps all sit at block R or later skips blocks 0 … R−1, and
the parts of block R before its first tap (its attention, its MLP) are served from the cache.

The oracle is the same document run with resume off (a zero resume budget): for a fused
layer sweep every table must be byte-identical (tensors compared exactly), on every family,
and resumed traces must actually have run. A DAS fit at layer 1, whole-batch or in
minibatches, runs every update and eval at the last column alone over kept keys and values
(engine/tail.py) and must fit the same subspace to within float rounding.
"""
from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from causalab.engine import cache as cache_module
from causalab.engine import planner, runner
from causalab.pipeline import run_document

pytestmark = pytest.mark.usefixtures("no_receipt")

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = "smollm2-135m"
PLACES = [("attention_output", 0), ("mlp_output", 0), ("block_output", 0), ("block_input", 1),
          ("attention_output", 1), ("mlp_output", 1), ("block_output", 1)]


def _families() -> list:
    """The four tiny families, and SmolLM2 (slow) where the registry has it."""
    from causalab.models import BUILTINS

    names: list = ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2"]
    if SMOLLM2 in BUILTINS:
        names.append(pytest.param(SMOLLM2, marks=pytest.mark.slow, id="smollm2"))
    return names


def _resolved(family, tiny, request):
    if family == SMOLLM2:
        request.getfixturevalue("smollm2_dir")  # the suite's one place that materialises it
    return tiny(family)


@pytest.fixture()
def resumed(monkeypatch):
    """Counts traces that skipped a prefix."""
    seen = {"resumed": 0}
    original = runner.run_trace

    def counting(model, job, live):
        seen["resumed"] += job.resume is not None
        return original(model, job, live)
    monkeypatch.setattr(runner, "run_trace", counting)
    return seen


def _sweep(resolved) -> dict:
    sites = [{"component": c, "layers": [layer]} for c, layer in PLACES]
    return {
        "model": {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"sweep": sites, "as": "place"}, "head": {"component": "logits"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": -1, "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"}}}},
        "steps": {"patch": {"kind": "observe", "interventions": "patch",
                            "rows": {"base": "pairs", "counterfactual": "pairs"},
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"}]}},
    }


def _das(resolved) -> dict:
    document = json.loads((REPO / "documents" / "v2" / "das.json").read_text())
    document["model"] = {"key": resolved.key, "revision": resolved.revision, "dtype": "fp32"}
    document["sites"]["target"]["layers"] = [1]
    document["steps"]["fit"]["epochs"] = 2
    return document


def _files(root: Path) -> dict:
    """Every output but run.json: JSON as bytes, safetensors as their tensors."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.name == "run.json" or not path.is_file():
            continue
        key = str(path.relative_to(root))
        found[key] = load_file(str(path)) if path.suffix == ".safetensors" else path.read_bytes()
    return found


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        if isinstance(a[key], dict):
            assert a[key].keys() == b[key].keys()
            assert all(torch.equal(a[key][n], b[key][n]) for n in a[key]), key
        else:
            assert a[key] == b[key], key


def _both(document, tmp_path, monkeypatch, data_root, batch_size=None) -> tuple[dict, dict]:
    monkeypatch.chdir(REPO)
    run_document(copy.deepcopy(document), out=str(tmp_path / "resumed"), data_root=data_root,
                 batch_size=batch_size)
    monkeypatch.setattr(cache_module, "RESUME_BUDGET", 0)
    run_document(copy.deepcopy(document), out=str(tmp_path / "full"), data_root=data_root,
                 batch_size=batch_size)
    return _files(tmp_path / "resumed"), _files(tmp_path / "full")


@pytest.mark.parametrize("family", _families())
def test_a_fused_sweep_resumed_past_its_prefix_writes_the_tables_the_full_forward_writes(
        family, tiny, kit, tmp_path, monkeypatch, resumed, request):
    rows = kit.pair_rows()
    if family == SMOLLM2:
        # Its own task at a real size: on traces of a few short rows (4 pairs, ~40 tokens)
        # SmolLM2's matrix products sum in an order that follows how many rows a trace
        # stacks, so traces grouped otherwise differ in the last bits (as another
        # --batch-size does); from 24 IOI rows on they do not.
        rows = json.loads((REPO / "documents" / "data" / "ioi" / "data.json").read_text())[:24]
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    got, want = _both(_sweep(_resolved(family, tiny, request)), tmp_path, monkeypatch, data_root)
    # Four entries: block 0 with its attention cached (attention_output[0]); block 0 with
    # attention and MLP cached (mlp_output[0], with block_output[0] and block_input[1]
    # joining it); block 1 with its attention cached; block 1 with both cached (mlp_output[1],
    # with block_output[1] joining it).
    assert resumed["resumed"] == 4
    _same(got, want)


def test_a_sweep_cut_into_several_fused_runs_computes_its_shared_values_once(
        tiny, kit, tmp_path, monkeypatch):
    """Seven points, two to a fused run: the first run's fill also keeps what the later runs
    will enter with, and the counterfactual's reads are one un-intervened trace, not four."""
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = _sweep(tiny("tiny-llama"))
    monkeypatch.setattr(planner, "_capacity", lambda point, batch_size, cache=None: 2)
    unintervened, fills = [], []
    prefix_room = cache_module.DocumentCache.prefix_room

    def room(self, *args, **kwargs):
        fits = prefix_room(self, *args, **kwargs)
        fills.extend([1] if fits else [])
        return fits
    monkeypatch.setattr(planner, "_reads_jobs", _counted(planner._reads_jobs, unintervened))
    monkeypatch.setattr(cache_module.DocumentCache, "prefix_room", room)
    got, want = _both(document, tmp_path, monkeypatch, data_root)
    # One un-intervened trace with resume on and one without; one fill, with resume on.
    assert (len(unintervened), len(fills)) == (2, 1)
    _same(got, want)


def _drawn_pairs(kit) -> list[dict]:
    """Pairs whose counterfactual is another row's base, as in a table of ordered pairs of
    one set of prompts: the counterfactual batch holds no prompt the base batch lacks."""
    prompts = [(base, answer) for base, _, answer, _ in kit.PAIRS]
    return [{"input": prompts[a][0], "counterfactual_inputs": [prompts[b][0]],
             "base_answer": prompts[a][1], "cf_answer": prompts[b][1], "example_id": f"pair-{i}"}
            for i, (a, b) in enumerate([(0, 1), (1, 2), (2, 0), (0, 2)])]


def _drawn_ioi(count: int) -> list[dict]:
    """SmolLM2's own task at a size where its tables do not follow how a trace stacks rows
    (see the fused-sweep test above): each of ``count`` IOI rows takes the next row's base
    as its counterfactual, and that row's answer as its own."""
    found = json.loads((REPO / "documents" / "data" / "ioi" / "data.json").read_text())[:count]
    return [{"input": row["input"], "counterfactual_inputs": [found[(i + 1) % count]["input"]],
             "base_answer": row["base_answer"], "cf_answer": found[(i + 1) % count]["base_answer"],
             "example_id": row["example_id"]} for i, row in enumerate(found)]


@contextlib.contextmanager
def _traced_ids(document: dict, data_root: str):
    """The ids every trace of the document's model runs on while inside, in order (a hook
    on the loaded model's embeddings, which every trace calls)."""
    from causalab.engine.weights import load_model
    from causalab.pipeline import compile_only

    plan = compile_only(copy.deepcopy(document), data_root)
    seen: list = []
    handle = load_model(plan.model)._model.get_input_embeddings().register_forward_pre_hook(
        lambda module, args: seen.append(args[0]))
    try:
        yield seen
    finally:
        handle.remove()


def _ran_on(seen: list, ids: torch.Tensor, window: int | None = None) -> bool:
    """Whether some trace ran on ``ids``, or on one of its windows of ``window`` rows."""
    pieces = [ids] if window is None else list(ids.split(window))
    return any(found.shape == piece.shape and torch.equal(found, piece)
               for found in seen for piece in pieces)


def _counterfactual_ids(kit, oracle, resolved, rows) -> torch.Tensor:
    tokenizer = oracle(resolved.path)[1]
    cf = kit.encode(tokenizer, [r["counterfactual_inputs"][0] for r in rows])["input_ids"]
    assert not torch.equal(cf, kit.encode(tokenizer, [r["input"] for r in rows])["input_ids"])
    return cf


def _block0_diffs(files: dict) -> list[float]:
    """The logit differences the block_output[0] point of ``_sweep`` wrote."""
    table = next(key for key in files if '"block_output"' in key and '[0]' in key
                 and key.endswith("logit_diff.json"))
    return [row["value"] for row in json.loads(files[table])]


def _hooked_diffs(kit, oracle, resolved, rows) -> list[float]:
    """The same numbers from the hook oracle: block_output[0]'s last column swapped in."""
    model, tokenizer = oracle(resolved.path)
    logits = kit.patched_forward(model, tokenizer, rows)[0][:, -1]
    a, b = (torch.tensor([tokenizer(r[key], add_special_tokens=False)["input_ids"][0]
                          for r in rows])[:, None] for key in ("cf_answer", "base_answer"))
    return (logits.gather(1, a) - logits.gather(1, b))[:, 0].tolist()


@pytest.mark.parametrize("family", _families())
def test_a_counterfactual_drawn_from_the_base_prompts_is_read_from_the_base_forward(
        family, tiny, kit, oracle, tmp_path, monkeypatch, resumed, request):
    """The counterfactual's reads come from the base rows' un-intervened forward, the one
    that also keeps the prefix the resumed traces enter from: one un-intervened trace, none
    over the counterfactual's own rows, and the numbers a hand-written hook loop gets."""
    rows = _drawn_pairs(kit) if family != SMOLLM2 else _drawn_ioi(24)
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    resolved = _resolved(family, tiny, request)
    document = _sweep(resolved)
    monkeypatch.chdir(REPO)
    seen: dict = {}
    for kind in ("resumed", "full"):
        if kind == "full":
            monkeypatch.setattr(cache_module, "RESUME_BUDGET", 0)
        with _traced_ids(document, data_root) as seen[kind]:
            run_document(copy.deepcopy(document), out=str(tmp_path / kind), data_root=data_root)
    got, want = _files(tmp_path / "resumed"), _files(tmp_path / "full")
    cf = _counterfactual_ids(kit, oracle, resolved, rows)
    assert not _ran_on(seen["resumed"] + seen["full"], cf)
    # Resumed: the one un-intervened trace, then the four resumed ones (a counterfactual
    # forward and a prefix forward used to be two). Full: that trace and one fused trace.
    assert (resumed["resumed"], len(seen["resumed"]), len(seen["full"])) == (4, 5, 2)
    _same(got, want)
    # Hosting reorders rows in a batch of the same size; a BLAS that sums each row in an
    # order that follows its place could move a logit (about 10 here) by a few ulps.
    assert _block0_diffs(got) == pytest.approx(_hooked_diffs(kit, oracle, resolved, rows),
                                               abs=1e-5)


def test_drawn_counterfactuals_in_windows_and_split_fused_runs_write_the_full_forwards_tables(
        tiny, kit, oracle, tmp_path, monkeypatch):
    """Windows of 3 rows, two points to a fused run: the base rows' one un-intervened trace
    per window still serves the counterfactual and every run's prefix, and the tables are
    the unresumed ones and the hook loop's."""
    rows = _drawn_pairs(kit)
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    resolved = tiny("tiny-llama")
    document = _sweep(resolved)
    monkeypatch.setattr(planner, "_capacity", lambda point, batch_size, cache=None: 2)
    unintervened: list = []
    monkeypatch.setattr(planner, "_reads_jobs", _counted(planner._reads_jobs, unintervened))
    with _traced_ids(document, data_root) as seen:
        got, want = _both(document, tmp_path, monkeypatch, data_root, batch_size=3)
    # One un-intervened fill per run of the document, resumed and not (each two windows of
    # the base rows), and no trace over the counterfactual's own rows in either.
    assert len(unintervened) == 2
    assert seen and not _ran_on(seen, _counterfactual_ids(kit, oracle, resolved, rows), 3)
    _same(got, want)
    # Windows of 3 rows sum in another order than the hook loop's 4-row batch
    # (docs/reliability.md, "What repeats"): 1e-5 on logits of about 10.
    assert _block0_diffs(got) == pytest.approx(_hooked_diffs(kit, oracle, resolved, rows),
                                               abs=1e-5)


def _fitted_alike(got: dict, want: dict) -> None:
    """The same fit up to float rounding: an update runs the last column alone over kept keys
    and values (engine/tail.py), which sums in another order than the whole forward, and
    AdamW carries that through the updates. Measured on the four families: losses within
    7e-8 relative, the fitted projection within 1.1e-5, table values within 1e-7; the
    bounds below leave a margin of 10x or more for another CPU's kernels."""
    assert got.keys() == want.keys()
    for key in got:
        if key.endswith(".safetensors"):
            assert got[key].keys() == want[key].keys(), key
        elif key != "document.json":
            found, expected = json.loads(got[key]), json.loads(want[key])
            assert [{**r, "value": None} for r in found] == [{**r, "value": None} for r in expected]
            assert max(abs(a["value"] - b["value"]) for a, b in zip(found, expected)) <= 1e-5, key
    torch.testing.assert_close(got["train_loss.safetensors"]["weight"],
                               want["train_loss.safetensors"]["weight"], rtol=1e-5, atol=1e-5)
    # The fitted subspace, not its parametrization: AdamW may move the directions the
    # Cayley map ignores by whole steps on rounding noise (docs/reliability.md, "What repeats").
    basis, other = (files["rot.safetensors"]["basis"] for files in (got, want))
    torch.testing.assert_close(basis @ basis.T, other @ other.T, rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2"])
@pytest.mark.parametrize("pairs,batch_size", [(16, None), (8, None), (8, 5)],
                         ids=["whole-batch", "minibatch", "minibatch-in-windows-of-5"])
def test_a_das_fit_runs_each_update_at_the_last_column_and_fits_what_the_full_forward_fits(
        family, pairs, batch_size, tiny, tmp_path, monkeypatch, resumed, request):
    document = _das(_resolved(family, tiny, request))
    fit = document["steps"]["fit"]
    fit.update(pairs=pairs, rows={"base": "weekdays_full/data", "counterfactual": "weekdays_full/data"})
    fit["optimizer"]["lr"] = 1e-2
    last = []
    monkeypatch.setattr(runner, "run_trace", _counted(runner.run_trace, last,
                                                    when=lambda model, job, live: job.tail))
    got, want = _both(document, tmp_path, monkeypatch, str(REPO / "documents" / "data"),
                      batch_size)
    updates = -(-42 // pairs) * 2
    assert got["train_loss.safetensors"]["weight"].numel() == updates
    # Every update and both held-out evals ran at the last column, resumed, one trace per
    # window of rows (the keys kept in windows of 5, an update's rows taken across them);
    # the score step (other rows, nothing kept for them) ran whole.
    # In windows of 5: per epoch five updates of 8 rows in two traces and one of 2 in one.
    traces = updates + 2 if batch_size is None else 2 * (5 * 2 + 1) + 2
    assert len(last) == resumed["resumed"] == traces
    _fitted_alike(got, want)


def _counted(function, calls: list, when=lambda *args, **kwargs: True):
    def counted(*args, **kwargs):
        calls.extend([1] if when(*args, **kwargs) else [])
        return function(*args, **kwargs)
    return counted


def _residual_bytes(resolved, rows: list) -> int:
    """One kept residual of the rows' base prompts: rows x padded tokens x width, fp32."""
    from causalab.models import load_tokenizer

    ids = load_tokenizer(resolved.path)([r["input"] for r in rows], return_tensors="pt",
                                        padding=True)["input_ids"]
    width = json.loads((Path(resolved.path) / "config.json").read_text())["hidden_size"]
    return ids.shape[0] * ids.shape[1] * width * 4


def test_over_the_budget_the_deepest_entries_that_fit_are_kept(tiny, kit, tmp_path,
                                                               monkeypatch, resumed):
    """Room for two of the sweep's five values: the residual leaving block 0 and block 1's
    attention output serve attention_output[1] (the deepest entry that fits whole); the
    other points run from the start. Before, over the budget nothing was kept."""
    resolved = tiny("tiny-llama")
    rows = kit.pair_rows()
    data_root = kit.write_table(tmp_path / "data", "pairs", rows)
    monkeypatch.setattr(cache_module, "RESUME_BUDGET", 2 * _residual_bytes(resolved, rows))
    kept = []
    original = planner.kept_prefixes

    def spy(*args, **kwargs):
        found = original(*args, **kwargs)
        kept.append(sorted(map(str, found)))
        return found
    monkeypatch.setattr(planner, "kept_prefixes", spy)
    got, want = _both(_sweep(resolved), tmp_path, monkeypatch, data_root)
    assert kept[0] == ["(1, 'attention')", "0"], kept
    assert resumed["resumed"] == 1
    _same(got, want)


def test_kept_keys_are_charged_at_the_key_width_under_grouped_query_attention(
        tiny, tmp_path, monkeypatch):
    """tiny-qwen2 keeps 2 key heads for 4 query heads: a DAS fit's kept keys and values are
    charged what they hold (at most one column more per row), not twice that."""
    from causalab.engine import tail

    resolved = tiny("tiny-qwen2")
    config = json.loads((Path(resolved.path) / "config.json").read_text())
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    charged, held = [], []
    room, joined = cache_module.DocumentCache.prefix_room, tail.Keys.joined.__func__

    def charging(self, batch, layers, width):
        charged.append((len(batch.input_ids), batch.tokens, layers, width))
        return room(self, batch, layers, width)

    def holding(cls, caches):
        keys = joined(cls, caches)
        held.append(sum(t.numel() * 4 for pair in keys.layers for t in pair))
        return keys
    monkeypatch.setattr(cache_module.DocumentCache, "prefix_room", charging)
    monkeypatch.setattr(tail.Keys, "joined", classmethod(holding))
    monkeypatch.chdir(REPO)
    document = _das(resolved)
    document["steps"]["fit"].update(pairs=16, rows={"base": "weekdays_full/data",
                                                    "counterfactual": "weekdays_full/data"})
    run_document(document, out=str(tmp_path / "out"), data_root=str(REPO / "documents" / "data"))
    layers = config["num_hidden_layers"]
    keys = [c for c in charged if c[2] == 2 * layers]  # the fit's rows, the held-out rows
    assert len(keys) == len(held) == 2
    for (rows, tokens, _, width), size in zip(keys, held):
        assert size <= rows * tokens * width * 4 * 2 * layers <= size * tokens / (tokens - 1)


def test_the_resume_budget_is_the_user_s_to_set(tiny, kit, tmp_path, monkeypatch, resumed):
    """``resume_mib`` (``--resume-mib``, ``run.resume_mib``): 0 keeps nothing and no trace
    resumes, 1 MiB holds this sweep's values; the tables are the same bytes either way."""
    from causalab.errors import UsageError

    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = _sweep(tiny("tiny-llama"))
    monkeypatch.chdir(REPO)
    run_document(copy.deepcopy(document), out=str(tmp_path / "off"), data_root=data_root,
                 resume_mib=0)
    assert resumed["resumed"] == 0
    run_document(copy.deepcopy(document), out=str(tmp_path / "on"), data_root=data_root,
                 resume_mib=1)
    assert resumed["resumed"] == 4
    _same(_files(tmp_path / "on"), _files(tmp_path / "off"))
    with pytest.raises(UsageError) as refused:
        run_document(document, out=str(tmp_path / "bad"), data_root=data_root, resume_mib=-1)
    assert refused.value.path == ("--resume-mib",)
    assert not (tmp_path / "bad").exists()
