"""Write docs/tutorials/first_sweep.ipynb from the cells below, and with ``--execute`` run it
in place (nbclient, the pinned kernel) so the committed notebook shows its outputs.

    .venv/bin/python scripts/make_tutorial.py --execute

tests/test_tutorial.py executes a copy of the notebook end to end and checks its outputs.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "tutorials" / "first_sweep.ipynb"

CELLS = [
    ("md", None, """# From a document to a sweep, its MLflow runs, a fitted rotation and a plot

This notebook does by hand what `make run` does: it runs causalab's DAS experiment on
`causalab:weekday-llama`, a 4-layer Llama trained in this repository on the weekday task
("If today is Thursday, tomorrow is" → " Friday"), tracks it in a throw-away MLflow store,
reads the runs back as a table, fetches a fitted rotation and plots the sweep.

It runs offline on a CPU in about a minute (set up first: `make setup`, then open this
notebook with `.venv/bin/python`'s kernel). Nothing is written outside a temporary folder."""),
    ("code", "setup", """import json
import tempfile
import warnings
from pathlib import Path

import causalab

warnings.filterwarnings("ignore", message="IProgress not found")  # no widgets needed here

# The checkout: the folder above this notebook that holds documents/.
REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "documents" / "known").is_dir())
WORK = Path(tempfile.mkdtemp(prefix="causalab-tutorial-"))
STORE = f"sqlite:///{WORK / 'mlflow.db'}"  # a throw-away MLflow store
DATA = str(REPO / "documents" / "data")
print("store: a SQLite MLflow store in a temporary folder")"""),
    ("md", None, """## 1. The document

A **document** says which activations to read, which to overwrite and how, and what to score.
`documents/known/das.json` is what `python -m causalab.run experiment=das model=llama` (that is,
`make run`) composes: fit a rotation (DAS) at the last token entering block 2, at ranks
`k` = 1, 4 and 16, and score each on 12 held-out day pairs against an untrained random
subspace of the same rank (`control`). `causalab.validate` checks it without loading any
weights and lowers its sweep into points."""),
    ("code", "document", """document = json.loads((REPO / "documents" / "known" / "das.json").read_text())
print("model:", document["model"]["key"])
print("site: ", document["sites"]["target"])
print("rotation:", document["featurizers"]["rot"])
points = causalab.validate(document)
print("points:", [point.label for point, _ in points])"""),
    ("md", None, """## 2. The sweep, tracked in MLflow

`causalab.run` compiles the document, runs every point and, with `track=True`, logs each
point as an MLflow run under one parent run for the sweep. The result holds every table as a
DataFrame; shown, it is one row per point with its scores (`iia/test` is the
interchange-intervention accuracy on the held-out pairs, `.lo`/`.hi` its 95 % interval)."""),
    ("code", "sweep", """result = causalab.run(document, track=True, tracking_uri=STORE, experiment="tutorial",
                      out=str(WORK / "das"), data_root=DATA)
result.points()[["point", "k", "iia/test", "iia/test.lo", "iia/test.hi", "iia/control"]]"""),
    ("md", None, """## 3. Its MLflow runs

`causalab.search_points` reads the store back: one row per point run of one sweep (by default
the newest; `sweep=` names another, `sweep="all"` is every point in the experiment), with its
coordinates, every metric's last value and its `produced_by` digest. A second run of the same
document would find these points done and reuse them."""),
    ("code", "runs", """runs = causalab.search_points("tutorial", tracking_uri=STORE)
runs = runs.sort_values("k")
for _, row in runs.iterrows():
    print(f"{row['name']:5} {row['status']}  iia/test={row['iia/test']:.3f}  "
          f"iia/control={row['iia/control']:.3f}  rows={int(row['n/iia/test'])}")
print(len(runs), "point runs under one parent:", runs["parent_run_id"].nunique() == 1)"""),
    ("md", None, """## 4. A fitted rotation, fetched from the store

Each point's run carries its fitted rotation as a stamped safetensors bundle. `causalab.fetch`
downloads it (and checks its stamp and tensor digest); `basis` is the orthonormal (d, k)
matrix, so `x @ basis` are the features. A new document can use it straight from the store:
`"file_path": "runs:/<run_id>/rot.safetensors"`."""),
    ("code", "rotation", """import torch
from safetensors import safe_open

run_id = runs.set_index("k").loc[16, "run_id"]
path = causalab.fetch(f"runs:/{run_id}/rot.safetensors", str(WORK / "rot16.safetensors"),
                      tracking_uri=STORE)
with safe_open(path, framework="pt") as bundle:
    stamp = bundle.metadata()
    basis = bundle.get_tensor("basis")
identity = torch.eye(basis.shape[1])
print("basis", tuple(basis.shape), "orthonormal:", bool((basis.T @ basis - identity).abs().max() < 1e-4))
print("stamp:", {key: stamp[key] for key in ("model_key", "component", "layer", "k", "kind")})"""),
    ("md", None, """## 5. A plot

The table is plain pandas, so any plot is a few lines. Here: held-out IIA against the rank,
each point's 95 % interval as an error bar, the random-subspace control dashed. (The run
also wrote its own sweep picture, `plots/sweep_curve.png`, and each fit's loss curve,
`k=4/fit_loss.png`, into its output folder and onto its MLflow runs.)"""),
    ("code", "plot", """%matplotlib inline
import matplotlib.pyplot as plt

figure, axes = plt.subplots(figsize=(5, 3.2))
axes.errorbar(runs["k"], runs["iia/test"],
              yerr=[runs["iia/test"] - runs["iia/test.lo"], runs["iia/test.hi"] - runs["iia/test"]],
              marker="o", capsize=4, label="DAS rotation (test)")
axes.plot(runs["k"], runs["iia/control"], "--", marker="o", color="grey",
          label="random subspace (control)")
axes.set_xscale("log", base=2)
axes.set_xticks(list(runs["k"]), [str(k) for k in runs["k"]])
axes.set_xlabel("rank k")
axes.set_ylabel("held-out IIA")
axes.set_ylim(-0.05, 1.05)
axes.set_title(f"{document['model']['key']} · 12 held-out pairs a point")
axes.legend()
plt.show()
print("pictures the run wrote:", sorted(p.relative_to(WORK / "das").as_posix()
                                        for p in (WORK / "das").rglob("*.png")))"""),
    ("md", None, """## Where next

- `python -m causalab.run -m experiment=das model=llama,gpt2,qwen2` runs the same on three
  families as one multirun; `causalab ui` opens the sweep in MLflow's UI.
- [docs/tour.md](../tour.md) walks through the same workflows from the command line;
  [docs/format.md](../format.md) specifies documents."""),
    ("code", "cleanup", """import shutil

shutil.rmtree(WORK)
print("removed the temporary store and outputs")"""),
]


def notebook():
    cells = []
    for kind, tag, source in CELLS:
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        if tag:
            cell.metadata["tags"] = [tag]
        cells.append(cell)
    book = new_notebook(cells=cells)
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                   "language": "python"}
    book.metadata["language_info"] = {"name": "python"}
    return book


def execute(book, cwd: Path, timeout: int = 900):
    from nbclient import NotebookClient

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]))
    os.environ.update(env)
    client = NotebookClient(book, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return book


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--execute", action="store_true", help="run it and keep its outputs")
    args = parser.parse_args()
    book = notebook()
    if args.execute:
        execute(book, NOTEBOOK.parent)
    NOTEBOOK.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(book, NOTEBOOK)
    print(NOTEBOOK)


if __name__ == "__main__":
    main()
