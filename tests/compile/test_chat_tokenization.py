"""Chat rows are tokenized exactly as transformers' ``apply_chat_template(tokenize=True)`` does.

A template that writes ``{{ bos_token }}`` itself (Llama-3, Gemma) must give one BOS, not the
tokenizer's BOS in front of the template's; a template without one gives none. The oracle is
the transformers tokenizer of each directory, asked for the template's token ids directly.
The BOS-writing templates are put on built-ins' tokenizers in folders made here (Gemma-3's own
vocabulary with Gemma's turn markup, the tiny Llama's with Llama-3's).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

CHATS = [
    [{"role": "user", "content": "If today is Tuesday, what day is tomorrow?"}],
    [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi"},
     {"role": "user", "content": "If today is Friday, what day is tomorrow?"}],
]
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}")


def _with_template(source: str, folder: Path, template: str) -> str:
    """A weightless copy of ``source`` (config and tokenizer) whose chat template is ``template``."""
    folder.mkdir(parents=True)
    for item in Path(source).iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name != "chat_template.jinja":
            shutil.copy2(item, folder / item.name)
    (folder / "chat_template.jinja").write_text(template)
    return str(folder)


def _has_template(path: str) -> bool:
    folder = Path(path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    return (folder / "chat_template.jinja").is_file() or bool(config.get("chat_template"))


@pytest.fixture(scope="module")
def directories(tmp_path_factory, smollm2_dir, gemma3_dir) -> dict[str, str]:
    """Every built-in whose tokenizer has a chat template, and the two BOS-writing folders."""
    from causalab.models import BUILTINS, resolve

    found = {}
    for name in BUILTINS:
        path = resolve("causalab:" + name).path
        if _has_template(path):
            found[name] = path
    root = tmp_path_factory.mktemp("templates")
    found["gemma3-with-gemma-turns"] = _with_template(gemma3_dir, root / "gemma", GEMMA_TEMPLATE)
    found["tiny-llama-with-llama3-turns"] = _with_template(
        resolve("causalab:tiny-llama").path, root / "llama3", LLAMA3_TEMPLATE)
    return found


@pytest.fixture(scope="module")
def tokenizers(directories) -> dict:
    """The transformers tokenizer of each directory (the oracle), read once."""
    from causalab.models import load_tokenizer

    return {name: load_tokenizer(path) for name, path in directories.items()}


def _document(key: str, generation_prompt: bool | None = None) -> dict:
    role = {"field": "chat"}
    if generation_prompt is not None:
        role["generation_prompt"] = generation_prompt
    return {"model": {"key": key, "revision": "main", "dtype": "fp32"},
            "roles": {"base": role},
            "sites": {"resid": {"component": "block_output", "layers": [0]}},
            "interventions": {"look": {"reads": {"r": {"site": "resid", "pos": -1,
                                                       "input": "base"}}}},
            "steps": {"look": {"kind": "observe", "interventions": "look",
                               "rows": {"base": "chats"}}}}


def _batch(key: str, tmp_path: Path, generation_prompt: bool | None = None):
    import causalab.compile

    (tmp_path / "chats.json").write_text(json.dumps(
        [{"chat": chat, "example_id": f"c{i}"} for i, chat in enumerate(CHATS)]))
    plan = causalab.compile.compile_document(_document(key, generation_prompt),
                                             data_root=str(tmp_path))
    step = next(n for n in plan.children if getattr(n, "name", None) == "look")
    return step.pass_.inputs["base"]


def _template_ids(tokenizer, chat, generation_prompt: bool = False) -> list[int]:
    ids = tokenizer.apply_chat_template(chat, tokenize=True,
                                        add_generation_prompt=generation_prompt)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_the_built_ins_with_a_template_and_both_bos_writing_folders_are_all_here(directories):
    assert {"tiny-llama", "weekday-llama", "smollm2-135m", "gemma3-with-gemma-turns",
            "tiny-llama-with-llama3-turns"} <= set(directories)


def test_chat_rows_get_the_ids_apply_chat_template_gives_on_every_template(
        directories, tokenizers, tmp_path):
    for name, path in directories.items():
        tokenizer = tokenizers[name]
        batch = _batch(path, tmp_path)
        for row, chat in enumerate(CHATS):
            content = [t for t, m in zip(batch.input_ids[row], batch.attention_mask[row]) if m]
            assert content == _template_ids(tokenizer, chat), (name, row)


@pytest.mark.parametrize("name", ["gemma3-with-gemma-turns", "tiny-llama-with-llama3-turns"])
def test_a_template_that_writes_its_bos_gives_one_bos_which_the_run_skips(
        name, directories, tokenizers, tmp_path):
    tokenizer = tokenizers[name]
    batch = _batch(directories[name], tmp_path)
    for row in range(len(CHATS)):
        content = [t for t, m in zip(batch.input_ids[row], batch.attention_mask[row]) if m]
        assert content[0] == tokenizer.bos_token_id and content[1] != tokenizer.bos_token_id
        assert content.count(tokenizer.bos_token_id) == 1
    assert batch.prefix == 1  # index 0 of a position is the first token after that BOS
    assert not batch.prompts[0].startswith(tokenizer.bos_token)


def test_a_template_without_a_bos_gives_none_and_the_run_skips_nothing(
        directories, tokenizers, tmp_path):
    tokenizer = tokenizers["tiny-llama"]
    batch = _batch(directories["tiny-llama"], tmp_path)
    first = [t for t, m in zip(batch.input_ids[0], batch.attention_mask[0]) if m][0]
    assert first != tokenizer.bos_token_id and batch.prefix == 0
    # A plain prompt on the same tokenizer still gets the BOS the tokenizer adds.
    assert tokenizer("Hello")["input_ids"][0] == tokenizer.bos_token_id


def test_a_chat_run_on_a_bos_writing_template_gives_the_logits_of_the_template_ids(
        directories, tokenizers, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    import causalab.compile
    from causalab.engine.weights import load_model
    from causalab.engine.walk import run_plan
    from causalab.models import resolve

    folder = Path(directories["tiny-llama-with-llama3-turns"])
    for weights in Path(resolve("causalab:tiny-llama").path).glob("*.safetensors"):
        shutil.copy2(weights, folder / weights.name)
    document = _document(str(folder))
    document["sites"]["head"] = {"component": "logits"}
    document["interventions"]["look"]["reads"]["logits"] = {"site": "head", "pos": -1,
                                                            "input": "base"}
    (tmp_path / "chats.json").write_text(json.dumps(
        [{"chat": chat, "example_id": f"c{i}"} for i, chat in enumerate(CHATS)]))
    plan = causalab.compile.compile_document(document, data_root=str(tmp_path))
    run_plan(plan, load_model(plan.model), out=str(tmp_path / "out"))
    step = next(n for n in plan.children if getattr(n, "name", None) == "look")
    got = step.results["reads"]["logits"][:, 0]
    tokenizer = tokenizers["tiny-llama-with-llama3-turns"]
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    for row, chat in enumerate(CHATS):
        ids = torch.tensor([_template_ids(tokenizer, chat)])
        with torch.no_grad():
            want = model(input_ids=ids).logits[0, -1]
        assert torch.allclose(got[row], want, atol=1e-5), row


def test_a_role_with_the_generation_prompt_ends_its_chat_rows_where_the_answer_starts(
        directories, tokenizers, tmp_path):
    for name, path in directories.items():
        tokenizer = tokenizers[name]
        batch = _batch(path, tmp_path, generation_prompt=True)
        for row, chat in enumerate(CHATS):
            content = [t for t, m in zip(batch.input_ids[row], batch.attention_mask[row]) if m]
            assert content == _template_ids(tokenizer, chat, True), (name, row)
    # On the tiny Llama's ChatML template the row now ends on the assistant's opened turn,
    # where without it it ends on the user turn's `<|im_end|>\n`.
    tokenizer = tokenizers["tiny-llama"]
    opened = _batch(directories["tiny-llama"], tmp_path, generation_prompt=True).prompts[0]
    closed = _batch(directories["tiny-llama"], tmp_path).prompts[0]
    assert opened.startswith(closed) and opened != closed
    assert opened[len(closed):] == tokenizer.apply_chat_template(
        CHATS[0], tokenize=False, add_generation_prompt=True)[len(closed):]


def test_the_generation_prompt_is_part_of_the_point_s_digest_and_off_by_default():
    from causalab.document import digest, lower, validate

    def produced_by(document: dict) -> str:
        (point,) = lower(document)
        return digest(point.document)

    plain, on = _document("causalab:tiny-llama"), _document("causalab:tiny-llama", True)
    assert produced_by(plain) != produced_by(on)
    assert validate(plain)[0][1].roles["base"].generation_prompt is False


def test_a_generation_prompt_on_plain_string_rows_is_refused_at_its_role(tmp_path):
    import causalab.compile
    from causalab.errors import CompileError

    (tmp_path / "chats.json").write_text(json.dumps([{"chat": "Hello", "example_id": "s0"}]))
    with pytest.raises(CompileError) as refused:
        causalab.compile.compile_document(_document("causalab:tiny-llama", True),
                                          data_root=str(tmp_path))
    assert refused.value.path[-1] == "base" and "s0" in refused.value.message
