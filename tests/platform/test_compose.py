"""conf/ composes: groups own what they mirror, experiments are overrides, and every one runs.

The data group owns the roles, readout/ the head site, intervention/ the shared bodies and the
model files only counts; an experiment says what is its own. Each experiment compiles on the
models its header names (no weights), and one real multirun runs every experiment at once.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from collections import defaultdict
from fnmatch import fnmatch
import sys
from pathlib import Path

import pytest

from causalab.hydra.rendering import CONF, render

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
DEFAULT_MODEL = "llama"
# Experiments pinned to a layer the 2-layer tiny Llama lacks, or to names its tokenizer does not
# hold as one token; each names the models it runs on.
NOT_ON_TINY = ("das", "compare", "ioi_*")
# A copied body is a run of at least this many consecutive lines that two conf files share.
COPIED_RUN = 4


def _named_commands(experiment: str) -> list[list[str]]:
    """The overrides of each command in the header that names a model (``model=a,b`` is one
    command per model, with the command's other overrides), else the default model alone."""
    header = [line for line in (CONF / "experiment" / f"{experiment}.yaml").read_text()
              .splitlines() if line.startswith("#") and "causalab.run" in line]
    commands = []
    for line in header:
        words = line.split("causalab.run", 1)[1].split("(")[0].split()
        overrides = [w for w in words if "=" in w and not w.startswith(("experiment=", "model="))
                     and "<" not in w and "method=" not in w]
        # A swept override (``+model.control=null,random_init``) is one command per value.
        swept = [[f"{w.split('=', 1)[0]}={v}" for v in w.split("=", 1)[1].split(",")]
                 if "," in w and "[" not in w else [w] for w in overrides]
        for found in re.findall(r"(?<![.\w])model=([\w,]+)", line):
            commands += [[f"model={m}", *chosen] for m in found.split(",")
                         for chosen in itertools.product(*swept)]
    unique = sorted({tuple(c) for c in commands})
    return [list(c) for c in unique] or [[f"model={DEFAULT_MODEL}"]]


def test_experiments_restate_no_roles_no_head_site_and_no_index_lists():
    for name in EXPERIMENTS:
        text = (CONF / "experiment" / f"{name}.yaml").read_text()
        assert not re.search(r"^roles:", text, re.M), name
        assert "lm_head" not in text, name
    for path in (CONF / "model").glob("*.yaml"):
        assert not re.search(r"\[\[0\]", path.read_text()), path.name


def test_shared_intervention_bodies_are_used_by_more_than_one_experiment():
    used = {p.stem: 0 for p in (CONF / "intervention").glob("*.yaml")}
    users = [CONF / "experiment" / f"{name}.yaml" for name in EXPERIMENTS]
    for path in users + sorted((CONF / "method").glob("*.yaml")):  # a method is compare's part
        text = path.read_text()
        for body in used:
            used[body] += f"/intervention@interventions." in text and f": {body}\n" in text
    assert used and all(count >= 2 for count in used.values()), used


def test_every_layer_and_every_head_come_from_the_model_counts():
    document = render(["experiment=head_patching", "model=llama3_2_1b"])
    assert document["sites"]["head_out"]["heads"] == {"sweep": [[h] for h in range(32)]}
    lens = render(["experiment=logit_lens", "model=weekday_gpt2"])
    assert lens["sites"]["resid"]["layers"] == {"sweep": [[layer] for layer in range(4)]}


def test_a_document_keeps_only_the_roles_its_steps_read():
    assert set(render(["experiment=zero_ablation", "model=tiny_llama"])["roles"]) == {"base"}
    assert set(render(["experiment=patching", "model=tiny_llama"])["roles"]) == {
        "base", "counterfactual"}


def _repeated_lines(texts: dict[str, str]) -> tuple[int, int]:
    """(lines in a run of COPIED_RUN or more consecutive lines another file also holds, all
    lines), over the lines that say something: comments and blank lines are skipped."""
    lines = {name: [line.rstrip() for line in text.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
             for name, text in texts.items()}
    holders = defaultdict(set)
    for name, body in lines.items():
        for start in range(len(body) - COPIED_RUN + 1):
            holders[tuple(body[start:start + COPIED_RUN])].add(name)
    repeated = 0
    for name, body in lines.items():
        flagged = set()
        for start in range(len(body) - COPIED_RUN + 1):
            if len(holders[tuple(body[start:start + COPIED_RUN])]) > 1:
                flagged.update(range(start, start + COPIED_RUN))
        repeated += len(flagged)
    return repeated, sum(len(body) for body in lines.values())


def test_a_body_copied_into_two_conf_files_counts_as_repeated_and_their_own_lines_do_not():
    body = "steps:\n  patch:\n    kind: observe\n    interventions: patch\n"
    texts = {"a": "# a\n" + body + "own: 1\n", "b": body + "\nother: 2\n", "c": "steps: {}\n"}
    assert _repeated_lines(texts) == (8, 11)


def test_conf_repeats_under_a_tenth_of_its_lines():
    texts = {str(p.relative_to(CONF)): p.read_text() for p in sorted(CONF.rglob("*.yaml"))}
    repeated, total = _repeated_lines(texts)
    assert total > 500, "found too little conf to measure"
    assert repeated < total / 10, f"{repeated} of {total} conf lines sit in copied runs"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_compiles_on_every_model_its_header_names(experiment, monkeypatch):
    import causalab.compile
    from causalab.document import validate
    from causalab.models import SCHEME

    monkeypatch.chdir(REPO)  # bundle paths are relative to the working directory
    for overrides in _named_commands(experiment):
        document = render([f"experiment={experiment}", *overrides])
        assert validate(document), (experiment, overrides)
        if document["model"]["key"].startswith(SCHEME):  # a hub checkpoint is not here
            plan = causalab.compile.compile_document(document, data_root="documents/data")
            assert plan.children, (experiment, overrides)


@pytest.mark.slow
def test_one_multirun_runs_every_experiment_on_the_tiny_llama(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pattern = f"glob(*,exclude=[{','.join(NOT_ON_TINY)}])"
    command = [sys.executable, "-m", "causalab.run", "-m", f"experiment={pattern}",
               "model=tiny_llama", "tracking.enabled=false",
               f"run.data_root={REPO / 'documents' / 'data'}",
               f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = {}
    for document in (tmp_path / "multirun").glob("*/document.json"):
        overrides = (document.parent / ".hydra" / "overrides.yaml").read_text()
        name = re.search(r"experiment=(\w+)", overrides).group(1)
        ran[name] = json.loads(document.read_text())
    assert set(ran) == {e for e in EXPERIMENTS if not any(fnmatch(e, p) for p in NOT_ON_TINY)}
    for name, document in ran.items():
        assert document == render([f"experiment={name}", "model=tiny_llama"]), name


def test_the_experiment_docs_conf_md_shows_how_to_add_renders_and_validates(tmp_path):
    import shutil

    from causalab.document import validate

    block = re.search(r"```yaml\n(.*?)```", (REPO / "docs" / "conf.md").read_text(), re.S).group(1)
    shutil.copytree(CONF, tmp_path / "conf")
    (tmp_path / "conf" / "experiment" / "my_das.yaml").write_text(block)
    document = render(["experiment=my_das", "model=tiny_llama"], config_dir=str(tmp_path / "conf"))
    assert list(document["steps"]) == ["fit", "test"]
    assert document["featurizers"]["rot"] == {"kind": "subspace", "k": 4}
    assert validate(document)
