"""Every command-line flag error names the flag: one line on stderr, non-zero, nothing written.

A flag's value is checked where it is given, before the document is compiled or a model is
loaded, so a bad ``--device-map`` is never reported as a bad ``model.key``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = str(REPO / "documents" / "v2" / "patching.json")
TINY = "causalab:tiny-llama"


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    a_file = tmp / "a_file"
    run = ["run", DOCUMENT, "--no-track", "--out", str(tmp / "out")]
    return {
        "a device map that is no placement": (run + ["--device-map", "gpu-please"], "--device-map"),
        "a CUDA device this machine lacks": (run + ["--device-map", "cuda:63"], "--device-map"),
        "a batch size of zero": (run + ["--batch-size", "0"], "--batch-size"),
        "a negative resume budget": (run + ["--resume-mib", "-1"], "--resume-mib"),
        "a data root that is not a directory": (run + ["--data-root", str(tmp / "no")],
                                                "--data-root"),
        "a data root for explain": (["explain", DOCUMENT, "--data-root", str(a_file)],
                                    "--data-root"),
        "an output directory that is a file": (["run", DOCUMENT, "--no-track", "--out",
                                                str(a_file)], "--out"),
        "a tracking URI with an unknown scheme": (["run", DOCUMENT, "--tracking-uri",
                                                   "bogus://x"], "--tracking-uri"),
        "a tracking URI for runs": (["runs", "--tracking-uri", "bogus://x"], "--tracking-uri"),
        "a digest that is not hex": (["runs", "--produced-by", "NOT-HEX"], "--produced-by"),
        "a revision the built-in does not have": (["model", TINY, "--revision", "deadbeef"],
                                                  "--revision"),
        "a dtype outside the vocabulary": (["model", TINY, "--dtype", "fp8"], "--dtype"),
        "a config directory that does not exist": (["render", "experiment=das", "--config-dir",
                                                    str(tmp / "no")], "--config-dir"),
        "a fetch output under a file": (["fetch", "runs:/abc/rot.safetensors", "-o",
                                         str(a_file / "rot.safetensors")], "--output"),
        "a flag the verb does not have": (["explain", DOCUMENT, "--device-map", "cpu"],
                                          "--device-map"),
    }


IDS = list(_cases(Path("tmp")))


@pytest.mark.parametrize("case", IDS)
def test_a_bad_flag_value_is_one_line_naming_the_flag_and_nothing_is_written(case, tmp_path,
                                                                            capsys):
    (tmp_path / "a_file").write_text("")
    argv, flag = _cases(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    status = main(argv)
    out, err = capsys.readouterr()
    assert status != 0
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert flag in lines[0]
    assert "model.key" not in lines[0]
    assert sorted(tmp_path.rglob("*")) == before


def test_a_model_key_that_resolves_nowhere_is_blamed_on_the_key_argument(capsys):
    status = main(["model", "causalab:no-such-model"])
    _, err = capsys.readouterr()
    assert status == 1
    assert err.startswith("error: key: ")


def test_a_good_device_map_passes_the_flag_check():
    from causalab import flags

    for value in ("auto", "cpu", "sequential", "balanced_low_0"):
        flags.check_device(value, ("--device-map",))
