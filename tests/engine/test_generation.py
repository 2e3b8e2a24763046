"""Generation (FORMAT §11): until the walk decodes, a decoding intervention is refused at run
time at its path, before any save is written (QUARANTINE.md lists the missing decode tests)."""
from __future__ import annotations

import pytest

from causalab.errors import RunError


def test_a_decoding_intervention_is_refused_at_its_decode_path_before_any_save(tiny, kit, tmp_path):
    from causalab.pipeline import run_document

    resolved = tiny("tiny-llama")
    data_root = kit.write_table(tmp_path / "data", "pairs", kit.pair_rows())
    document = kit.patching_document(resolved)
    document["interventions"]["patch"]["decode"] = 2
    with pytest.raises(RunError) as caught:
        run_document(document, out=str(tmp_path / "out"), data_root=data_root)
    assert caught.value.path == ("interventions", "patch", "decode")
    assert not (tmp_path / "out" / "iia.json").exists()
