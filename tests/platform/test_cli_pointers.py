"""The command line points the way (issue 58): each case is one line, and an error exits non-zero.

- A Python without the set-up (here the set-up's own interpreter with ``-S``: no
  site-packages, so no hydra, torch or pydantic) running ``python -m causalab.run …`` or
  ``python -m causalab …`` is told, in one line, to run ``make setup``: no traceback.
- An option a config group does not have (``experiment=dass``, one value of a ``-m`` sweep)
  is one line naming the nearest options, not Hydra's list of every option.
- ``validate`` says it checked the document alone and that ``explain`` checks it against the
  model: a layer the model does not have passes ``validate`` and is refused by ``explain``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")


def _python(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def _one_line(text: str) -> str:
    assert text.count("\n") == 1 and text.endswith("\n"), text
    assert "Traceback" not in text
    return text.strip()


def test_a_python_without_the_set_up_running_a_hydra_job_is_told_to_run_make_setup():
    done = _python("-S", "-m", "causalab.run", "experiment=das", "model=llama")
    line = _one_line(done.stderr)
    assert done.returncode == 1 and done.stdout == ""
    assert line.startswith("error: no module named ") and "`make setup`" in line
    assert ".venv/bin/python -m causalab.run" in line


def test_a_python_without_the_set_up_running_the_command_is_told_to_run_make_setup():
    done = _python("-S", "-m", "causalab", "vocab")
    line = _one_line(done.stderr)
    assert done.returncode == 1 and done.stdout == ""
    assert "`make setup`" in line and ".venv/bin/python -m causalab" in line


def test_an_unknown_experiment_is_one_line_with_the_nearest_names():
    done = _python("-m", "causalab.run", "experiment=dass", "model=llama")
    line = _one_line(done.stderr)
    assert done.returncode == 1 and done.stdout == ""
    assert line == ("error: experiment=dass: conf/experiment/ has no option 'dass'; "
                    "nearest: das, ioi_das")


def test_an_unknown_value_of_a_multirun_sweep_is_one_line_with_the_nearest_names():
    done = _python("-m", "causalab.run", "-m", "experiment=das", "model=llama,gptt")
    line = _one_line(done.stderr)
    assert done.returncode == 1 and done.stdout == ""
    assert line == "error: model=gptt: conf/model/ has no option 'gptt'; nearest: gpt2"


def test_render_refuses_an_unknown_option_in_one_line_with_the_nearest_names(capsys):
    status = main(["render", "experiment=dass", "model=llama"])
    out, err = capsys.readouterr()
    assert status != 0 and out == ""
    assert _one_line(err) == ("error: overrides: experiment=dass: conf/experiment/ has no "
                              "option 'dass'; nearest: das, ioi_das")


def test_a_known_option_and_hydras_own_groups_pass_the_check():
    from causalab.hydra.rendering import unknown_choice

    assert unknown_choice(["experiment=das", "model=llama,gpt2", "hydra/launcher=joblib",
                           "site.layer=0,1", "+model.control=null,random_init",
                           "tracking=server", "method=das,dbm"]) is None
    assert unknown_choice(["site=every_layers"]).startswith("site=every_layers: conf/site/")


def test_validate_says_it_checked_the_document_alone_and_explain_checks_the_model(capsys,
                                                                                   tmp_path):
    document = json.loads((REPO / "documents" / "v2" / "patching.json").read_text())
    document["sites"]["target"]["layers"] = [7]  # causalab:tiny-llama has 2 layers
    path = tmp_path / "layer7.json"
    path.write_text(json.dumps(document))
    status = main(["validate", str(path), "--data-root", DATA])
    out, err = capsys.readouterr()
    assert status == 0 and err == ""
    line = _one_line(out)
    assert line == (f"ok: {path} is a valid document on its own (validate reads no model; "
                    f"causalab explain {path} checks it against causalab:tiny-llama's config "
                    f"and tokenizer)")
    status = main(["explain", str(path), "--data-root", DATA])
    out, err = capsys.readouterr()
    assert status == 1 and out == ""
    assert "7" in _one_line(err) and _one_line(err).startswith("error: ")


def test_an_option_of_a_config_folder_given_on_the_command_line_is_left_to_hydra(tmp_path):
    """Configs from another folder (``--config-dir``) may add options the shipped conf/ has
    not: the check leaves them to Hydra, whose own refusal still exits non-zero."""
    done = _python("-m", "causalab.run", "--config-dir", str(tmp_path), "experiment=dass",
                   "model=llama")
    assert done.returncode != 0 and "nearest: das" not in done.stderr
