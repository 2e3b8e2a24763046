"""Benchmark: attribution patching against exact patching on a real model's IOI rows.

Rows: every ``--every``-th row of documents/data/ioi/data.json, from the first (the table is
ordered by template, then ABBA/BABA: every 10th row, the default, is 12 rows covering all ten
templates and both orders, which keeps the whole bench near 9 minutes on 2 loaded cores); the
same rows for every document. Documents:

* exact heads: experiment=ioi_head_patching (on SmolLM2 270 points, one head's premix slice
  at END swapped from the name-swapped prompt), against experiment=ioi_head_attribution;
* exact END layers: experiment=ioi_layer_sweep with its position axis fixed at END (one
  point per block, the stream leaving it), against experiment=ioi_layer_attribution with its
  positions cut to END;

each rendered for ``--model`` (``smollm2``, the default, or ``gemma3``).

Each attribution document runs as AtP (``atp``, ``steps: 1``), with integrated gradients
(``ig-<n>``, ``--ig-steps``), and with ``verify: <n>`` (``atp+verify<n>``, ``--verify``: the
units verified take their exact effect, the rest keep AtP's; ``atp*+verify<n>`` adds GradDrop,
whose magnitudes choose the units verified, with ``--graddrop``; ``atp+bound<b>``, with
``--verify-bound b``: rounds of ``verify: {bound: b}`` until the bound is below ``b``). The QK fix corrects query
and key units: ``--sweeps queries`` runs the head sweep and its attribution on each head's END
query instead of its output (eager attention), with ``atp+qk`` and the QK fix in ``atp*``. In one
process, after a warm-up run (the model loaded, kernels warm), each document's
``run_document`` is timed whole (compile, forwards, tables, verification). Compared per unit:
the mean over rows of the patched logit difference (cf answer minus base answer) the exact
point scores, and the attribution table's mean ``value`` (base metric plus estimated effect).
Ranks are by that mean, highest first (the units whose patch moves the answer most toward the
counterfactual's); a unit's effect is its mean minus the base metric's mean. Printed, per
sweep and estimate:

    ATTRIBUTION model=<model> estimate=<estimate> spearman=<rank correlation over all units>
      top1=<yes|no: the exact top unit ranked first> top10_overlap=<k/10>
      top10_max_ratio_err=<largest |estimated effect / exact effect - 1| over the exact top 10>
      time_ratio=<attribution wall / exact wall> sweep=... top3_in_top10=<k/3> ...
      [bound=<largest_exact_bound> verified=<units> [tolerance=<b> stopped=<why>]]

    CAUSALAB_HOME=/work/cache/home .venv/bin/python scripts/bench/attribution.py
    .venv/bin/python scripts/bench/attribution.py --sweeps heads --ig-steps 1 --verify 10
    .venv/bin/python scripts/bench/attribution.py --sweeps heads --ig-steps 1 --verify-bound 0.05
    .venv/bin/python scripts/bench/attribution.py --every 5 --sweeps heads --ig-steps 8
    .venv/bin/python scripts/bench/attribution.py --model gemma3
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
EXACT = {"heads": "ioi_head_patching", "layers": "ioi_layer_sweep",
         "queries": "ioi_head_patching"}
ATTRIBUTION = {"heads": "ioi_head_attribution", "layers": "ioi_layer_attribution",
               "queries": "ioi_head_attribution"}


def _end_only(value):
    """The layer sweep's named position axis fixed at END."""
    if isinstance(value, dict):
        if value.get("as") == "pos" and "sweep" in value:
            return "END"
        return {k: _end_only(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_end_only(v) for v in value]
    return value


def documents(sweep: str, ig_steps: int, model: str = "smollm2", verify: int = 0,
              graddrop: bool = False, bound: float | None = None) -> dict[str, dict]:
    from causalab.hydra.rendering import render

    exact = render([f"experiment={EXACT[sweep]}", f"model={model}"])
    exact = _end_only(exact) if sweep == "layers" else exact
    atp = render([f"experiment={ATTRIBUTION[sweep]}", f"model={model}"])
    step = atp["steps"]["attribute"]
    if sweep == "layers":
        step["positions"] = {"END": step["positions"]["END"]}
    for field in ("qk_fix", "graddrop", "verify"):
        step.pop(field, None)  # the conf's corrections: each estimate sets its own
    if sweep == "queries":
        for document in (exact, atp):
            document["sites"]["head_out"]["component"] = "attention_query"
            document["model"]["attn_implementation"] = "eager"
    found = {"exact": exact, "atp": atp}
    if sweep == "queries":
        found["atp+qk"] = _with(atp, qk_fix=True)
    if ig_steps > 1:
        found[f"ig-{ig_steps}"] = _with(atp, steps=ig_steps)
    if verify:
        found[f"atp+verify{verify}"] = _with(atp, verify=verify)
    if bound is not None:
        found[f"atp+bound{bound:g}"] = _with(atp, verify={"bound": bound})
    if verify and graddrop:
        found[f"atp*+verify{verify}"] = _with(atp, verify=verify, graddrop=True,
                                               qk_fix=sweep == "queries")
    return found


def _with(document: dict, **fields) -> dict:
    changed = copy.deepcopy(document)
    changed["steps"]["attribute"].update(fields)
    return changed


def _mean(rows: list[dict]) -> float:
    values = [r["value"] for r in rows if r["eligible"]]
    return sum(values) / len(values)


def exact_means(document: dict, out: Path) -> dict[tuple, float]:
    from causalab.document import lower

    found = {}
    for point in lower(document):
        rows = json.loads((out / point.label / "logit_diff.json").read_text())
        found[_key(point.coordinates)] = _mean(rows)
    return found


def attribution_means(out: Path) -> tuple[dict[tuple, float], float, str]:
    """Per unit its mean value (a verified unit's moved by its exact minus estimated
    effect), the base metric's mean, and the verification's bound in words ("" unverified)."""
    cells: dict[tuple, list] = {}
    bases = []
    for row in json.loads((out / "logit_diff.json").read_text()):
        if row["eligible"]:
            cells.setdefault(_key(row["coordinates"]), []).append(row["value"])
            bases.append(row["value"] - row["effect"])
    means = {key: sum(v) / len(v) for key, v in cells.items()}
    report = out / "attribute.verify.json"
    bound = ""
    if report.is_file():
        verified = json.loads(report.read_text())["logit_diff"]
        for unit in verified["units"]:
            if unit["exact"] is not None:
                means[_key(unit["coordinates"])] += unit["exact"] - unit["estimate"]
        bound = _bound_words(verified["bound"], len(verified["units"]))
    return means, sum(bases) / len(bases), bound


def _bound_words(bound: dict, verified: int) -> str:
    words = f" bound={bound['largest_exact_bound']:.4g} verified={verified}"
    if "tolerance" in bound:
        words += f" tolerance={bound['tolerance']:g} stopped={bound['stopped']}"
    return words


def _key(coordinates: dict) -> tuple:
    return tuple(int(coordinates[name]) for name in ("layers", "heads") if name in coordinates)


def _timed(document: dict, out: Path, data_root: str) -> float:
    from causalab.pipeline import run_document

    start = time.perf_counter()
    run_document(document, out=str(out), data_root=data_root)
    return time.perf_counter() - start


def _subset(every: int, root: Path) -> str:
    rows = json.loads((ROOT / "documents" / "data" / "ioi" / "data.json").read_text())[::every]
    (root / "ioi").mkdir(parents=True)
    (root / "ioi" / "data.json").write_text(json.dumps(rows))
    orders = sorted({r["order"] for r in rows})
    templates = sorted({r["template"] for r in rows})
    print(f"rows: every {every}th of the IOI table: {len(rows)} rows, templates {templates}, "
          f"orders {orders}", flush=True)
    return str(root)


def _report(model: str, sweep: str, name: str, exact: dict, estimated: tuple, ratio: float,
            seconds: tuple):
    from causalab.plots.attribution_maps import spearman

    estimate, base, bound = estimated
    units = sorted(exact)
    rho = spearman([exact[u] for u in units], [estimate[u] for u in units])
    top = sorted(units, key=lambda u: -exact[u])
    mine = sorted(units, key=lambda u: -estimate[u])
    overlap = len(set(top[:10]) & set(mine[:10]))
    top3 = sum(u in mine[:10] for u in top[:3])
    spelled = " ".join(_spell(u) for u in top[:3])
    worst = max(abs((estimate[u] - base) / (exact[u] - base) - 1) for u in top[:10])
    print(f"ATTRIBUTION model={model} estimate={name} spearman={rho:.3f} "
          f"top1={'yes' if mine[0] == top[0] else 'no'} top10_overlap={overlap}/10 "
          f"top10_max_ratio_err={worst:.3f} time_ratio={ratio:.4f} sweep={sweep} "
          f"top3_in_top10={top3}/3 exact_top3={spelled} exact_s={seconds[0]:.1f} "
          f"attribution_s={seconds[1]:.1f} units={len(units)}{bound}", flush=True)
    where = {u: (top.index(u) + 1, mine.index(u) + 1) for u in set(top[:10]) ^ set(mine[:10])}
    for unit, (exact_rank, my_rank) in sorted(where.items(), key=lambda item: item[1]):
        print(f"  disagree {_spell(unit)}: exact rank {exact_rank} ({exact[unit]:+.3f}), "
              f"attribution rank {my_rank} ({estimate[unit]:+.3f})", flush=True)


def _spell(unit: tuple) -> str:
    return "L{}H{}".format(*unit) if len(unit) == 2 else f"L{unit[0]}"


def bench(sweep: str, args: argparse.Namespace, data_root: str, tmp: Path) -> None:
    docs = documents(sweep, args.ig_steps, args.model, args.verify, args.graddrop,
                     args.verify_bound)
    walls, means = {}, {}
    for name, document in docs.items():
        out = tmp / f"{sweep}-{name}"
        walls[name] = _timed(document, out, data_root)
        means[name] = exact_means(document, out) if name == "exact" else attribution_means(out)
        print(f"{sweep} {name}: {walls[name]:.1f} s", flush=True)
    for name in docs:
        if name != "exact":
            _report(args.model, sweep, name, means["exact"], means[name],
                    walls[name] / walls["exact"], (walls["exact"], walls[name]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=10, help="take every N-th IOI row")
    parser.add_argument("--ig-steps", type=int, default=4,
                        help="integrated-gradients steps (1: AtP alone)")
    parser.add_argument("--sweeps", default="heads,layers", help="heads, layers, queries")
    parser.add_argument("--model", default="smollm2", help="a conf/model name: smollm2, gemma3")
    parser.add_argument("--verify", type=int, default=10,
                        help="units verify patches exactly (0: no atp+verify line)")
    parser.add_argument("--verify-bound", type=float, default=None,
                        help="also verify: {bound: B} (an atp+bound<B> line)")
    parser.add_argument("--graddrop", action="store_true",
                        help="also AtP* (GradDrop choosing the units verified)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="causalab-attribution-") as folder:
        tmp = Path(folder)
        data_root = _subset(args.every, tmp / "data")
        warm = documents("heads", 1, args.model)["atp"]
        print(f"warm-up: {_timed(warm, tmp / 'warm', data_root):.1f} s (model load included)",
              flush=True)
        for sweep in args.sweeps.split(","):
            bench(sweep, args, data_root, tmp)


if __name__ == "__main__":
    main()
