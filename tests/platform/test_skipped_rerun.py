"""A rerun whose every point is done costs a compile and one store lookup: no model loads and
no tensor library is imported, and it still writes the run's record as a computing run does."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
DOCUMENT = str(REPO / "documents" / "v2" / "patching.json")

# Runs the command in this process, then says which heavy libraries it imported.
_PROBE = """
import json, sys
from causalab.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules,
                  "nnterp": "nnterp" in sys.modules}), file=sys.stderr)
"""


def _run(tmp_path: Path, out: str) -> tuple[dict, list[str], str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    done = subprocess.run([sys.executable, "-c", _PROBE, "run", DOCUMENT, "--out",
                           str(tmp_path / out), "--data-root", DATA, "--tracking-uri",
                           f"sqlite:///{tmp_path / 'mlflow.db'}", "--device-map", "cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert lines, done.stderr
    return json.loads(lines[-1]), done.stdout.split(), done.stderr


def test_a_rerun_of_done_points_imports_no_torch_and_records_the_run_alike(tmp_path):
    first, written, _ = _run(tmp_path, "first")
    assert first == {"code": 0, "torch": True, "nnterp": True}
    assert any(path.endswith("iia.json") for path in written)
    again, rewritten, stderr = _run(tmp_path, "again")
    assert again == {"code": 0, "torch": False, "nnterp": False}
    assert [Path(p).name for p in rewritten] == ["document.json", "run.json"]
    assert "skipped <root>: done in run " in stderr
    # The record of a skipped run names what a computing run of the document names.
    record = json.loads((tmp_path / "first" / "run.json").read_text())
    assert json.loads((tmp_path / "again" / "run.json").read_text()) == record
