"""Write a run's edge step in MIB's submission layout (docs/format.md §9.7, "MIB's submission
layout"): ``importances/<task>_<model>/importances.json`` and the 9 circuits of each ranking
under ``multiple_circuits/abs-False/`` (signed: CPR's) and ``multiple_circuits/abs-True/``
(``|score|``: CMD's).

    .venv/bin/python scripts/mib_export.py RUN_DIR --step circuit --task ioi --model gpt2 \\
        --out mib_submission [--metric logit_diff]

``RUN_DIR`` is the point's output folder (``<step>.edges.json``, ``<step>.faithfulness.json``);
``--metric`` names the metric when the step scored several.
"""
from __future__ import annotations

import argparse

from causalab.engine.attribution.mib_export import export


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--step", required=True)
    parser.add_argument("--task", required=True, help="MIB's task name: ioi, mcqa, "
                        "arithmetic-addition, arithmetic-subtraction, arc-easy, arc-challenge")
    parser.add_argument("--model", required=True, help="MIB's model name: gpt2, qwen2.5, "
                        "gemma2, llama3 (or your own, without '_')")
    parser.add_argument("--out", required=True)
    parser.add_argument("--metric", default=None)
    args = parser.parse_args(argv)
    for path in export(args.run_dir, args.step, args.out, task=args.task, model=args.model,
                       metric=args.metric):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
