"""What is byte-identical between two runs, and what is only bounded (docs/format.md §12).

Byte-identical: the same document, on the same machine, with the same ``--batch-size``: every
metric table, tensor save and ``run.json``. Bounded: another ``--batch-size`` sums each matrix
product over other rows, so observe tables move in the last bits; they agree to 1e-5 (2e-8 to
4e-6 measured on the tiny Llama and the weekday layer sweep). Not bounded: a fit's trajectory.
The first update sees the same weights, so its loss agrees like an observe table; after it,
AdamW divides each gradient by its running norm, and a component that is rounding noise (the
part of W the Cayley map ignores) is scaled up to a full step, so later updates, W and, on a
long fit, the science may differ. Across machines nothing is byte-identical (another CPU
rounds differently); tests of shipped artifacts compare the science to a tolerance.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from causalab.pipeline import run_document

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "documents" / "v2"
DATA = str(REPO / "documents" / "data")
# Observe tables under another --batch-size: 2e-8 (patching) to 3.8e-6 (a layer sweep) seen.
WINDOWED = 1e-5


def _run(name: str, out: Path, batch_size: int | None = None) -> Path:
    document = json.loads((CORPUS / f"{name}.json").read_text())
    run_document(document, out=str(out), batch_size=batch_size, device_map="cpu", data_root=DATA)
    return out


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _tables(out: Path) -> dict[str, list]:
    return {name: [row["value"] for row in json.loads(data)] for name, data in _files(out).items()
            if name.endswith(".json") and name.rsplit("/", 1)[-1] not in ("document.json", "run.json")}


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict:
    """head_patching (four points) run twice whole and once in windows of one row."""
    return {"whole": _run("head_patching", tmp_path_factory.mktemp("whole")),
            "again": _run("head_patching", tmp_path_factory.mktemp("again")),
            "ones": _run("head_patching", tmp_path_factory.mktemp("ones"), batch_size=1)}


def test_the_same_document_at_the_same_batch_size_writes_the_same_bytes(heads):
    first, second = _files(heads["whole"]), _files(heads["again"])
    assert len(first) > 8 and first.keys() == second.keys()
    assert [name for name in first if first[name] != second[name]] == []


def test_another_batch_size_moves_every_observe_value_by_at_most_1e_5(heads):
    whole, ones = _tables(heads["whole"]), _tables(heads["ones"])
    assert whole.keys() == ones.keys() and len(whole) == 8
    for name, values in whole.items():
        assert all(v is not None for v in values), name
        assert ones[name] == pytest.approx(values, abs=WINDOWED), name
    record = json.loads((heads["ones"] / "run.json").read_text())
    assert record["batch_size"] == 1


def test_a_fit_under_another_batch_size_agrees_on_its_first_update_and_its_shapes(tmp_path):
    whole = _run("das", tmp_path / "whole")
    ones = _run("das", tmp_path / "ones", batch_size=1)
    loss_whole = load_file(str(whole / "train_loss.safetensors"))["weight"]
    loss_ones = load_file(str(ones / "train_loss.safetensors"))["weight"]
    assert float(loss_ones[0]) == pytest.approx(float(loss_whole[0]), abs=WINDOWED)
    rot_whole = load_file(str(whole / "rot.safetensors"))["weight"]
    rot_ones = load_file(str(ones / "rot.safetensors"))["weight"]
    assert rot_whole.shape == rot_ones.shape == (16, 8)


def test_a_fit_run_twice_writes_the_same_bytes_its_featurizer_file_included(tmp_path):
    """The fitted rotation's safetensors file too: its metadata (model, site, digest) used to
    come out in another key order at every save."""
    first, second = (_files(_run("das", tmp_path / name)) for name in ("first", "second"))
    assert any(name.endswith(".safetensors") for name in first) and first.keys() == second.keys()
    assert [name for name in first if first[name] != second[name]] == []


@pytest.mark.slow
def test_a_fit_writes_the_same_rotation_whatever_torch_s_thread_count(tmp_path):
    """A fit on the CPU runs on one thread (engine/fit.py), so the thread count a machine
    gives torch (OMP_NUM_THREADS, its load) does not move the rotation's last bits, which the
    updates would amplify: the weekday Llama's rank-4 DAS (`make run`), the case that moved."""
    import torch

    document = json.loads((REPO / "documents" / "known" / "das.json").read_text())
    for name in ("rot", "random"):
        document["featurizers"][name]["k"] = 4
    before = torch.get_num_threads()
    written = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = tmp_path / str(threads)
            run_document(document, out=str(out), device_map="cpu", data_root=DATA)
            written[threads] = {name: data for name, data in _files(out).items()
                                if name.endswith(".safetensors")}
    finally:
        torch.set_num_threads(before)
    assert written[1].keys() == written[2].keys() and any("rot" in n for n in written[1])
    assert [name for name in written[1] if written[1][name] != written[2][name]] == []
