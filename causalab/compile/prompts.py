"""Prompt batches: one role's prompts tokenized once per pass and left-padded to one width.

Uses only the tokenizer's encode and chat template; it never decodes to check itself
(docs/format.md §6.4: re-encoding is not a test). A string row gets special tokens as the
model's own call adds them, so ``prefix`` (the empty string's length) is what a run skips before
index 0. A chat row is tokenized as ``apply_chat_template(tokenize=True)`` does: the rendered
template without special tokens added, so a template that writes its own BOS gets one BOS, and
its ``prefix`` is that BOS (or nothing); a role with ``generation_prompt`` ends it on the
template's generation prompt, as ``add_generation_prompt=True`` does.
"""
from __future__ import annotations

import json
from typing import Any

from causalab.compile.plan import PromptBatch
from causalab.compile.positions import CHAT_ANCHOR
from causalab.compile.rows import is_chat
from causalab.errors import CompileError

# Characters per position of a long prompt's head, tokenized to refuse it before tokenizing
# all of it. A token covers about four characters of prose, so the head of a prompt past the
# position table holds more tokens than the table; where it does not (tokens of long runs),
# the whole prompt is tokenized and counted.
_HEAD_CHARS = 32


class RememberingTokenizer:
    """A tokenizer that remembers its encodings for one compile.

    The points of a sweep tokenize the same prompts and answers again and again; the ids
    cannot differ, so each (text, special tokens) pair is encoded once. Everything else is the
    tokenizer's own.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._seen: dict[tuple[str, bool], list[int]] = {}

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        key = (text, add_special_tokens)
        if key not in self._seen:
            self._seen[key] = list(self._tokenizer(
                text, add_special_tokens=add_special_tokens)["input_ids"])
        return {"input_ids": list(self._seen[key])}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def prefix_length(tokenizer) -> int:
    """Tokens the tokenizer puts before every prompt: BOS on Llama-like, 0 on GPT-2-like."""
    return len(tokenizer("")["input_ids"])


def pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def render(value: Any, tokenizer, path: tuple, generation_prompt: bool = False) -> str:
    """A row's prompt text: the string itself, or chat messages through the chat template
    (ending on the template's generation prompt, the assistant's turn opened, when asked)."""
    if not is_chat(value):
        return value
    if not getattr(tokenizer, "chat_template", None):
        raise CompileError(path, "chat rows need a chat template and this checkpoint has none")
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _encoded(value: Any, tokenizer, path: tuple,
             generation_prompt: bool = False) -> tuple[str, list[int], int]:
    """(recorded prompt, ids, prefix) of one row; the recorded prompt is the text after the
    prefix, which is what the run's ids past the prefix decode to."""
    if not is_chat(value):
        return value, list(tokenizer(value)["input_ids"]), prefix_length(tokenizer)
    text = render(value, tokenizer, path, generation_prompt)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    bos, spelled = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "bos_token", None)
    if bos is None or ids[:1] != [bos]:
        return text, ids, 0
    if isinstance(spelled, str) and text.startswith(spelled):
        text = text[len(spelled):]
    return text, ids, 1


def _refuse_past_positions(text: str, tokenizer, positions: int, name: str, path: tuple) -> None:
    """A prompt far longer than the position table is refused from its head alone, so a
    50 MB cell is never tokenized whole: the head of ``positions * _HEAD_CHARS`` characters
    already holds more tokens than the table."""
    if len(text) <= positions * _HEAD_CHARS:
        return
    head = len(tokenizer(text[:positions * _HEAD_CHARS])["input_ids"])
    if head > positions + 1:  # C22; the cut may split one token in two
        raise CompileError(path, f"row {name} is {len(text):,} characters, at least {head - 1} "
                                 f"tokens; the checkpoint has {positions} positions")


def prompt_batch(role: str, field: str, values: tuple, tokenizer, anchors: dict,
                 path: tuple, *, positions: int | None = None, example_ids: tuple = (),
                 generation_prompt: bool = False) -> PromptBatch:
    """Tokenize every row of one role and left-pad to the longest; mask marks the content.

    The rows of one role share one prefix: chat rows and strings whose runs start differently
    (one with a BOS, one without) are refused at ``path``. ``positions``: the checkpoint's
    position table, which no row may outgrow (named by its ``example_ids`` entry, C22).
    ``generation_prompt``: the role's chat rows end on the assistant's opened turn; a role
    of plain strings has no turn to open and is refused.
    """
    rows = []
    for row, value in enumerate(values):
        name = example_ids[row] if row < len(example_ids) else str(row)
        if generation_prompt and not is_chat(value):
            raise CompileError(path, f"row {name} is a plain string: only chat rows have an "
                                     "assistant's turn to open (roles.<role>.generation_prompt)")
        if positions:
            text = render(value, tokenizer, path, generation_prompt) if is_chat(value) else value
            _refuse_past_positions(text, tokenizer, positions, name, path)
        rows.append(_encoded(value, tokenizer, path, generation_prompt))
        if positions and len(rows[-1][1]) > positions:  # C22
            raise CompileError(path, f"row {name} is {len(rows[-1][1])} tokens; the checkpoint "
                                     f"has {positions} positions")
    prompts = tuple(text for text, _, _ in rows)
    encoded = [ids for _, ids, _ in rows]
    prefixes = sorted({prefix for _, _, prefix in rows})
    if len(prefixes) > 1:
        raise CompileError(path, "chat rows and plain strings here start differently (the "
                                 "tokenizer adds a BOS the chat template does not); give the "
                                 "role one kind of row")
    width = max((len(ids) for ids in encoded), default=0)
    pad = pad_id(tokenizer)
    input_ids = tuple(tuple([pad] * (width - len(ids)) + ids) for ids in encoded)
    mask = tuple(tuple([0] * (width - len(ids)) + [1] * len(ids)) for ids in encoded)
    anchors = dict(anchors)
    if any(is_chat(v) for v in values):
        anchors[CHAT_ANCHOR] = tuple(
            json.dumps([[m["role"], m["content"]] for m in v]) if is_chat(v) else None
            for v in values)
    return PromptBatch(role=role, field=field, prompts=prompts, input_ids=input_ids,
                       attention_mask=mask, prefix=prefixes[0] if prefixes else
                       prefix_length(tokenizer), pad_id=pad,
                       anchors=anchors)


def single_token(tokenizer, text: str) -> int | None:
    """The id of ``text`` tokenized without special tokens, or None when it is not one token."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) == 1 else None
