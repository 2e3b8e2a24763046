"""Positions: a spec built from the document, resolved per row to absolute padded indices.

Pure python over token ids and a ``decode_text`` callable; it never tokenizes, never imports
torch and never re-encodes text (docs/format.md §6.4). :func:`resolve_rows` resolves a spec on
every row of a batch; the engine calls it from one place (``causalab.engine.windows``) with
the tokenizer it holds, the compiler uses the cuts for the static width check (C16).

    >>> batch = PromptBatch("base", "input", ("a b",), ((0, 5, 6),), ((0, 1, 1),), 0, 0)
    >>> resolve(PositionSpec(index=-1), batch, 0, lambda ids: "")
    ((2,), '')
"""
from __future__ import annotations

import json
from typing import Callable, Sequence

from causalab.compile.masks import content_span
from causalab.compile.plan import PositionSpec, PromptBatch
from causalab.document.positions import Position, as_position

PLACED = ""
MISSING = "alignment_missing"
AMBIGUOUS = "alignment_ambiguous"
OUT_OF_RANGE = "out_of_range"

# A chat row's messages travel in the batch's anchors under this key, as JSON [[role, text], …].
CHAT_ANCHOR = "@chat"

Decode = Callable[[Sequence[int]], str]


def position_spec(pos: Position | int | dict) -> PositionSpec:
    """The authored ``pos`` as plan data, with its static width and raggedness.

    ``pos`` is the schema's ``Position`` (a bare int or dict is validated into one first), so
    its defaults and its static width are the schema's own.
    """
    pos = as_position(pos)
    scope = pos.scope
    fields = dict(
        frame=pos.frame,
        variable=scope.variable if scope is not None else None,
        segment=scope.segment if scope is not None else None,
        index=pos.index,
        span=tuple(pos.span) if pos.span is not None else None,
        last=pos.last,
        all=bool(pos.all),
    )
    # A generated cut other than a fixed step may keep different steps per row (docs/format.md §6.2).
    stepwise = pos.frame == "generated" and (pos.index is None or pos.index < 0)
    return PositionSpec(**fields, width=pos.width, ragged=pos.ragged or stepwise)


def spell(spec: PositionSpec) -> str:
    """The compact spelling ``explain`` prints: ``{index:-1 scope:{variable:entity}}``."""
    parts = []
    if spec.frame == "generated":
        parts.append("generated")
    if spec.index is not None:
        parts.append(f"index:{spec.index}")
    elif spec.span is not None:
        parts.append(f"span:[{spec.span[0]},{spec.span[1]}]")
    elif spec.last is not None:
        parts.append(f"last:{spec.last}")
    elif spec.all:
        parts.append("all")
    scope = [f"{k}:{v}" for k, v in (("variable", spec.variable), ("segment", spec.segment)) if v]
    if scope:
        parts.append("scope:{" + " ".join(scope) + "}")
    return "{" + " ".join(parts) + "}"


def cut(spec: PositionSpec, length: int) -> tuple[tuple[int, ...], str]:
    """Apply the cut to a run of ``length`` tokens: relative indices, or out_of_range."""
    if spec.index is not None:
        i = spec.index + length if spec.index < 0 else spec.index
        return ((i,), PLACED) if 0 <= i < length else ((), OUT_OF_RANGE)
    if spec.last is not None:
        if spec.last > length:
            return (), OUT_OF_RANGE
        return tuple(range(length - spec.last, length)), PLACED
    if spec.span is not None:
        a, b = (s + length if s < 0 else s for s in spec.span)
        if not (0 <= a < b <= length):
            return (), OUT_OF_RANGE
        return tuple(range(a, b)), PLACED
    return tuple(range(length)), PLACED if length else OUT_OF_RANGE


def character_offsets(ids: Sequence[int], decode_text: Decode) -> tuple[list[int], str]:
    """``offsets[k]`` = decoded length of the first k ids, parked across split characters."""
    text = decode_text(list(ids))
    offsets = [0]
    for k in range(1, len(ids) + 1):
        prefix = decode_text(list(ids[:k]))
        # A prefix ending inside a multi-byte character decodes to U+FFFD: the token is parked
        # (empty span) and the token completing the character owns it, so offsets never go back.
        if prefix.endswith("\ufffd") and not text[: len(prefix)].endswith("\ufffd"):
            offsets.append(offsets[-1])
        else:
            offsets.append(min(max(len(prefix), offsets[-1]), len(text)))
    offsets[-1] = len(text)
    return offsets, text


def find_anchor(text: str, value: str | None) -> tuple[tuple[int, int] | None, str]:
    """Locate ``value`` exactly once, trying as-is, ``" " + value``, then ``value.strip()``."""
    if not value:
        return None, MISSING
    for spelling in (value, " " + value, value.strip()):
        if not spelling:
            continue
        hits = [i for i in range(len(text)) if text.startswith(spelling, i)]
        if len(hits) == 1:
            return (hits[0], hits[0] + len(spelling)), PLACED
        if hits:
            return None, AMBIGUOUS
    return None, MISSING


def overlapping(offsets: Sequence[int], lo: int, hi: int, tokens: Sequence[int]) -> list[int]:
    """Tokens (among ``tokens``) whose character span overlaps ``[lo, hi)``."""
    return [k for k in tokens if offsets[k] < hi and offsets[k + 1] > lo and offsets[k] < offsets[k + 1]]


def _segment_chars(text: str, messages: list, segment: str) -> tuple[tuple[int, int] | None, str]:
    """Character span of the named chat message (``role`` or ``role[i]``) in the decoded run."""
    role, nth = segment, None
    if segment.endswith("]") and "[" in segment:
        role, nth = segment[: segment.index("[")], int(segment[segment.index("[") + 1: -1])
    spans, cursor = [], 0
    for message_role, content in messages:
        at = text.find(content, cursor) if content else -1
        if at < 0:
            continue
        cursor = at + len(content)
        if message_role == role:
            spans.append((at, cursor))
    if nth is None:
        return (spans[0], PLACED) if len(spans) == 1 else (None, AMBIGUOUS if spans else MISSING)
    return (spans[nth], PLACED) if nth < len(spans) else (None, MISSING)


def _scope(spec: PositionSpec, ids: Sequence[int], anchors: dict, row: int,
           decode_text: Decode) -> tuple[list[int] | None, str]:
    """The window (relative to ``ids``) the scope narrows to, or a reason it found none."""
    tokens = list(range(len(ids)))
    if spec.variable is None and spec.segment is None:
        return tokens, PLACED
    offsets, text = character_offsets(ids, decode_text)
    lo, hi = 0, len(text)
    if spec.segment is not None:
        raw = anchors.get(CHAT_ANCHOR, (None,) * (row + 1))[row]
        found, reason = _segment_chars(text, json.loads(raw) if raw else [], spec.segment)
        if found is None:
            return None, reason
        lo, hi = found
        tokens = overlapping(offsets, lo, hi, tokens)
    if spec.variable is not None:
        value = anchors.get(spec.variable, (None,) * (row + 1))[row]
        found, reason = find_anchor(text[lo:hi], value)
        if found is None:
            return None, reason
        tokens = overlapping(offsets, lo + found[0], lo + found[1], tokens)
    return (tokens, PLACED) if tokens else (None, MISSING)


def resolve(spec: PositionSpec, batch: PromptBatch, row: int, decode_text: Decode, *,
            generated: Sequence[int] | None = None,
            eos_ids: Sequence[int] = ()) -> tuple[tuple[int, ...], str]:
    """Resolve ``spec`` on one row: absolute padded indices (or decode steps) and a reason.

    Prompt frame: the run is the row's content span after the tokenizer's prefix (so index 0
    is the first prompt token, never BOS). Generated frame: the run is ``generated`` cut after
    its first stop token in ``eos_ids``, and the window holds decode steps.
    """
    if spec.frame == "generated":
        return _resolve_generated(spec, batch, row, decode_text, generated or (), eos_ids)
    start, end = content_span(batch.attention_mask[row], (batch.role, row))
    start = min(start + batch.prefix, end)
    ids = batch.input_ids[row][start:end]
    window, reason = _scope(spec, ids, batch.anchors, row, decode_text)
    if window is None:
        return (), reason
    picked, reason = cut(spec, len(window))
    return tuple(start + window[i] for i in picked), reason


def resolve_rows(spec: PositionSpec, batch: PromptBatch, rows: Sequence[int],
                 decode_text: Decode, where: tuple = (), *,
                 generated: Sequence[Sequence[int]] | None = None,
                 eos_ids: Sequence[int] = ()) -> list[tuple[tuple[int, ...], str]]:
    """:func:`resolve` on each of ``rows``, a refusal placed at ``where``; a generated-frame
    spec takes each row's continuation from ``generated`` (one id sequence per row)."""
    found = []
    for i, row in enumerate(rows):
        try:
            found.append(resolve(spec, batch, row, decode_text,
                                 generated=None if generated is None else generated[i],
                                 eos_ids=eos_ids))
        except RunError as error:
            raise RunError(where + ("pos",) + error.path, error.message) from None
    return found


def _resolve_generated(spec: PositionSpec, batch: PromptBatch, row: int, decode_text: Decode,
                       generated: Sequence[int], eos_ids: Sequence[int]) -> tuple[tuple[int, ...], str]:
    stop = next((i for i, t in enumerate(generated) if t in eos_ids), None)
    frame = list(generated[: stop + 1]) if stop is not None else list(generated)
    if spec.segment == "eos":
        if stop is None:
            return (), MISSING
        window, reason = [stop], PLACED
        if spec.variable is not None:
            return (), MISSING
    else:
        window, reason = _scope(spec, frame, batch.anchors, row, decode_text)
    if window is None:
        return (), reason
    picked, reason = cut(spec, len(window))
    return tuple(window[i] for i in picked), reason
