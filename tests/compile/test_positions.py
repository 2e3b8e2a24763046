"""Position resolution on the real tokenizers of the four built-in families (docs/format.md §6)."""
from __future__ import annotations

import json

import pytest

from causalab.compile.positions import (AMBIGUOUS, MISSING, OUT_OF_RANGE, character_offsets,
                                        position_spec, resolve)
from causalab.compile.prompts import prompt_batch
from causalab.compile.rows import anchor_values, load_rows

FAMILIES = ("llama", "gpt2", "gemma2", "qwen2")
PROMPTS = ("If today is Thursday, tomorrow is", "If today is Xylophoneday, tomorrow is")


def batch(tokenizer, prompts=PROMPTS, entity=("Thursday", "Xylophoneday")):
    return prompt_batch("base", "input", prompts, tokenizer, {"entity": entity}, ())


def piece(tokenizer, b, index):
    return tokenizer.decode([b.input_ids[0][index]]) if index is not None else None


@pytest.mark.parametrize("family", FAMILIES)
def test_index_zero_is_the_first_prompt_token_never_bos(builtin, family):
    tokenizer = builtin[family][2]
    b = batch(tokenizer)
    bos = len(tokenizer("")["input_ids"])
    assert bos == (1 if family in ("llama", "gemma2") else 0)
    for row in range(2):
        (first,), reason = resolve(position_spec(0), b, row, tokenizer.decode)
        assert reason == "" and b.attention_mask[row][first] == 1
        assert first == b.attention_mask[row].index(1) + bos
        assert tokenizer.decode([b.input_ids[row][first]]) == "If"


@pytest.mark.parametrize("family", FAMILIES)
def test_minus_one_is_the_last_token_and_left_padding_shares_it(builtin, family):
    tokenizer = builtin[family][2]
    b = batch(tokenizer)
    last = b.tokens - 1
    assert [resolve(position_spec(-1), b, r, tokenizer.decode) for r in range(2)] == [((last,), "")] * 2


@pytest.mark.parametrize("family", FAMILIES)
def test_an_entity_anchor_gives_a_ragged_window_and_its_last_token(builtin, family):
    tokenizer = builtin[family][2]
    b = batch(tokenizer)
    spans = [resolve(position_spec({"all": True, "scope": {"variable": "entity"}}), b, r,
                     tokenizer.decode) for r in range(2)]
    (one, r0), (many, r1) = spans
    assert r0 == r1 == "" and len(one) == 1 and len(many) > 1
    assert tokenizer.decode([b.input_ids[0][i] for i in one]).strip() == "Thursday"
    assert "Xylophoneday" in tokenizer.decode([b.input_ids[1][i] for i in many])
    last = resolve(position_spec({"index": -1, "scope": {"variable": "entity"}}), b, 1,
                   tokenizer.decode)
    assert last == ((many[-1],), "")
    spec = position_spec({"index": -1, "scope": {"variable": "entity"}})
    assert spec.width == 1 and spec.ragged


@pytest.mark.parametrize("family", FAMILIES)
def test_an_anchor_found_twice_is_ambiguous_and_one_not_found_is_missing(builtin, family):
    tokenizer = builtin[family][2]
    b = prompt_batch("base", "input", PROMPTS, tokenizer,
                     {"v": ("day", "Monday"), "w": (None, "")}, ())
    spec = lambda v: position_spec({"index": -1, "scope": {"variable": v}})
    assert resolve(spec("v"), b, 0, tokenizer.decode) == ((), AMBIGUOUS)
    assert resolve(spec("v"), b, 1, tokenizer.decode) == ((), MISSING)
    assert resolve(spec("w"), b, 0, tokenizer.decode) == ((), MISSING)


@pytest.mark.parametrize("family", FAMILIES)
def test_cuts_outside_the_run_are_out_of_range(builtin, family):
    tokenizer = builtin[family][2]
    b = batch(tokenizer)
    assert resolve(position_spec({"index": 40}), b, 0, tokenizer.decode) == ((), OUT_OF_RANGE)
    scoped = position_spec({"span": [0, 2], "scope": {"variable": "entity"}})
    assert resolve(scoped, b, 0, tokenizer.decode) == ((), OUT_OF_RANGE)
    assert resolve(scoped, b, 1, tokenizer.decode)[1] == ""


def test_spans_and_last_count_from_the_run(builtin):
    tokenizer = builtin["llama"][2]
    b = batch(tokenizer)
    end = b.tokens
    assert resolve(position_spec({"last": 2}), b, 0, tokenizer.decode) == ((end - 2, end - 1), "")
    assert resolve(position_spec({"span": [1, -5]}), b, 0, tokenizer.decode)[0] == tuple(
        range(b.attention_mask[0].index(1) + 2, end - 5))


def test_a_split_character_parks_its_token_so_offsets_never_run_back(builtin):
    tokenizer = builtin["gpt2"][2]
    ids = tokenizer("Say 日本 and 🎉 now")["input_ids"]
    offsets, text = character_offsets(ids, tokenizer.decode)
    assert text == "Say 日本 and 🎉 now"
    assert offsets == sorted(offsets) and offsets[-1] == len(text)
    assert len(ids) > len(text.split())  # byte-level pieces: several tokens per character
    b = prompt_batch("base", "input", (text,), tokenizer, {"e": ("🎉",)}, ())
    window, reason = resolve(position_spec({"all": True, "scope": {"variable": "e"}}), b, 0,
                             tokenizer.decode)
    # The completing byte owns the whole character; the bytes before it are parked.
    upto = lambda n: tokenizer.decode(list(b.input_ids[0][:n]))
    assert reason == "" and len(window) == 1
    assert upto(window[0] + 1).endswith("🎉") and not upto(window[0]).endswith("🎉")


def test_the_variables_sibling_wins_over_the_top_level_column(builtin, data_root):
    table = load_rows("days", str(data_root), ("steps", "s", "rows", "counterfactual"))
    sibling = anchor_values(table, "counterfactual_inputs[0]", "entity", ())
    top = anchor_values(table, "input", "entity", ())
    assert sibling == ("Saturday", "Sunday", "Tuesday") and top == ("Thursday", "Friday", "Monday")
    tokenizer = builtin["llama"][2]
    prompts = tuple(r["counterfactual_inputs"][0] for r in table.rows)
    b = prompt_batch("counterfactual", "counterfactual_inputs[0]", prompts, tokenizer,
                     {"entity": sibling}, ())
    (i,), _ = resolve(position_spec({"index": -1, "scope": {"variable": "entity"}}), b, 0,
                      tokenizer.decode)
    assert tokenizer.decode([b.input_ids[0][i]]) == " Saturday"


def test_a_chat_segment_resolves_to_its_message_and_a_repeated_role_is_ambiguous(builtin):
    tokenizer = builtin["llama"][2]
    chat = [{"role": "user", "content": "If today is Tuesday, what day is tomorrow?"},
            {"role": "assistant", "content": "Wednesday"},
            {"role": "user", "content": "If today is Thursday, what day is tomorrow?"}]
    b = prompt_batch("base", "chat", (chat,), tokenizer, {"entity": ("Thursday",)}, ())
    spec = lambda seg, **cut: position_spec({**(cut or {"all": True}), "scope": {"segment": seg}})
    window, reason = resolve(spec("assistant"), b, 0, tokenizer.decode)
    assert reason == "" and tokenizer.decode([b.input_ids[0][i] for i in window]).strip() == "Wednesday"
    assert resolve(spec("user"), b, 0, tokenizer.decode) == ((), AMBIGUOUS)
    second, _ = resolve(spec("user[1]"), b, 0, tokenizer.decode)
    assert "Thursday" in tokenizer.decode([b.input_ids[0][i] for i in second])
    both = position_spec({"index": -1, "scope": {"segment": "user[1]", "variable": "entity"}})
    (i,), _ = resolve(both, b, 0, tokenizer.decode)
    assert tokenizer.decode([b.input_ids[0][i]]) == " Thursday"


def test_the_generated_frame_cuts_decode_steps_up_to_the_stop_token(builtin):
    tokenizer = builtin["llama"][2]
    eos = tokenizer.eos_token_id
    friday = tokenizer(" Friday", add_special_tokens=False)["input_ids"]
    b = prompt_batch("base", "input", ("If today is Thursday, tomorrow is",) * 2, tokenizer,
                     {"said": (" Friday", " Friday")}, ())
    stopped = friday + [eos, 7, 7]
    never = [7] * len(friday) + [7, 7, 7]
    gen = lambda pos, g: resolve(position_spec({"frame": "generated", **pos}), b, 0,
                                 tokenizer.decode, generated=g, eos_ids=(eos,))
    assert gen({"index": 1}, stopped) == ((1,), "")
    assert gen({"all": True}, stopped) == (tuple(range(len(friday) + 1)), "")
    assert gen({"index": -1, "scope": {"segment": "eos"}}, stopped) == ((len(friday),), "")
    assert gen({"index": -1, "scope": {"segment": "eos"}}, never) == ((), MISSING)
    assert gen({"index": -1, "scope": {"variable": "said"}}, stopped) == ((len(friday) - 1,), "")
    assert gen({"index": -1, "scope": {"variable": "said"}}, never) == ((), MISSING)


def test_a_data_table_rewritten_in_place_is_read_again(tmp_path):
    # Tables are kept per process by their file stamp; an edited table must not be served stale.
    table = tmp_path / "pairs.json"
    table.write_text(json.dumps([{"input": "a"}]))
    assert [r["input"] for r in load_rows("pairs", str(tmp_path), ("rows",)).rows] == ["a"]
    table.write_text(json.dumps([{"input": "b"}, {"input": "c"}]))
    assert [r["input"] for r in load_rows("pairs", str(tmp_path), ("rows",)).rows] == ["b", "c"]


def test_a_table_refusal_names_the_split_or_the_row_and_what_the_cell_is(tmp_path):
    from causalab.compile.rows import role_values
    from causalab.errors import CompileError

    rows = [{"example_id": "a", "input": "x", "cf": ["y"]},
            {"example_id": "b", "cf": "not a list"}]
    (tmp_path / "pairs.json").write_text(json.dumps(rows))
    with pytest.raises(CompileError, match="names no split after '#'"):
        load_rows("pairs#", str(tmp_path), ("rows",))
    table = load_rows("pairs", str(tmp_path), ("rows",))
    with pytest.raises(CompileError) as caught:
        role_values(table, "input", ("roles", "base"))
    assert caught.value.message == "row 1 (example_id 'b'): field 'input': no 'input' in the row"
    with pytest.raises(CompileError) as caught:
        role_values(table, "cf[0]", ("roles", "counterfactual"))
    assert caught.value.message == ("row 1 (example_id 'b'): field 'cf[0]': 'cf' is a str, "
                                    "not a list to index")


def test_a_data_table_saved_with_a_byte_order_mark_reads_as_a_document_with_one_does(tmp_path):
    # Windows editors write one; a document with it was read, a table with it refused.
    (tmp_path / "pairs.json").write_bytes(b"\xef\xbb\xbf" + json.dumps([{"input": "a"}]).encode())
    assert [r["input"] for r in load_rows("pairs", str(tmp_path), ("rows",)).rows] == ["a"]
