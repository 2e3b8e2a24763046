"""The command blocks of the README and its docs/ pages run as pasted, in the order a newcomer
meets them (the README, then the pages that hold what moved out of it: ``PAGES``), on a fresh copy.

A copy of the checkout (its tracked files, the set-up ``.venv`` linked in) is the newcomer's
clone; every ```` ```sh ```` block of the README runs there in order with ``bash -e``, against the
store the README's defaults make (``./mlflow.db`` of the copy: the user's variables are removed
suite-wide). So the fetch block reads the run that ``make run`` just made, as the README says.
A block that needs what this machine has not (a cluster, a server that runs until Ctrl-C, a
benchmark's hour) names the test that runs it instead; a new block must be classified here.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md"] + [REPO / "docs" / f"{name}.md" for name in (
    "tour", "cli", "results", "real-models", "cluster", "benchmarks", "reliability")]
RUN_HERE = 5  # blocks run on the copy: make run, run an experiment, fetch, Hydra, compare
# the first command of a block -> None (run here) or the test that runs it instead
ELSEWHERE = {
    "make run": None,
    "# the k=16 point": None,
    ".venv/bin/python -m causalab.run experiment=das model=llama": None,
    ".venv/bin/python -m causalab.run -m experiment=compare method=das,dbm,full,pca,sae,neurons,"
    "random model=llama": None,
    "make ui": "tests/platform/test_mlflow_ui.py (causalab ui in Chromium; it serves until Ctrl-C)",
    "make server": "tests/platform/test_cluster.py (make test-cluster; it serves until Ctrl-C)",
    ".venv/bin/python -m causalab.run -m hydra/launcher=joblib hydra.launcher.n_jobs=4 "
    "tracking=server": "tests/platform/test_cluster.py (joblib jobs on a causalab server)",
    ".venv/bin/causalab server start --root /shared": "no Slurm here: tests/platform/test_cluster.py "
                                                      "runs submitit_local, the same launcher plugin",
    "ray start --head": "tests/platform/test_cluster.py (a local Ray cluster)",
    ".venv/bin/python -m causalab.run -m experiment=compare method=das,dbm,full,pca,sae,neurons,"
    "random model=smollm2": "tests/platform/test_documented_commands.py (make test-slow: minutes "
                            "on SmolLM2)",
    ".venv/bin/python scripts/bench/patching.py": "tests/test_readme.py (each bench's fast twin)",
    ".venv/bin/python -m causalab.models.standin": "tests/engine/test_precision.py and "
                                                   "make test-device (the stand-ins at small size)",
}
SKIPPED_LINES = ("make test",)  # the suite this test is part of


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def page_blocks() -> list[str]:
    """Every command block of the pages, in order."""
    return [block for page in PAGES for block in sh_blocks(page.read_text(encoding="utf-8"))]


def _first(block: str) -> str:
    return block.strip().splitlines()[0]


def _owner(block: str) -> str:
    first = re.sub(r"\s+", " ", _first(block))
    found = [key for key in ELSEWHERE if first.startswith(key)]
    assert len(found) == 1, f"classify this README block in ELSEWHERE: {first!r}"
    return found[0]


def test_every_readme_block_is_run_here_or_names_the_test_that_runs_it():
    blocks = page_blocks()
    owners = [_owner(block) for block in blocks]
    assert len(blocks) >= 10 and sum(ELSEWHERE[o] is None for o in owners) == RUN_HERE
    assert set(owners) == set(ELSEWHERE), set(ELSEWHERE) - set(owners)


def _fresh_copy(root: Path) -> Path:
    clone = root / "clone"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)  # mtimes kept: make sees the set-up as done
    # The set-up .venv, entry by entry, with a stamp of its own newer than every copied file:
    # `make` in the copy finds its set-up done and never reinstalls into the shared .venv
    # (an editable install there would point the checkout's own commands at the copy).
    venv = clone / ".venv"
    venv.mkdir()
    for entry in (REPO / ".venv").iterdir():
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()
    return clone


def test_the_readme_blocks_run_as_pasted_in_order_on_a_fresh_copy(tmp_path):
    clone = _fresh_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")}
    ran = []
    for block in page_blocks():
        if ELSEWHERE[_owner(block)] is not None:
            continue
        lines = [line for line in block.splitlines() if not line.strip().startswith(SKIPPED_LINES)]
        done = subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"{_first(block)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        ran.append(_first(block))
    assert len(ran) == RUN_HERE
    assert (clone / "mlflow.db").is_file()
    fetched = clone / "rot16.safetensors"
    assert fetched.is_file() and fetched.stat().st_size > 64 * 16 * 4
    listed = subprocess.run([".venv/bin/causalab", "runs"], cwd=clone, env=env,
                            capture_output=True, text=True, check=True).stdout
    assert "experiment=compare" in listed and "experiment=layer_sweep" in listed
    found = subprocess.run([str(REPO / ".venv/bin/python"), "-c", "import causalab; print(causalab.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == str(REPO / "causalab" / "__init__.py")  # the .venv left alone
