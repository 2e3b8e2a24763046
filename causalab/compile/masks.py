"""A row's content in its attention mask: the one contiguous run of ones, or a refusal (R5).

Below both the plan (a batch counts its rows' prompt tokens once) and the position rules (a cut
is taken inside the content span); imports nothing of causalab's but its errors.

    >>> content_span((0, 0, 1, 1, 1))
    (2, 5)
"""
from __future__ import annotations

from typing import Sequence

from causalab.errors import RunError


def content_span(mask: Sequence[int], where: tuple = ()) -> tuple[int, int]:
    """The row's contiguous non-padding span ``[start, end)``; a gap in it is refused (R5)."""
    ones = [i for i, m in enumerate(mask) if m]
    if not ones:
        return 0, 0
    start, end = ones[0], ones[-1] + 1
    if len(ones) != end - start:
        raise RunError(where, "the attention mask is not contiguous on this row")
    return start, end
