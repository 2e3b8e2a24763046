"""The fit loop (docs/format.md §9.5) through a frozen plain-torch readout, with run_pass written here.

The "model" is a frozen linear readout whose logits depend only on a planted direction (or
on planted units). ``_Harness.run_pass`` plays the walk's part: it swaps the source rows into
the base rows through the live featurizer and scores cross entropy and argmax match against
the counterfactual label, returning ``{"metrics": {name: (values, rows)}}``. Numbers are
checked against computations written in the tests (the initial loss, the anneal schedule,
the planted direction), never against causalab itself.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from causalab.compile.plan import Fit, Pass
from causalab.engine.events import Events
from causalab.engine.featurizers.gate import Gate
from causalab.engine.featurizers.subspace import Subspace, cayley_basis
from causalab.engine.fit import anneal_temperature, run_fit
from causalab.errors import RunError

D = 8


def _pass(rows: int, name: str) -> Pass:
    return Pass(intervention=name, rows=rows, example_ids=tuple(str(i) for i in range(rows)),
                inputs={}, forwards=(), metrics=())


def _batches(rows: int, pairs: int, epochs: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator).tolist()
        out.append(tuple(tuple(order[i:i + pairs]) for i in range(0, rows, pairs)))
    return tuple(out)


def _fit(params=("rot",), objective=((1.0, "ce"),), epochs=6, rows=32, pairs=8, lr=0.05,
         patience=3, mode="max", metric="iia", anneal=None) -> Fit:
    return Fit(name="fit", train=_pass(rows, "train"), batches=_batches(rows, pairs, epochs),
               eval=_pass(16, "eval"), params=params, objective=objective, epochs=epochs, pairs=pairs,
               seed=0, lr=lr, weight_decay=0.0, early_stop_metric=metric, early_stop_mode=mode,
               patience=patience, anneal=anneal or {})


class _Harness:
    """Base/source rows, a frozen readout, and the walk's run_pass for one featurizer."""

    def __init__(self, fit: Fit, readout: torch.Tensor, name: str = "rot"):
        self.fit, self.readout, self.name = fit, readout, name
        self.model = torch.nn.Linear(D, 2, bias=False)
        with torch.no_grad():
            self.model.weight.copy_(readout.T)
        self.model.requires_grad_(False)
        self.data = {}
        for key, rows, seed in (("train", fit.train.rows, 1), ("eval", fit.eval.rows, 2)):
            g = torch.Generator().manual_seed(seed)
            base, source = torch.randn(rows, D, generator=g), torch.randn(rows, D, generator=g)
            # push each source row off the decision boundary, so the label is not a coin flip
            boundary = readout[:, 0] - readout[:, 1]
            if boundary.norm() > 0:
                boundary = boundary / boundary.norm()
                source = source + torch.sign(source @ boundary)[:, None] * boundary
            truth = source @ readout  # the readout sees only the planted part
            self.data[key] = (base, source, truth.argmax(-1))
        self.calls = []
        self.eval_override = None

    def run_pass(self, model, pass_, state, *, rows=None, grad=False):
        key = "train" if pass_ is self.fit.train else "eval"
        base, source, label = self.data[key]
        index = torch.arange(len(base)) if rows is None else torch.tensor(rows)
        featurizer = state[self.name]
        self.calls.append({"key": key, "grad": grad, "training": featurizer.training,
                           "T": getattr(featurizer, "T", None), "weight": featurizer.weight.detach().clone(),
                           "grad_enabled": torch.is_grad_enabled()})
        f_source, _ = featurizer.featurize(source[index])
        f_base, err = featurizer.featurize(base[index])
        logits = model(featurizer.inverse(f_source, err, base[index]))
        ce = torch.nn.functional.cross_entropy(logits, label[index], reduction="none")
        iia = (logits.argmax(-1) == label[index]).float()
        if key == "eval" and self.eval_override is not None:
            iia = torch.full_like(iia, self.eval_override(len([c for c in self.calls if c["key"] == "eval"])))
        return SimpleNamespace(metrics={"ce": (ce, index.tolist()), "iia": (iia, index.tolist())},
                               rows=None)

    def run(self, featurizer, events=None):
        return run_fit(self.fit, self.model, {self.name: featurizer}, {self.name: featurizer},
                       run_pass=self.run_pass, events=events or Events(), point="p")


def _planted_direction() -> torch.Tensor:
    v = torch.randn(D, generator=torch.Generator().manual_seed(42))
    return v / v.norm()


def _subspace(seed=0) -> Subspace:
    subspace = Subspace.draw(D, 1, seed)
    subspace.weight.requires_grad_(True)
    return subspace


def test_a_das_fit_through_a_frozen_readout_finds_the_planted_direction():
    v = _planted_direction()
    fit = _fit(epochs=10, lr=0.1, patience=10, rows=128, pairs=32)
    harness = _Harness(fit, torch.stack([v, -v], 1) * 4)
    subspace = _subspace()
    start = abs(float(subspace.basis.detach()[:, 0] @ v))
    results = harness.run(subspace)
    assert start < 0.5 < 0.9 < abs(float(subspace.basis.detach()[:, 0] @ v))
    assert results["train/eval"][-1, 0].item() == 1.0
    assert results["train/loss"].shape == (10 * 4,)
    assert results["train/loss"][-1] < results["train/loss"][0] / 10
    assert results["train/eval"].shape == (10, 1)
    assert harness.model.weight.grad is None


def test_the_first_recorded_loss_is_the_objective_at_the_initial_draw():
    v = _planted_direction()
    fit = _fit(objective=((2.0, "ce"), (-0.5, "iia")), epochs=1)
    harness = _Harness(fit, torch.stack([v, -v], 1) * 4)
    start = Subspace.draw(D, 1, 0).basis[:, 0]
    base, source, label = harness.data["train"]
    rows = list(fit.batches[0][0])
    patched = base[rows] + ((source[rows] - base[rows]) @ start)[:, None] * start[None, :]
    logits = patched @ harness.readout
    expected = (2.0 * torch.nn.functional.cross_entropy(logits, label[rows])
                - 0.5 * (logits.argmax(-1) == label[rows]).float().mean())
    results = harness.run(_subspace())
    assert results["train/loss"][0].item() == pytest.approx(expected.item(), abs=1e-5)


def test_training_is_set_for_updates_and_cleared_for_the_eval_pass_and_after():
    v = _planted_direction()
    fit = _fit(epochs=2, patience=5)
    harness = _Harness(fit, torch.stack([v, -v], 1))
    subspace = _subspace()
    harness.run(subspace)
    updates = [c for c in harness.calls if c["key"] == "train"]
    evals = [c for c in harness.calls if c["key"] == "eval"]
    assert len(updates) == 8 and all(c["training"] and c["grad"] and c["grad_enabled"] for c in updates)
    assert len(evals) == 2 and not any(c["training"] or c["grad"] or c["grad_enabled"] for c in evals)
    assert not subspace.training and not subspace.weight.requires_grad


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_fit_stops_after_patience_epochs_without_strict_improvement(mode):
    v = _planted_direction()
    fit = _fit(epochs=10, patience=2, mode=mode)
    harness = _Harness(fit, torch.stack([v, -v], 1))
    harness.eval_override = lambda epoch: 0.5  # equal is not better
    results = harness.run(_subspace())
    assert results["train/eval"].shape == (3, 1)
    assert results["train/loss"].shape == (3 * 4,)
    assert torch.equal(results["train/eval"][:, 0], torch.full((3,), 0.5))


def test_parameters_stay_as_the_last_update_left_them_with_no_rollback():
    v = _planted_direction()
    fit = _fit(epochs=10, patience=2)
    harness = _Harness(fit, torch.stack([v, -v], 1))
    harness.eval_override = lambda epoch: 1.0 / epoch  # best at the first epoch, then worse
    subspace = _subspace()
    results = harness.run(subspace)
    evals = [c for c in harness.calls if c["key"] == "eval"]
    assert results["train/eval"].shape[0] == 3
    assert torch.equal(subspace.weight.detach(), evals[-1]["weight"])
    assert not torch.equal(subspace.weight.detach(), evals[0]["weight"])


def test_the_annealed_temperature_follows_the_documented_geometric_schedule():
    readout = torch.zeros(D, 2)
    readout[0, 0], readout[3, 1] = 3.0, 3.0
    fit = _fit(params=("g",), objective=((1.0, "ce"), (0.01, "g.mask")), epochs=1, rows=40, pairs=2,
               patience=5, anneal={"g": (1.0, 0.05)})
    harness = _Harness(fit, readout, name="g")
    gate = Gate(torch.zeros(D, requires_grad=True))
    harness.run(gate)
    temperatures = [c["T"] for c in harness.calls if c["key"] == "train"]
    assert len(temperatures) == 20
    assert [round(temperatures[u - 1], 3) for u in (1, 5, 10, 15, 20)] == [1.000, 0.532, 0.242, 0.110, 0.050]
    assert [round(anneal_temperature(1.0, 0.05, u - 1, 20), 3) for u in (1, 5, 10, 15, 20)] == \
        [1.000, 0.532, 0.242, 0.110, 0.050]
    assert anneal_temperature(2.0, 0.5, 0, 1) == 2.0


def test_a_gate_fit_keeps_the_planted_units_and_reports_the_kept_fraction():
    readout = torch.zeros(D, 2)
    readout[0, 0], readout[3, 1] = 3.0, 3.0
    fit = _fit(params=("g",), objective=((1.0, "ce"), (0.05, "g.mask")), epochs=8, lr=0.2, patience=8)
    harness = _Harness(fit, readout, name="g")
    gate = Gate(torch.zeros(D, requires_grad=True))
    results = harness.run(gate)
    assert gate.hard_mask().nonzero().flatten().tolist() == [0, 3]
    assert results["train/eval"].shape == (8, 2)
    assert results["train/eval"][-1, 1].item() == pytest.approx(2 / D)
    assert results["train/eval"][-1, 0].item() == 1.0


def test_a_mask_term_enters_the_loss_as_the_mean_of_the_soft_mask():
    readout = torch.zeros(D, 2)
    fit = _fit(params=("g",), objective=((0.0, "ce"), (3.0, "g.mask")), epochs=1)
    harness = _Harness(fit, readout, name="g")
    results = harness.run(Gate(torch.zeros(D, requires_grad=True)))
    assert results["train/loss"][0].item() == pytest.approx(1.5)
    assert results["train/loss"][-1].item() < 1.5


class _Recorder(Events):
    def __init__(self):
        self.updates, self.epochs = [], []

    def fit_update(self, point, step, update, loss):
        self.updates.append((point, step, update, loss))

    def fit_epoch(self, point, step, epoch, eval_mean, kept):
        self.epochs.append((point, step, epoch, eval_mean, kept))


def test_every_update_and_epoch_is_reported_to_the_listener():
    v = _planted_direction()
    fit = _fit(epochs=2, patience=5)
    harness = _Harness(fit, torch.stack([v, -v], 1))
    recorder = _Recorder()
    results = harness.run(_subspace(), events=recorder)
    assert [u[2] for u in recorder.updates] == list(range(8))
    assert [u[3] for u in recorder.updates] == pytest.approx(results["train/loss"].tolist())
    assert [(e[0], e[1], e[2], e[4]) for e in recorder.epochs] == [("p", "fit", 0, None), ("p", "fit", 1, None)]
    assert [e[3] for e in recorder.epochs] == pytest.approx(results["train/eval"][:, 0].tolist())
    assert len(results["updates"]) == 8 and len(results["evals"]) == 2
    assert not results["updates"][0]["metrics"]["ce"][0].requires_grad


def test_an_update_with_no_eligible_row_is_refused():
    v = _planted_direction()
    fit = _fit(epochs=1)
    harness = _Harness(fit, torch.stack([v, -v], 1))

    def empty(model, pass_, state, *, rows=None, grad=False):
        return SimpleNamespace(metrics={"ce": (torch.zeros(0), []), "iia": (torch.zeros(0), [])},
                               rows=None)

    with pytest.raises(RunError):
        run_fit(fit, harness.model, {"rot": _subspace()}, {}, run_pass=empty, events=Events(), point=None)


# --- the fit loop on a real checkpoint, through the real walk -------------------------------

def _das_document(epochs: int, lr: float) -> dict:
    from causalab.document import load_json

    raw = load_json("documents/v2/das.json")
    raw["steps"]["fit"].update(epochs=epochs, optimizer={"name": "adamw", "lr": lr})
    raw["steps"]["fit"]["early_stop"]["patience"] = epochs
    return raw


def _hooked_loss(hf_model, fit: Fit, rows, weight: torch.Tensor) -> torch.Tensor:
    """Oracle: swap the cf's last-token block-0 output into the base run in span Q, plain hooks."""
    import torch.nn.functional as F

    def batch(role):
        prompts = fit.train.inputs[role]
        ids = torch.tensor([prompts.input_ids[r] for r in rows])
        mask = torch.tensor([prompts.attention_mask[r] for r in rows])
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    layer = hf_model.model.layers[0]
    captured = {}

    def keep(module, args, output):
        captured["cf"] = (output[0] if isinstance(output, tuple) else output)[:, -1].detach()

    handle = layer.register_forward_hook(keep)
    try:
        ids, mask, positions = batch("counterfactual")
        hf_model(input_ids=ids, attention_mask=mask, position_ids=positions)
    finally:
        handle.remove()
    q = cayley_basis(weight)

    def swap(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        base = hidden[:, -1]
        patched = base + ((captured["cf"] - base) @ q) @ q.T
        hidden = torch.cat([hidden[:, :-1], patched[:, None]], dim=1)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = layer.register_forward_hook(swap)
    try:
        ids, mask, positions = batch("base")
        logits = hf_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    finally:
        handle.remove()
    ce = next(m for m in fit.train.metrics if m.name == "ce")
    target = torch.tensor([ce.token_ids[0][r] for r in rows])
    return F.cross_entropy(logits.float(), target)


def test_a_real_das_fit_records_the_losses_a_hooked_oracle_computes(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    import causalab.compile
    from causalab.engine.featurizers import build_featurizer
    from causalab.pipeline import run_document

    raw = _das_document(epochs=2, lr=0.01)
    plan = causalab.compile.compile_document(raw, data_root="documents/data")
    fit = next(node for node in plan.children if isinstance(node, Fit))
    spec = next(node for node in plan.children if type(node).__name__ == "Featurizers").featurizers[0]
    run_document(raw, out=str(tmp_path), data_root="documents/data")
    losses = load_file(str(tmp_path / "train_loss.safetensors"))["weight"]
    assert losses.shape == (sum(len(epoch) for epoch in fit.batches),)

    hf_model = AutoModelForCausalLM.from_pretrained(plan.model.path, dtype=torch.float32).eval()
    hf_model.requires_grad_(False)
    weight = Subspace.draw(spec.d, spec.k, spec.seed).weight.requires_grad_(True)
    optimizer = torch.optim.AdamW([weight], lr=0.01, weight_decay=0.0)
    for update, rows in enumerate(fit.batches[0] + fit.batches[1]):
        loss = _hooked_loss(hf_model, fit, list(rows), weight)
        assert losses[update].item() == pytest.approx(loss.item(), abs=1e-5), update
        torch.autograd.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    exported = build_featurizer(
        type(spec)(**{**vars(spec), "file_path": str(tmp_path / "rot.safetensors")}), "cpu")
    # Compare bases, not weights: the diagonal of W's top k×k block has no effect on Q (only
    # the skew part of that block enters A), so its gradient is rounding noise that Adam's
    # per-entry scaling turns into steps that differ run to run, harmlessly.
    assert torch.allclose(exported.basis, cayley_basis(weight.detach()), atol=1e-5)


def test_a_real_gate_fit_saves_the_watched_mean_and_the_kept_fraction_per_epoch(tmp_path):
    from safetensors.torch import load_file

    from causalab.document import load_json
    from causalab.pipeline import run_document

    raw = load_json("documents/v2/dbm.json")
    fit_step = raw["steps"]["fit"]
    fit_step.update(epochs=3, objective=[[1.0, "ce"], [0.05, "mask.mask"]])
    fit_step["early_stop"]["patience"] = 3
    run_document(raw, out=str(tmp_path), data_root="documents/data")
    table = load_file(str(tmp_path / "train_eval.safetensors"))["weight"]
    theta = load_file(str(tmp_path / "mask.safetensors"))["weight"]
    assert table.shape == (3, 2)
    assert table[-1, 1].item() == pytest.approx((theta > 0).float().mean().item())
    heldout = [row["value"] for row in json.loads((tmp_path / "heldout_ce.json").read_text())]
    assert sum(heldout) / len(heldout) == pytest.approx(table[-1, 0].item(), abs=1e-5)
