"""Prefix resume (docs/platform.md §7): where an intervened forward may start from cached values.

A forward whose every tap sits at block ``R`` or later computes blocks ``0 … R−1`` exactly
as the un-intervened forward on the same rows does, so its trace can skip them and hand
block ``R−1``'s cached output on instead (nnsight's ``skip``: bit-exact on the built-in
families). Inside block ``R`` the same holds for its parts: when the first tap is at the
attention's output or later, the attention module's own output is the un-intervened one
(a write there replaces some positions of it, the others stay), so it is served from the
cache too; from the MLP's output on, the MLP as well. This module says where a forward
may enter from plan data alone; the planner decides whether it does (the resume budget, the
values kept), the cached values live in the document cache and the walk's trace skips.
"""
from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple, Union

from causalab.compile.plan import Address, Forward
from causalab.document import vocab
from causalab.engine.forwards import tap_ops
from causalab.lazy import torch

# A block's parts in forward order, each with the vocabulary order of the component that
# first sees its whole output: a first tap there or later leaves the part's output as it was.
PARTS = ("attention", "mlp")
_DONE_AT = {"attention": vocab.COMPONENTS["attention_output"]["order"][1],
            "mlp": vocab.COMPONENTS["mlp_output"]["order"][1]}
# nnterp's envoy of each part at a layer.
PART_MODULES = {"attention": "attentions", "mlp": "mlps"}
_BLOCK_OUTPUT = vocab.COMPONENTS["block_output"]["accessor"]
_BLOCK_OUTPUT_ORDER = vocab.COMPONENTS["block_output"]["order"][1]
Part = Literal[PARTS]
# A kept value a resumed trace needs: the residual leaving a block, or a block's part output.
Need = Union[int, tuple[int, Part]]


class Resume(NamedTuple):
    """Where a trace enters: block ``layer`` (its input the cached residual leaving block
    ``layer − 1``), with ``parts`` of that block served from their cached outputs."""

    layer: int
    parts: tuple[Part, ...] = ()

    def needs(self) -> tuple[Need, ...]:
        """The cached values this entry takes: ``layer − 1`` (a residual) and ``(layer, part)``
        per part."""
        return ((self.layer - 1,) if self.layer else ()) + tuple(
            (self.layer, part) for part in self.parts)


def _entry(address: Address) -> Resume:
    layer, n = address.order
    if address.accessor == _BLOCK_OUTPUT:
        return Resume(layer + 1)
    if vocab.COMPONENTS.get(address.component, {}).get("whole_model"):
        return Resume(layer)  # embeddings (before block 0) or a place after the stack
    return Resume(layer, tuple(part for part in PARTS if n >= _DONE_AT[part]))


def resume_point(forward: Forward) -> Resume | None:
    """Where a prompt forward with writes may enter, when that skips anything (whole-model
    places after the stack count as the layer count), else None."""
    if forward.decode or not forward.writes:
        return None
    first = min((op.address for _, op in tap_ops(forward)), key=lambda a: a.order)
    entry = _entry(first)
    return entry if entry.layer >= 1 or entry.parts else None


def shared_entry(entry: Resume, present: set) -> Resume:
    """The entry a forward shares a trace at: one entering block ``R + 1`` joins the points
    entering block ``R`` with every part cached, when there are such (the block is then only
    its sums and norms, computed as the un-intervened forward computes them)."""
    whole = Resume(entry.layer - 1, PARTS)
    return whole if not entry.parts and entry.layer >= 1 and whole in present else entry


def entries_of(each) -> list:
    """Where each unit's trace enters (``None``: from the start), shared where it can be."""
    entries = [resume_point(forward) for forward in each]
    present = {entry for entry in entries if entry is not None}
    return [None if entry is None else shared_entry(entry, present) for entry in entries]


def needs_of(entries) -> set:
    """The kept values ``entries`` take together."""
    return {need for entry in entries if entry is not None for need in entry.needs()}


def ahead_of(others) -> set:
    """What later points' forwards will enter with: as their runs group them, or alone."""
    return needs_of(entries_of(others)) | needs_of(map(resume_point, others))


def by_entry(entries: list, covered: set) -> dict:
    """Units grouped by their entry, in unit order; a unit whose kept values do not cover
    these rows starts from the start."""
    runs: dict = {}
    for unit, entry in enumerate(entries):
        if entry is not None and any(need not in covered for need in entry.needs()):
            entry = None
        runs.setdefault(entry, []).append(unit)
    return runs


def map_tensors(value: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A module's output with ``change`` applied to each tensor in it (a tuple keeps its
    structure; ``None`` and other members pass through): how a kept output is copied and
    stacked."""
    if isinstance(value, tuple):
        return tuple(map_tensors(item, change) for item in value)
    return change(value) if isinstance(value, torch.Tensor) else value


def need_order(need: Need) -> tuple[int, int]:
    """Forward order of a cached value: block L's attention, then its MLP, then its output."""
    return (need, len(PARTS)) if isinstance(need, int) else (need[0], PARTS.index(need[1]))


def need_place(need: Need) -> tuple[int, int]:
    """A cached value's place in address order (``Address.order``): where its module's
    output is complete (a sandwich norm behind the part sorts at the same place, later)."""
    if isinstance(need, int):
        return (need, _BLOCK_OUTPUT_ORDER)
    return (need[0], _DONE_AT[need[1]])


def deepest(needs: list, room: int, present: set = frozenset()) -> list:
    """Of ``needs``, what ``room`` more kept values serve best: entries taken deepest first
    (a later entry skips more blocks), each whole or not at all, since an entry takes the
    residual before its block and every part it serves. ``present``: values kept already."""
    wanted, chosen = set(needs), []
    for need in sorted(needs, key=need_order, reverse=True):
        entry = Resume(need + 1) if isinstance(need, int) else Resume(
            need[0], PARTS[:PARTS.index(need[1]) + 1])
        cost = sorted(set(entry.needs()) - set(present) - set(chosen), key=need_order)
        if len(cost) <= room - len(chosen) and set(cost) <= wanted:
            chosen += cost
    return chosen
