"""Built-in models: deterministic builds, pinned revisions, tokenizers, and loading on nnterp."""
from __future__ import annotations

import concurrent.futures

import pytest
import torch

from causalab.errors import ModelError
from causalab.models import BUILTINS, load_config, load_tokenizer, resolve
from causalab.models.build import build
from causalab.models.revision import directory_digest
from causalab.models.tokenizer import NUMBER_WORDS, WEEKDAYS

TINY = ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-qwen2"]
PROMPT = "If today is Monday, tomorrow is"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return str(tmp_path_factory.mktemp("causalab_home"))


@pytest.mark.parametrize("name", TINY)
def test_a_fresh_build_gives_the_pinned_revision(name, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    build(BUILTINS[name], first)
    build(BUILTINS[name], second)
    assert directory_digest(first) == directory_digest(second) == BUILTINS[name]["revision"]


def test_resolving_a_built_in_materialises_a_hugging_face_directory(home):
    resolved = resolve("causalab:tiny-llama", home=home)
    assert resolved.builtin and resolved.revision == BUILTINS["tiny-llama"]["revision"]
    assert resolved.path.endswith("tiny-llama-" + resolved.revision[:12])
    config = load_config(resolved.path)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 16, 4)
    assert config.intermediate_size == 64 and config.head_dim == 4
    assert resolve("causalab:tiny-llama", resolved.revision, home=home).path == resolved.path
    assert resolve("causalab:tiny-llama", "main", home=home).path == resolved.path


def test_parallel_resolves_of_one_built_in_agree_on_one_directory(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        found = list(pool.map(lambda _: resolve("causalab:tiny-qwen2", home=str(tmp_path)),
                              range(3)))
    assert len({r.path for r in found}) == 1
    assert [p.name for p in (tmp_path / "models").iterdir()] == [found[0].path.rsplit("/", 1)[1]]


def test_a_revision_that_is_not_the_tensor_digest_is_refused_at_model_revision(home):
    with pytest.raises(ModelError) as caught:
        resolve("causalab:tiny-llama", "0" * 64, home=home)
    assert caught.value.path == ("model", "revision")


def test_an_unknown_built_in_is_refused_at_model_key(home):
    with pytest.raises(ModelError) as caught:
        resolve("causalab:tiny-mamba", home=home)
    assert caught.value.path == ("model", "key")


def test_a_hub_id_not_in_the_local_cache_is_refused_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError) as caught:
        resolve("meta-llama/Llama-3.2-1B")
    assert caught.value.path == ("model", "key")
    assert "\n" not in str(caught.value) and "causalab:tiny-llama" in str(caught.value)


def test_a_local_directory_is_checked_only_against_a_tensor_digest(home):
    path = resolve("causalab:tiny-gpt2", home=home).path
    assert resolve(path, "main").path == path and not resolve(path).builtin
    assert resolve(path, BUILTINS["tiny-gpt2"]["revision"]).path == path
    with pytest.raises(ModelError) as caught:
        resolve(path, "f" * 64)
    assert caught.value.path == ("model", "revision")


@pytest.mark.parametrize("name", TINY)
def test_every_weekday_and_number_word_with_a_leading_space_is_one_token(name, home):
    tokenizer = load_tokenizer(resolve("causalab:" + name, home=home).path)
    for word in WEEKDAYS + NUMBER_WORDS:
        assert len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1, word
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None


@pytest.mark.parametrize("name", TINY)
def test_decoding_growing_prefixes_gives_the_text_back(name, home):
    tokenizer = load_tokenizer(resolve("causalab:" + name, home=home).path)
    text = "What day is 3 days after Monday? Zebras (x7) ~ eat#9 quickly!"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    prefixes = [tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1)]
    assert all(text.startswith(p) for p in prefixes) and prefixes[-1] == text


@pytest.mark.parametrize("name,bos", [("tiny-llama", True), ("tiny-gemma2", True),
                                      ("tiny-gpt2", False), ("tiny-qwen2", False)])
def test_llama_and_gemma2_prepend_bos_while_gpt2_and_qwen2_do_not(name, bos, home):
    tokenizer = load_tokenizer(resolve("causalab:" + name, home=home).path)
    assert tokenizer("")["input_ids"] == ([tokenizer.bos_token_id] if bos else [])


def test_the_gpt2_tokenizer_tells_a_leading_space_apart(home):
    tokenizer = load_tokenizer(resolve("causalab:tiny-gpt2", home=home).path)
    assert tokenizer(" two")["input_ids"] != tokenizer("two")["input_ids"]


def test_the_tiny_llama_renders_a_chat_prompt(home):
    tokenizer = load_tokenizer(resolve("causalab:tiny-llama", home=home).path)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}],
                                         tokenize=False, add_generation_prompt=True)
    assert "Hello" in text and text.endswith("<|assistant|>\n")


def _load_on_nnterp(path, tokenizer, family):
    from nnterp import StandardizedTransformer
    from nnterp.rename_utils import RenameConfig, default_attention_prob_source

    extra = {}
    if family == "tiny-gpt2":
        extra["rename_config"] = RenameConfig(attn_prob_source=default_attention_prob_source)
    return StandardizedTransformer(path, tokenizer=tokenizer, enable_attention_probs=True,
                                   **extra)


@pytest.mark.parametrize("name", TINY)
def test_nnterp_loads_each_family_and_its_logits_match_a_plain_forward(name, home):
    from transformers import AutoModelForCausalLM

    path = resolve("causalab:" + name, home=home).path
    tokenizer = load_tokenizer(path)
    model = _load_on_nnterp(path, tokenizer, name)
    with model.trace(PROMPT):
        probs = model.attention_probabilities[0].save()
        attention = model.attentions_output[0].save()
        mlp = model.mlps_output[0].save()
        layer = model.layers_output[0].save()
        final = model.ln_final.output.save()
        logits = model.logits.save()
    plain = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        expected = plain(**inputs).logits
    rows, tokens = inputs["input_ids"].shape
    assert layer.shape == attention.shape == mlp.shape == final.shape == (rows, tokens, 16)
    assert probs.shape == (rows, 4, tokens, tokens)
    torch.testing.assert_close(probs.sum(-1), torch.ones(rows, 4, tokens))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


WEEKDAY = ["weekday-llama", "weekday-gpt2", "weekday-gemma2", "weekday-qwen2"]


@pytest.mark.parametrize("name", WEEKDAY)
def test_a_shipped_weekday_model_resolves_to_its_pinned_revision(name):
    resolved = resolve("causalab:" + name, BUILTINS[name]["revision"])
    assert resolved.builtin and resolved.revision == BUILTINS[name]["revision"]
    config = load_config(resolved.path)
    assert config.num_hidden_layers == 4 and config.hidden_size == 64
    with pytest.raises(ModelError) as caught:
        resolve("causalab:" + name, "0" * 64)
    assert caught.value.path == ("model", "revision")


def test_weekday_llama_answers_held_out_day_arithmetic_and_every_one_step_prompt():
    from transformers import AutoModelForCausalLM

    from causalab.models.weekday import held_out_rows, one_step_rows

    path = resolve("causalab:weekday-llama").path
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()

    def accuracy(rows):
        batch = tokenizer([prompt for prompt, _ in rows], return_tensors="pt", padding=True)
        answers = torch.tensor([tokenizer(answer, add_special_tokens=False)["input_ids"][0]
                                for _, answer in rows])
        with torch.no_grad():
            logits = model(**batch).logits[:, -1]
        return (logits.argmax(-1) == answers).float().mean().item()

    assert accuracy(held_out_rows()) >= 0.95
    assert accuracy(one_step_rows()) == 1.0
