"""The weekday task the ``weekday-*`` built-ins are trained on: prompts, answers and the split.

Plain strings only; no tensors, no tokenizer. One-step prompts ("If today is Monday, tomorrow
is" -> " Tuesday") are all trained; day arithmetic ("What day is 3 days after Monday?") holds out
one weekday for every count and direction, never the same weekday for counts ``n`` and ``n + 7``,
so a held-out prompt is answerable by the rule (counts seven apart agree), not by recall.
"""
from __future__ import annotations

from causalab.models.tokenizer import WEEKDAYS

ONE_STEP = (
    ("If today is {day}, tomorrow is", 1),
    ("Today is {day}, so tomorrow is", 1),
    ("The day after {day} is", 1),
    ("If today is {day}, yesterday was", -1),
    ("The day before {day} is", -1),
)
ARITHMETIC = (
    ("What day is {n} days after {day}?", 1),
    ("What day is {n} days before {day}?", -1),
)
COUNTS = tuple(range(0, 21))


def _answer(day: int, shift: int) -> str:
    return " " + WEEKDAYS[(day + shift) % 7]


def is_held_out(n: int, day: int, sign: int) -> bool:
    """One weekday per (count, direction); counts seven apart hold out different weekdays."""
    return (2 * n + 3 * (n // 7) + (2 if sign < 0 else 0)) % 7 == day


def one_step_rows() -> list[tuple[str, str]]:
    """Every (prompt, answer) of the one-step templates: 5 templates x 7 days."""
    return [(template.format(day=name), _answer(day, sign))
            for template, sign in ONE_STEP for day, name in enumerate(WEEKDAYS)]


def arithmetic_rows(held_out: bool) -> list[tuple[str, str]]:
    """(prompt, answer) of day arithmetic on the training side or the held-out side."""
    return [(template.format(n=n, day=name), _answer(day, sign * n))
            for template, sign in ARITHMETIC for n in COUNTS
            for day, name in enumerate(WEEKDAYS) if is_held_out(n, day, sign) == held_out]


def train_rows() -> list[tuple[str, str]]:
    """All one-step rows and the arithmetic rows that are not held out."""
    return one_step_rows() + arithmetic_rows(held_out=False)


def held_out_rows() -> list[tuple[str, str]]:
    """The arithmetic rows never seen in training (42 of them)."""
    return arithmetic_rows(held_out=True)
