"""Resolving model keys as the compile path does: local directories and shipped built-ins.

Only ``resolve``, the tensor digest and the check the loader makes (``verify_weights``) are
exercised; no model is loaded into nnterp.
"""
from __future__ import annotations

import os
import shutil
import stat

import pytest
from safetensors.torch import load_file, save_file

from causalab.errors import ModelError
from causalab.models import BUILTINS, resolve
from causalab.models import revision as digest


def test_a_local_directory_pinned_by_digest_without_weights_is_refused_at_model_key(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError) as caught:
        resolve(str(tmp_path), "a" * 64)
    assert caught.value.path == ("model", "key")


def test_a_shipped_built_in_resolves_without_reading_its_weights_and_a_changed_copy_is_refused_at_load(
        tmp_path):
    from causalab.models import verify_weights

    before = digest._digest_of.cache_info()
    first = resolve("causalab:weekday-gpt2")
    again = resolve("causalab:weekday-gpt2", first.revision)
    assert digest._digest_of.cache_info() == before  # nothing was hashed
    assert again.revision == first.revision == BUILTINS["weekday-gpt2"]["revision"]
    assert verify_weights(first.key, first.path, None) == first.revision
    copy = tmp_path / "copy"
    shutil.copytree(first.path, copy)
    assert resolve(str(copy), first.revision).revision == first.revision
    assert verify_weights(str(copy), str(copy), first.revision) == first.revision
    weights = sorted(copy.glob("*.safetensors"))[0]
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1
    save_file(tensors, str(weights))
    assert resolve(str(copy), first.revision).revision == first.revision  # checked at load
    with pytest.raises(ModelError) as caught:
        verify_weights(str(copy), str(copy), first.revision)
    assert caught.value.path == ("model", "revision") and first.revision in caught.value.message
    with pytest.raises(ModelError) as caught:  # the record made at load is now current
        resolve(str(copy), first.revision)
    assert caught.value.path == ("model", "revision")


def test_writing_a_built_in_draws_no_transformers_bar_and_leaves_bars_as_they_were(
        tmp_path, capfd):
    # "Writing model shards: 100%|…" reached stderr on every first use and rebuild, in logs
    # and under CAUSALAB_QUIET alike; loading was already quiet.
    from transformers.utils import logging as hf_logging

    from causalab.models.build import build

    entry = BUILTINS["tiny-llama"]
    before = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # as a user's process has them
    try:
        build(entry, tmp_path)
        assert "model shards" not in capfd.readouterr().err
        assert (tmp_path / "model.safetensors").is_file() and hf_logging.is_progress_bar_enabled()
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


@pytest.mark.parametrize("umask, file_mode, folder_mode",
                         [(0o002, 0o664, 0o775), (0o077, 0o600, 0o700)],
                         ids=["group_shared", "private"])
def test_a_built_in_materialised_into_a_fresh_cache_follows_the_umask_weights_included(
        tmp_path, umask, file_mode, folder_mode):
    previous = os.umask(umask)
    try:
        resolved = resolve("causalab:tiny-llama", home=str(tmp_path / "home"))
    finally:
        os.umask(previous)
    made = sorted((tmp_path / "home").rglob("*"))
    assert any(path.name == "model.safetensors" for path in made)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in made if p.is_file()} == \
        {p.name: file_mode for p in made if p.is_file()}
    assert {stat.S_IMODE(p.stat().st_mode) for p in made if p.is_dir()} == {folder_mode}
    assert resolved.path.startswith(str(tmp_path / "home"))
