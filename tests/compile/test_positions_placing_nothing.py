"""A position that selects no token on any row is refused by ``explain`` (C23), naming the op
and the rows, and by ``run`` before the weights load: a ``segment: user`` scope on rows that
carry no chat, and a span empty on every row. A span that places rows still explains."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from causalab.cli.main import main

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "documents" / "data")
READ = ("interventions", "patch", "reads", "v_cf", "pos")
WRITE = ("interventions", "patch", "writes", "patch", "pos")
EXAMPLES = ("Thu-Sat", "Fri-Sun", "Sat-Thu", "Sun-Fri")  # weekdays/train's example ids


def _patching(read_pos, write_pos=-1) -> dict:
    document = json.loads((REPO / "documents" / "v2" / "patching.json").read_text())
    document["interventions"]["patch"]["reads"]["v_cf"]["pos"] = read_pos
    document["interventions"]["patch"]["writes"]["patch"]["pos"] = write_pos
    return document


CASES = {
    "a_user_segment_on_plain_rows": (_patching({"index": -1, "scope": {"segment": "user"}}),
                                     READ, "alignment_missing"),
    "a_span_empty_on_every_row": (_patching({"span": [-1, 2]}, {"span": [-1, 2]}), READ,
                                  "out_of_range"),
    "a_written_span_empty_on_every_row": (_patching(-1, {"span": [-1, 2]}), WRITE, "out_of_range"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_position_placing_nothing_on_any_row_is_refused_by_explain_naming_the_rows(
        case, tmp_path, capsys):
    document, path, reason = CASES[case]
    (tmp_path / "doc.json").write_text(json.dumps(document))
    status = main(["explain", str(tmp_path / "doc.json"), "--data-root", DATA])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {'.'.join(path)}: "), lines[0]
    assert reason in lines[0] and all(example in lines[0] for example in EXAMPLES)


def test_run_refuses_it_before_the_model_loads_and_tracks_nothing(tmp_path, capsys,
                                                                  monkeypatch):
    import causalab.engine.weights as engine_load

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(engine_load, "_load", never)
    document, path, _ = CASES["a_user_segment_on_plain_rows"]
    (tmp_path / "doc.json").write_text(json.dumps(document))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    status = main(["run", str(tmp_path / "doc.json"), "--data-root", DATA, "--out",
                   str(tmp_path / "out"), "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith(f"error: {'.'.join(path)}: "), err
    assert not (tmp_path / "out").exists()


def test_a_span_that_places_every_row_still_explains(tmp_path, capsys):
    (tmp_path / "doc.json").write_text(json.dumps(_patching({"span": [0, 1]})))
    assert main(["explain", str(tmp_path / "doc.json"), "--data-root", DATA]) == 0, \
        capsys.readouterr().err
