"""Benchmark: what MLflow tracking adds to a patching sweep (tracked / untracked wall time).

The medium patching sweep: a Llama-shaped model (d=256, 4 layers, random weights from a fixed
seed, the built-in weekday tokenizer) over 42 weekday pairs, 8 points (block_input at layers
0-3 × positions -1, -2). Untracked runs and tracked runs (a SQLite store in a temporary
folder, ``rerun`` so no point is skipped) alternate in this process after a warm-up of each;
the printed ``ratio`` is the median tracked time over the median untracked time (target
≤ 1.10), with every sample shown. A tracked run's time is ``run_document``'s: until its
tables and files are written, what a caller waits for before it has the numbers; MLflow
stores the runs in the background meanwhile. Beside it, the time until that is stored too
(``events.wait()`` returns), as a second ratio: what the CLI or a Hydra job waits for before
it exits.
Beside it, the floor no tracker built on MLflow's client can go under: the least a tracked
sweep writes (a parent run, then per point a run created, one ``log_batch`` of its params and
metrics, its end), sent by a bare ``MlflowClient`` to a store of its own, no files, no plots,
no causalab, timed in the same process and printed as a ratio to the untracked sweep, and
per point beside what tracking until stored adds per point (target: within 1.5x untracked,
or within 30 ms a point of the bare client). Then
what a user waits for: the same sweep as fresh ``causalab run`` processes, tracked and not,
beside a fresh process that only imports MLflow and opens the store (``--cli-samples``, 0
leaves it out). Then the same at a real size: SmolLM2's 30-layer END residual sweep over 120 IOI rows
(``scripts/bench/smollm2.py``'s document), where a point computes for seconds, not
milliseconds (``--smollm2-samples``, 0 leaves it out).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench/tracking.py [--samples 5] [--cli-samples 3]
        [--smollm2-samples 2]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Every store here is the bench's own, in a temporary folder: a tracking URI set for the
# user's work would otherwise take the tracked runs (it wins over a configured one).
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CAUSALAB_QUIET", "1")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _medium_model(folder: Path) -> str:
    """A d=256, 4-layer Llama with the weekday tokenizer, saved as a local checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from causalab.models import resolve

    tokenizer_dir = Path(resolve("causalab:tiny-llama").path)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=_vocab(tokenizer_dir),
                         max_position_embeddings=128)
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
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
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
                           "rows": {"base": "weekdays_full/data", "counterfactual": "weekdays_full/data"},
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


def _bare_store(client, experiment_id: str, points: int) -> float:
    """What a bare MLflow client takes to write the least a tracked sweep of ``points``
    writes: a parent, then per point a run, one ``log_batch`` (8 params, 4 metrics), its
    end; then the parent's end."""
    from mlflow.entities import Metric, Param

    start = time.perf_counter()
    parent = client.create_run(experiment_id, tags={"causalab.kind": "sweep"}).info.run_id
    for point in range(points):
        run = client.create_run(experiment_id, tags={"mlflow.parentRunId": parent,
                                                     "causalab.point": str(point)}).info.run_id
        now = int(time.time() * 1000)
        client.log_batch(run, metrics=[Metric(f"m{k}", 0.5, now, 0) for k in range(4)],
                         params=[Param(f"p{k}", "v") for k in range(8)])
        client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    return time.perf_counter() - start


def _stored_points(uri: str) -> list[tuple[str, dict, dict]]:
    """``(label, params, metrics)`` of the newest tracked sweep's points, from its store."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("bench").experiment_id
    parent = client.search_runs([experiment], "tags.`causalab.kind` = 'sweep'",
                                order_by=["attributes.start_time DESC"], max_results=1)[0]
    runs = client.search_runs([experiment],
                              f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return [(run.data.tags["causalab.point"], dict(run.data.params), dict(run.data.metrics))
            for run in sorted(runs, key=lambda run: run.data.tags["causalab.point"])]


def _bare_same(client, experiment_id: str, out: Path, points: list, title: str) -> float:
    """A bare MLflow client writing the same runs with the same content, as a hand-written
    script would: per point a run, one ``log_batch`` of its params and numbers, each file
    its folder in ``out`` holds, its end; then the parent's document and record and the
    sweep's plot, drawn with matplotlib (causalab's plot function, the same picture)."""
    import json

    from mlflow.entities import Metric, Param

    from causalab.plots import curves as plots

    start = time.perf_counter()
    parent = client.create_run(experiment_id, tags={"causalab.kind": "sweep"}).info.run_id
    drawn = []
    for label, params, metrics in points:
        run = client.create_run(experiment_id, tags={"mlflow.parentRunId": parent,
                                                     "causalab.point": label}).info.run_id
        now = int(time.time() * 1000)
        client.log_batch(run, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                         params=[Param(k, v) for k, v in params.items()])
        for path in sorted((out / label).iterdir()):
            if path.is_file():
                client.log_artifact(run, str(path))
        client.set_terminated(run, "FINISHED")
        drawn.append(({k: json.loads(v) for k, v in params.items() if k in ("layer", "pos")},
                      metrics))
    for name in ("document.json", "run.json"):
        client.log_artifact(parent, str(out / name))
    for name, png in plots.sweep_plots(drawn, title=title).items():
        picture = out.parent / f"{out.name}-{Path(name).name}"
        picture.write_bytes(png)
        client.log_artifact(parent, str(picture), "plots")
    client.set_terminated(parent, "FINISHED")
    return time.perf_counter() - start


def _ratio(label: str, document: dict, data_root: str, samples: int, tmp: str,
           points: int | None = None) -> None:
    """Untracked and tracked runs alternated after a warm-up of each; medians printed.
    With ``points``, the bare client's floor for that many points too."""
    uri = f"sqlite:///{tmp}/mlflow.db"
    bare = None
    if points:
        from mlflow import MlflowClient

        bare = MlflowClient(f"sqlite:///{tmp}/bare.db")
        bare_id = bare.create_experiment("bare", artifact_location=f"file://{tmp}/bare")
        _bare_store(bare, bare_id, points)
    _once(document, f"{tmp}/{label}-warm-u", None, data_root)
    _once(document, f"{tmp}/{label}-warm-t", uri, data_root)
    if bare is not None:
        same = _stored_points(uri)
        _bare_same(bare, bare_id, Path(f"{tmp}/{label}-warm-u"), same, label)
    untracked, tracked, stored, floor, alike = [], [], [], [], []
    for index in range(samples):
        untracked.append(_once(document, f"{tmp}/{label}-u{index}", None, data_root)[0])
        returned, done = _once(document, f"{tmp}/{label}-t{index}", uri, data_root)
        tracked.append(returned)
        stored.append(done)
        if bare is not None:
            floor.append(_bare_store(bare, bare_id, points))
            alike.append(_bare_same(bare, bare_id, Path(f"{tmp}/{label}-u{index}"), same, label))
    print(label)
    for name, samples in (("untracked", untracked), ("tracked  ", tracked),
                          ("stored   ", stored)):
        shown = " ".join(f"{value:.3f}" for value in samples)
        print(f"{name} s: {shown}  median {statistics.median(samples):.3f}")
    base = statistics.median(untracked)
    print(f"tracked/untracked ratio {statistics.median(tracked) / base:.2f} (numbers in hand); "
          f"until stored in MLflow {statistics.median(stored) / base:.2f} (target <= 1.5)")
    if floor:
        _per_point(points, base, statistics.median(stored), statistics.median(floor),
                   statistics.median(alike))


def _per_point(points: int, untracked: float, stored: float, floor: float,
               alike: float) -> None:
    """Until stored against the floor, per point: what causalab's tracking costs beyond
    MLflow's own writes of the same runs (target: within 30 ms a point)."""
    over = (stored - untracked) / points * 1000
    bare = floor / points * 1000
    print(f"floor: a bare MlflowClient writing the same {points + 1} runs (create, one "
          f"log_batch, end; no files, plots or causalab) takes {floor:.3f} s = "
          f"{floor / untracked:.2f}x the untracked sweep")
    print(f"until stored: +{over:.0f} ms a point over untracked; the bare client {bare:.0f} ms "
          f"a point; {over - bare:+.0f} ms a point beyond it (target <= 30)")
    same = alike / points * 1000
    print(f"with the same content (each point's files, the parent's document, record and "
          f"plot) the bare client takes {alike:.3f} s, {same:.0f} ms a point; until stored "
          f"is {over - same:+.0f} ms a point beyond it (target <= 30)")


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
    import json

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
          f"(importing MLflow and opening its store, {medians['mlflow only']:.2f} s, happen in "
          f"the tracking worker beside the run's compile and model load)")


def _smollm2_sweep(tmp: str) -> tuple[dict, str]:
    """SmolLM2's 30-layer END residual sweep over the 120 IOI rows, and its data root."""
    import json

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
        _ratio("medium patching sweep: 8 points, 42 rows, d=256, 4 layers (target <= 1.10)",
               document, str(ROOT / "documents" / "data"), args.samples, tmp, points=8)
        if args.cli_samples:
            _fresh_processes(document, str(ROOT / "documents" / "data"), args.cli_samples, tmp)
        if args.smollm2_samples:
            document, data_root = _smollm2_sweep(tmp)
            _ratio("SmolLM2 30-layer END sweep: 30 points, 120 rows", document, data_root,
                   args.smollm2_samples, tmp)


if __name__ == "__main__":
    main()
