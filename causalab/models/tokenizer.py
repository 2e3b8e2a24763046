"""The built-in tokenizer: a byte-level BPE trained here, from a fixed corpus, in milliseconds.

It never downloads anything and never sees a file: the corpus is the word lists below. Every
weekday name and every number word from one to ten, each with a leading space, is one token,
which the weekday tasks need for single-token answers. Byte-level pieces cover every byte, so
ordinary text never maps to an unknown token and ``decode`` gives the text back. Families
differ only in whether a BOS token is prepended (``add_bos``).
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
SPECIALS = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}
VOCAB_SIZE = 1024

_COMMON_WORDS = (
    "the of and to in is it that was for on are as with he they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if "
    "will up other about out many then them these so some her would make like him into time has "
    "look more write go see number no way could people my than first water been call who oil its "
    "now find long down day did get come made may part today tomorrow yesterday after before days "
    "week weekend answer question next previous day later earlier what which following "
    "user assistant system hello world yes no the a an"
)
_CHAT = "<|user|>\n<|assistant|>\n<|system|>\n"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _corpus() -> list[str]:
    """A fixed list of lines; repetition makes the wanted words win BPE's merges."""
    lines = []
    for i, day in enumerate(WEEKDAYS):
        nxt = WEEKDAYS[(i + 1) % 7]
        lines.append(f"If today is {day}, tomorrow is {nxt}.")
        for n, word in enumerate(NUMBER_WORDS, start=1):
            later = WEEKDAYS[(i + n) % 7]
            lines.append(f"What day is {n} days after {day}? {later}")
            lines.append(f"What day is {word} days after {day}? {later}")
    lines += [" ".join(WEEKDAYS)] * 40 + [" " + " ".join(NUMBER_WORDS)] * 40
    lines += [_COMMON_WORDS] * 8 + [_COMMON_WORDS.title()] * 2
    lines += [" ".join(str(n) for n in range(100))] * 4 + [_CHAT] * 4
    return lines


def build_tokenizer(add_bos: bool) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE and wrap it, left padding, BOS prepended when ``add_bos``.

    >>> tok = build_tokenizer(add_bos=True)
    >>> tok("")["input_ids"] == [tok.bos_token_id]
    True
    """
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(), trainer=trainer)
    bos = SPECIALS["bos"]
    if add_bos:
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
            special_tokens=[(bos, core.token_to_id(bos))],
        )
    else:
        core.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=bos, eos_token=SPECIALS["eos"], pad_token=SPECIALS["pad"],
        unk_token=SPECIALS["unk"], padding_side="left", clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    _check(tokenizer)
    return tokenizer


def _check(tokenizer: PreTrainedTokenizerFast) -> None:
    """Refuse a tokenizer that breaks the promises in the module docstring."""
    for word in WEEKDAYS + NUMBER_WORDS:
        ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise RuntimeError(f"built-in tokenizer splits ' {word}' into {len(ids)} tokens")
