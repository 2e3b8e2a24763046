"""Benchmark: what MLflow tracking costs a patching sweep, against MLflow's own client.

The medium patching sweep: a Llama-shaped model (d=256, 4 layers, random weights from a fixed
seed, the built-in weekday tokenizer) over 42 weekday pairs, 8 points (block_input at layers
0-3 × positions -1, -2). Untracked runs and tracked runs (a SQLite store in a temporary
folder, ``rerun`` so no point is skipped) alternate in this process after a warm-up of each,
every sample shown. A tracked run's time is until everything is stored (``run_document``
returns, then ``events.wait()``). What tracking adds (tracked minus untracked, medians) is
set against a bare ``MlflowClient`` writing the same runs and files in the same process, as
a hand-written script would: per point a run with the tags the tracked one got, one
``log_batch`` of its params and numbers, each of its files, its end; the parent with its
params, numbers, tags and files (its sweep plot drawn again) and the experiment's saved
view, all as the tracked sweep stored them (read from its store after a warm-up). What
tracking adds over it is its guarantees: claims, the read-back before FINISHED, the
ranking read from the points' tables. The bare client writes each point as it ends, inside
an untracked run, and its cost is that run over the untracked one: tracking's cost is
measured the same way, between the model's forwards (target: tracking until stored ≤ 1.2×
the bare client). The same writes back to back after a run are shown beside it. Then what a
user waits for: the same sweep as fresh ``causalab run`` processes, tracked and not, beside a
fresh process that only imports MLflow and opens the store (``--cli-samples``, 0 leaves it
out). Then a real size:
SmolLM2's 30-layer END residual sweep over 120 IOI rows (``scripts/bench/smollm2.py``'s
document), where tracking until stored is given as a share of the untracked wall (target
≤ 5 %; ``--smollm2-samples``, 0 leaves it out).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/tracking.py [--samples 5] [--cli-samples 3]
        [--smollm2-samples 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

# Every store here is the bench's own, in a temporary folder: a tracking URI set for the
# user's work would otherwise take the tracked runs (it wins over a configured one).
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CAUSALAB_QUIET", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mlflow.entities import Metric, Param  # noqa: E402

from causalab.tracking.artifacts import listing  # noqa: E402
from causalab.tracking.landing import VIEW_TAG  # noqa: E402


def _medium_model(folder: Path) -> str:
    """A d=256, 4-layer Llama with the weekday tokenizer, saved as a local checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from causalab.models import resolve

    tokenizer_dir = Path(resolve("causalab:tiny-llama").path)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4,
                         vocab_size=_vocab(tokenizer_dir), max_position_embeddings=128)
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in os.listdir(tokenizer_dir):
        if "token" in name or name == "special_tokens_map.json":
            shutil.copy(tokenizer_dir / name, folder / name)
    return str(folder)


def _revision(path: str) -> str:
    from causalab.models import resolve

    return resolve(path).revision


def _vocab(tokenizer_dir: Path) -> int:
    from causalab.models import load_tokenizer

    return len(load_tokenizer(str(tokenizer_dir)))


def _document(path: str) -> dict:
    target = {"component": "block_input", "layers": {"sweep": [[0], [1], [2], [3]], "as": "layer"}}
    pos = {"sweep": [-1, -2], "as": "pos"}
    return {
        "model": {"key": path, "revision": _revision(path), "dtype": "fp32"},
        "roles": {"base": {"field": "input"},
                  "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": target, "head": {"component": "lm_head"}},
        "interventions": {"patch": {
            "reads": {"v_cf": {"site": "target", "pos": pos, "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": {"site": "target", "pos": pos, "mechanism": "swap",
                                 "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits",
                                       "a": "cf_answer", "b": "base_answer"},
                        "iia": {"kind": "match", "of": "logits", "expected": "cf_answer"}},
        }},
        "steps": {"test": {"kind": "observe", "interventions": "patch",
                           "rows": {"base": "weekdays_full/data",
                                    "counterfactual": "weekdays_full/data"},
                           "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"},
                                     {"value": "iia", "file_path": "iia.json"}]}},
    }


def _once(document: dict, out: str, uri: str | None, data_root: str) -> tuple[float, float]:
    """``(until run_document returns, until MLflow has stored the runs too)``."""
    from causalab.pipeline import run_document
    from causalab.tracking import TrackingEvents

    events = None
    if uri is not None:
        events = TrackingEvents(tracking_uri=uri, experiment="bench", rerun=True, out=out)
    start = time.perf_counter()
    run_document(document, out=out, data_root=data_root, events=events)
    returned = time.perf_counter() - start
    if events is not None:
        events.wait()
    return returned, time.perf_counter() - start


class _Stored(NamedTuple):
    """One run as the tracked sweep stored it: what a bare client writes again."""

    params: dict
    metrics: dict
    tags: dict
    files: dict  # artifact path -> bytes


# Tags MLflow sets itself, or that name another run: the bare client's runs get their own.
_OWN_TAGS = ("mlflow.parentRunId", "mlflow.user", "mlflow.source.name", "mlflow.source.type",
             "mlflow.source.git.commit")


def _stored(client, run) -> _Stored:
    files = {path: Path(client.download_artifacts(run.info.run_id, path)).read_bytes()
             for path in listing(client, run.info.run_id)}
    tags = {k: v for k, v in run.data.tags.items() if k not in _OWN_TAGS}
    return _Stored(dict(run.data.params), dict(run.data.metrics), tags, files)


def _stored_sweep(uri: str) -> dict:
    """The newest tracked sweep as stored: ``{"points": {label: _Stored}, "parent":
    _Stored, "view": its saved view}``."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("bench").experiment_id
    parent = client.search_runs([experiment], "tags.`causalab.kind` = 'sweep'",
                                order_by=["attributes.start_time DESC"], max_results=1)[0]
    runs = client.search_runs([experiment],
                              f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    view = client.get_experiment(experiment).tags[f"{VIEW_TAG}{parent.info.run_id}"]
    return {"points": {run.data.tags["causalab.point"]: _stored(client, run)
                       for run in sorted(runs, key=lambda run: run.data.tags["causalab.point"])},
            "parent": _stored(client, parent), "view": view}


class _Bare:
    """A bare MLflow client writing the same runs and files as the tracked sweep stored,
    as a hand-written script would: per point a run with the same tags, one ``log_batch``
    of its params and numbers, each of its files, its end; then the parent with its params,
    numbers, tags and files (the sweep's plot drawn with matplotlib, causalab's plot
    function, the same picture) and the experiment's saved view. ``same``: the sweep as
    :func:`_stored_sweep` read it. No read-back, no claims: what tracking adds is those."""

    def __init__(self, client, experiment_id: str, out: Path, same: dict, title: str):
        self.client, self.experiment_id, self.out, self.title = client, experiment_id, out, title
        self.same = same
        self.parent: str | None = None
        self.drawn: list = []

    def start(self) -> None:
        parent = self.same["parent"]
        self.parent = self.client.create_run(self.experiment_id, tags=parent.tags).info.run_id
        self.client.log_batch(self.parent, params=[Param(k, v) for k, v in parent.params.items()])

    def _files(self, run_id: str, files: dict, folder: Path) -> None:
        """Each of ``files`` logged from where the run wrote it (``folder``, else the run's
        own folder: ``run.json``), else from its stored bytes written out (the parent's
        ranking and table, the plot drawn here)."""
        with tempfile.TemporaryDirectory() as spare:
            for path, body in files.items():
                local = next((place for place in (folder / path, self.out / path)
                              if place.is_file()), None)
                if local is None:
                    local = Path(spare, path)
                    local.parent.mkdir(parents=True, exist_ok=True)
                    local.write_bytes(body)
                inside = str(Path(path).parent)
                self.client.log_artifact(run_id, str(local), None if inside == "." else inside)

    def point(self, label: str) -> None:
        stored = self.same["points"][label]
        run = self.client.create_run(self.experiment_id, tags={
            **stored.tags, "mlflow.parentRunId": self.parent}).info.run_id
        now = int(time.time() * 1000)
        self.client.log_batch(run, metrics=[Metric(k, v, now, 0)
                                            for k, v in stored.metrics.items()],
                              params=[Param(k, v) for k, v in stored.params.items()])
        self._files(run, stored.files, self.out / label)
        self.client.set_terminated(run, "FINISHED")
        self.drawn.append(({k: json.loads(v) for k, v in stored.params.items()
                            if k in ("layer", "pos")}, stored.metrics))

    def end(self) -> None:
        from causalab.plots import curves as plots

        parent = self.same["parent"]
        now = int(time.time() * 1000)
        self.client.log_batch(self.parent, metrics=[Metric(k, v, now, 0)
                                                    for k, v in parent.metrics.items()])
        drawn = plots.sweep_plots(self.drawn, title=self.title)
        self._files(self.parent, {path: body for path, body in parent.files.items()
                                  if path not in drawn} | drawn, self.out)
        self.client.set_experiment_tag(self.experiment_id, f"{VIEW_TAG}{self.parent}",
                                       self.same["view"])
        self.client.set_terminated(self.parent, "FINISHED")


def _bare_after(bare: _Bare) -> float:
    """The bare client's writes back to back, after an untracked run wrote ``bare.out``."""
    start = time.perf_counter()
    bare.start()
    for label in bare.same["points"]:
        bare.point(label)
    bare.end()
    return time.perf_counter() - start


def _bare_during(document: dict, bare: _Bare, data_root: str) -> float:
    """An untracked run whose points the bare client writes as each one ends, as a script
    that tracks its own loop would: until run_document returns, with everything stored."""
    from causalab.engine.events import Events
    from causalab.pipeline import run_document

    class Writes(Events):
        def run_start(self, document: dict, points: list) -> None:
            bare.start()

        def point_end(self, point, written: list[str], error: BaseException | None) -> None:
            bare.point(point.name)

        def run_end(self, written: list[str]) -> None:
            bare.end()

    start = time.perf_counter()
    run_document(document, out=str(bare.out), data_root=data_root, events=Writes())
    return time.perf_counter() - start


def _ratio(label: str, document: dict, data_root: str, samples: int, tmp: str,
           bare: bool = False) -> None:
    """Untracked and tracked runs alternated after a warm-up of each; medians printed. With
    ``bare``, a bare MLflow client writing the same runs and files too, two ways: as each
    point ends, inside an untracked run (the cost over that run is set against tracking's:
    both pay for writing between the model's forwards), and back to back after a run."""
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = None
    if bare:
        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp}/bare.db")
        bare_id = client.create_experiment("bare", artifact_location=f"file://{tmp}/bare")
    _once(document, f"{tmp}/{label}-warm-u", None, data_root)
    _once(document, f"{tmp}/{label}-warm-t", uri, data_root)
    if client is not None:
        same = _stored_sweep(uri)
        _bare_after(_Bare(client, bare_id, Path(f"{tmp}/{label}-warm-u"), same, label))
        _bare_during(document, _Bare(client, bare_id, Path(f"{tmp}/{label}-warm-b"), same,
                                     label), data_root)
    untracked, stored, during, after = [], [], [], []
    for index in range(samples):
        untracked.append(_once(document, f"{tmp}/{label}-u{index}", None, data_root)[0])
        stored.append(_once(document, f"{tmp}/{label}-t{index}", uri, data_root)[1])
        if client is not None:
            during.append(_bare_during(document, _Bare(
                client, bare_id, Path(f"{tmp}/{label}-b{index}"), same, label), data_root))
            after.append(_bare_after(_Bare(client, bare_id, Path(f"{tmp}/{label}-u{index}"),
                                           same, label)))
    print(label)
    for name, found in (("untracked", untracked), ("stored   ", stored),
                        ("bare run ", during), ("bare after", after)):
        if found:
            shown = " ".join(f"{value:.3f}" for value in found)
            print(f"{name} s: {shown}  median {statistics.median(found):.3f}")
    base = statistics.median(untracked)
    added = statistics.median(stored) - base
    print(f"tracking until stored: {added:+.3f} s over untracked, "
          f"{100 * added / base:.1f} % of the untracked wall")
    if during:
        floor = statistics.median(during) - base
        print(f"a bare MlflowClient writing the same runs and files as each point ends: "
              f"{floor:+.3f} s over untracked; tracking until stored / bare client "
              f"{added / floor:.2f} (target <= 1.2)")
        print(f"the same writes back to back after a run: {statistics.median(after):.3f} s "
              f"(tracking / that {added / statistics.median(after):.2f})")


def _cli_once(command: list[str]) -> float:
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def _fresh_processes(document: dict, data_root: str, samples: int, tmp: str) -> None:
    """Fresh ``causalab run`` processes of the sweep, untracked and tracked alternated after a
    warm-up of each, and a fresh process that imports MLflow and opens the same store."""
    path = Path(tmp, "sweep.json")
    path.write_text(json.dumps(document))
    uri = f"sqlite:///{tmp}/cli.db"
    run = [sys.executable, "-m", "causalab", "run", str(path), "--data-root", data_root]
    ways = {"untracked": run + ["--no-track"],
            "tracked": run + ["--tracking-uri", uri, "--rerun"],
            "mlflow only": [sys.executable, "-c", "from mlflow import MlflowClient; "
                            f"MlflowClient({uri!r}).search_experiments()"]}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for index in range(samples + 1):
        for name, command in ways.items():
            out = [] if name == "mlflow only" else ["--out", f"{tmp}/cli-{name}{index}"]
            spent = _cli_once(command + out)
            if index:  # the first round warms the page cache and creates the store
                times[name].append(spent)
    medians = {name: statistics.median(spent) for name, spent in times.items()}
    print(f"fresh processes (medians of {samples}): "
          + ", ".join(f"{name} {value:.2f} s" for name, value in medians.items())
          + f"; tracked - untracked {medians['tracked'] - medians['untracked']:+.2f} s, "
          f"ratio {medians['tracked'] / medians['untracked']:.2f} with everything stored "
          f"(importing MLflow and opening its store: {medians['mlflow only']:.2f} s)")


def _smollm2_sweep(tmp: str) -> tuple[dict, str]:
    """SmolLM2's 30-layer END residual sweep over the 120 IOI rows, and its data root."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import smollm2

    from causalab.models import resolve

    rows = json.loads((ROOT / "documents" / "data" / "ioi" / "data.json").read_text())[:120]
    Path(tmp, "pairs.json").write_text(json.dumps(rows))
    document = smollm2._document(resolve(smollm2.KEY).revision, "layers", list(range(30)), 9)
    return document, tmp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--cli-samples", type=int, default=3)
    parser.add_argument("--smollm2-samples", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="causalab-bench-tracking-") as tmp:
        document = _document(_medium_model(Path(tmp) / "medium"))
        _ratio("medium patching sweep: 8 points, 42 rows, d=256, 4 layers",
               document, str(ROOT / "documents" / "data"), args.samples, tmp, bare=True)
        if args.cli_samples:
            _fresh_processes(document, str(ROOT / "documents" / "data"), args.cli_samples, tmp)
        if args.smollm2_samples:
            document, data_root = _smollm2_sweep(tmp)
            _ratio("SmolLM2 30-layer END sweep: 30 points, 120 rows (target <= 5 %)",
                   document, data_root, args.smollm2_samples, tmp)


if __name__ == "__main__":
    main()
