"""Compile reads config and tokenizer from their files; the ids are transformers' own.

``causalab.models.readers`` spares ``explain`` the transformers import. Every check here holds
it to transformers itself: the same token ids for every string of the shipped data on every
built-in, the same facts, and the same plan for every corpus document; and where the files
say something only transformers applies, the reader hands over to transformers.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from causalab.models import BUILTINS, load_config, load_tokenizer, resolve
from causalab.models.readers import FileConfig, FileTokenizer, read_config, read_tokenizer

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "documents" / "data"
CORPUS = sorted((REPO / "documents" / "v2").glob("*.json")) + sorted(
    (REPO / "documents" / "known").glob("*.json"))


def _strings() -> list[str]:
    """Every string cell of the shipped tables (prompts, answers, chat contents), plus edges."""
    found: set[str] = {"", " ", "<bos>", "a<eos>b", "héllo wörld", "\n\n", "12 + 30 = 42"}

    def walk(value):
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    for path in DATA.rglob("*.json"):
        walk(json.loads(path.read_text()))
    return sorted(found)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_the_file_tokenizer_gives_transformers_ids_for_every_shipped_string(name):
    path = resolve(f"causalab:{name}").path
    mine, reference = read_tokenizer(path), load_tokenizer(path)
    assert isinstance(mine, FileTokenizer)
    for text in _strings():
        for special in (True, False):
            assert (mine(text, add_special_tokens=special)["input_ids"]
                    == reference(text, add_special_tokens=special)["input_ids"]), (text, special)
    assert (mine.pad_token_id, mine.eos_token_id, mine.bos_token_id) == (
        reference.pad_token_id, reference.eos_token_id, reference.bos_token_id)
    assert mine.chat_template == reference.chat_template


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_the_file_config_gives_the_facts_transformers_gives(name):
    from causalab.compile.addresses import component_table, facts

    path = resolve(f"causalab:{name}").path
    mine, reference = read_config(path), load_config(path)
    assert isinstance(mine, FileConfig)
    assert facts(mine) == facts(reference)
    assert component_table(mine, "eager") == component_table(reference, "eager")


def _copy_of(name: str, folder: Path) -> Path:
    source = Path(resolve(f"causalab:{name}").path)
    target = folder / name
    target.mkdir()
    for item in source.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy(item, target / item.name)
    return target


def test_a_tokenizer_config_key_the_reader_does_not_know_hands_over_to_transformers(tmp_path):
    folder = _copy_of("tiny-gpt2", tmp_path)
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()),
                                       "add_eos_token": True}))
    tokenizer = read_tokenizer(str(folder))
    assert not isinstance(tokenizer, FileTokenizer)
    reference = load_tokenizer(str(folder))
    assert tokenizer("Monday")["input_ids"] == reference("Monday")["input_ids"]


def test_a_file_tokenizer_is_read_once_until_its_files_change(tmp_path):
    folder = _copy_of("tiny-gpt2", tmp_path)
    first = read_tokenizer(str(folder))
    assert isinstance(first, FileTokenizer)
    assert read_tokenizer(str(folder)) is first
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()),
                                       "add_eos_token": True}))
    assert not isinstance(read_tokenizer(str(folder)), FileTokenizer)  # read again, refused


def test_a_config_missing_a_key_with_a_class_default_is_read_by_transformers(tmp_path):
    folder = _copy_of("tiny-gemma2", tmp_path)
    config_file = folder / "config.json"
    values = json.loads(config_file.read_text())
    del values["head_dim"]
    config_file.write_text(json.dumps(values))
    config = read_config(str(folder))
    assert not isinstance(config, FileConfig)
    assert config.head_dim == load_config(str(folder)).head_dim


@pytest.mark.parametrize("path", CORPUS, ids=[f"{p.parent.name}/{p.stem}" for p in CORPUS])
def test_a_corpus_document_compiles_to_the_plan_transformers_would_give(path, monkeypatch):
    import causalab.compile
    from causalab.models import readers

    raw = json.loads(path.read_text())
    monkeypatch.chdir(REPO)  # bundle paths are relative to the working directory
    plan = causalab.compile.compile_document(raw, data_root=str(DATA))
    monkeypatch.setattr(readers, "read_config", load_config)
    monkeypatch.setattr(readers, "read_tokenizer", load_tokenizer)
    assert causalab.compile.compile_document(raw, data_root=str(DATA)) == plan


def test_explain_imports_neither_transformers_nor_torch():
    resolve("causalab:tiny-llama")  # built once here: building a built-in does need torch
    code = ("import sys; from causalab.cli.main import main; "
            "status = main(['explain', 'documents/v2/head_patching.json']); "
            "print(status, sorted(m for m in ('transformers', 'torch', 'nnsight') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "0 []"
