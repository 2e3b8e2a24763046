"""A run claims its ``--out``: a second run meanwhile is refused naming the owner, a dead
owner's claim is taken over, and the files a run writes follow the umask."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from causalab.tracking.claims import claim
from causalab.errors import UsageError
from causalab.files import CLAIM

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")


def test_a_second_claim_on_a_held_out_is_refused_naming_the_owner(tmp_path):
    out = tmp_path / "out"
    with claim(out):
        owner = json.loads((out / CLAIM).read_text())
        with pytest.raises(UsageError) as refused:
            with claim(out):
                pass
    assert refused.value.path == ("--out",)
    assert owner["pid"] == os.getpid()
    assert f"pid {os.getpid()}" in refused.value.message and owner["owner"] in refused.value.message
    assert not out.exists()  # the claim made the folder, and nothing else was written


def test_a_claim_left_by_a_killed_run_is_taken_over(tmp_path):
    out = tmp_path / "out"
    script = ("import os, signal, sys\nfrom causalab.tracking.claims import claim\n"
              "held = claim(sys.argv[1])\nheld.__enter__()\nos.kill(os.getpid(), signal.SIGKILL)\n")
    paths = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=paths)
    died = subprocess.run([sys.executable, "-c", script, str(out)], env=env, timeout=60)
    assert died.returncode == -signal.SIGKILL
    assert json.loads((out / CLAIM).read_text())["pid"] != os.getpid()
    with claim(out):
        assert json.loads((out / CLAIM).read_text())["pid"] == os.getpid()
    assert not (out / CLAIM).exists()


def test_a_run_holds_its_out_from_before_the_model_loads(tmp_path, monkeypatch):
    import causalab.engine.weights
    from causalab.pipeline import run_document

    out, seen = tmp_path / "out", []

    def second_run(*_args, **_kwargs):
        with pytest.raises(UsageError) as refused:
            with claim(out):
                pass
        seen.append(refused.value.message)
        raise RuntimeError("stopped before any weight")
    monkeypatch.setattr(causalab.engine.weights, "load_model", second_run)
    document = json.loads((REPO / "documents" / "v2" / "patching.json").read_text())
    with pytest.raises(RuntimeError):
        run_document(document, out=str(out), device_map="cpu", data_root=DATA)
    assert len(seen) == 1 and f"pid {os.getpid()}" in seen[0]
    assert not out.exists()


@pytest.mark.parametrize("umask, file_mode, folder_mode",
                         [(0o002, 0o664, 0o775), (0o077, 0o600, 0o700)],
                         ids=["group_writable", "private"])
def test_out_files_and_cache_folders_follow_the_umask(tmp_path, umask, file_mode, folder_mode):
    from causalab.engine import record
    from causalab.models.staging import staging_folder

    previous = os.umask(umask)
    try:
        (tmp_path / "out").mkdir()
        table = record.write_json(tmp_path / "out" / "point" / "t.json", [1], root=tmp_path / "out")
        folder = staging_folder(tmp_path, "tiny-llama")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(table).st_mode) == file_mode
    assert stat.S_IMODE(os.stat(Path(table).parent).st_mode) == folder_mode
    assert stat.S_IMODE(folder.stat().st_mode) == folder_mode


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _claimed_by(out: Path, process: subprocess.Popen, limit: float = 300) -> None:
    """Wait until ``process`` has written its owner into ``out``'s claim."""
    deadline = time.monotonic() + limit
    while True:
        assert process.poll() is None, "the first run ended before its claim was seen"
        assert time.monotonic() < deadline, "the first run never claimed its --out"
        try:
            if json.loads((out / CLAIM).read_text())["pid"] == process.pid:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)


def test_two_causalab_runs_into_one_out_the_second_refused_in_one_line_naming_the_first(
        tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "causalab", "run", str(REPO / "documents" / "v2" /
               "patching.json"), "--no-track", "--device-map", "cpu", "--out", str(out),
               "--data-root", DATA]
    first = subprocess.Popen(command, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _claimed_by(out, first)
        first.send_signal(signal.SIGSTOP)  # held mid-run, its lock with it
        try:
            second = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True,
                                    text=True, timeout=300)
        finally:
            first.send_signal(signal.SIGCONT)
        written, _ = first.communicate(timeout=300)
    finally:
        first.kill()
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and second.stdout == ""  # a UsageError of --out
    assert len(lines) == 1 and lines[0].startswith("error: --out: ")
    assert f"pid {first.pid}" in lines[0]
    assert first.returncode == 0
    files = sorted(str(p) for p in out.rglob("*") if p.is_file())
    assert files == sorted(written.split())  # the first run's files, and nothing of the second
    assert not (out / CLAIM).exists()
