"""The overflow rule, one for every mechanism: a write whose own numbers overflow the dtype,
whose finite numbers overflow the next norm's sum of squares, or that leaves a position's
value more than ``seam.GROWTH_LIMIT`` (2**23) times the norm it had before this forward's
writes: found once a pass's traces have run, refused at the write's path, naming its
mechanism, site, numbers and how many rows (docs/format.md §7.9).

The walk's write taps leave a ``seam.Written`` per trace (device flags, no host sync); this
module reads them all with one sync when the pass's result is made, and only on a hit walks
the rows to say how many. It never opens a trace. A row whose logits turn non-finite
downstream of writes that stayed finite is the metric's ``NON_FINITE`` exclusion instead;
a write whose values stay finite but square past float32 (``add_scaled`` by 1e30) would make
the next RMSNorm or LayerNorm divide by infinity and every logit a constant (0.0 under a
Llama head) with no NaN anywhere, so it is refused here too. And a write that stays finite
and squares finite but grows the value past 2**23 times its norm (``lerp`` at t = 1e20 on a
residual of norm 0.1: 5e17) leaves numbers that are no measurement: whatever the model adds
there afterwards is below float32's precision and rounds away, and the next norm divides
the write's number out (t = 1e20 and t = 2e20 give the same logits, bit for bit), so it is
refused too, unless a ``renormalize`` later at the same site brings the value back first.
"""
from __future__ import annotations


from causalab.compile.plan import Operand, Pass, WriteOp
from causalab.engine.seam import GROWTH_LIMIT, Written
from causalab.errors import RunError
from causalab.lazy import torch


def refuse_overflowed(pass_: Pass, written: dict[str, list[tuple[tuple[int, ...], Written]]]
                      ) -> None:  # R8
    """Raise at the first write (in issue order) that broke the forward: made a finite value
    non-finite, left it too large for a norm's sum of squares, or grew it past GROWTH_LIMIT
    times its norm (the docstring above says why each).

    ``written`` maps a write's name to per trace the pass rows it acted on and its flags.
    """
    traces = [(name, flags) for name, found in written.items() for _, flags in found]
    if not traces:
        return
    restored = _renormalized(pass_)
    device = traces[0][1].non_finite.device
    hits = torch.stack([_flags(flags, name in restored).any().to(device)
                        for name, flags in traces])
    if not bool(hits.any()):
        return
    name = traces[int(hits.nonzero()[0, 0])][0]
    write = next(w for forward in pass_.forwards for w in forward.writes if w.name == name)
    dtype = str(written[name][0][1].dtype).removeprefix("torch.")
    bad, every = _rows(written[name], "non_finite")
    if bad:
        raise RunError(("interventions", pass_.intervention, "writes", name),
                       f"the {write.mechanism} write made {len(bad)} of {len(every)} rows "
                       f"non-finite at {_site(write)} ({_numbers(write)}) overflows {dtype}")
    bad, every = _rows(written[name], "norm_overflow")
    squares = "float64" if dtype == "float64" else "float32"
    if not bad:
        bad, every = _rows(written[name], "grown")
        growth = max(float(flags.growth.max()) for _, flags in written[name]
                     if flags.growth is not None and flags.growth.numel())
        raise RunError(("interventions", pass_.intervention, "writes", name),
                       f"the {write.mechanism} write left {len(bad)} of {len(every)} rows at "
                       f"{_site(write)} up to {growth:.3g} times their norm ({_numbers(write)}): "
                       "past 2^23 the model's later additions round away in float32 and the "
                       "next norm divides the number out, so no score measures the model")
    raise RunError(("interventions", pass_.intervention, "writes", name),
                   f"the {write.mechanism} write left {len(bad)} of {len(every)} rows at "
                   f"{_site(write)} too large for a norm ({_numbers(write)}): their sum of "
                   f"squares overflows {squares}, so the next norm divides by infinity and the "
                   "logits are no longer numbers to score")


def _flags(flags: Written, restored: bool = False) -> torch.Tensor:
    """Per position, whether the write broke the forward there (``restored``: a renormalize
    later at its site brings the value back to its norm, so its growth is no break)."""
    broken = flags.non_finite
    if flags.norm_overflow is not None:
        broken = broken | flags.norm_overflow
    if flags.growth is not None and not restored:
        broken = broken | (flags.growth > GROWTH_LIMIT)
    return broken


def _renormalized(pass_: Pass) -> set[str]:
    """The writes that every forward applying them follows with a ``renormalize`` at the same
    address (docs/format.md §7.4: it must be the last write there)."""
    followed: dict[str, bool] = {}
    for forward in pass_.forwards:
        for j, write in enumerate(forward.writes):
            later = any(other.mechanism == "renormalize" and other.address == write.address
                        for other in forward.writes[j + 1:])
            followed[write.name] = followed.get(write.name, True) and later
    return {name for name, yes in followed.items() if yes}


# What each break marks per position of a ``Written`` (None: not checked there).
_MARKS = {"non_finite": lambda flags: flags.non_finite,
          "norm_overflow": lambda flags: flags.norm_overflow,
          "grown": lambda flags: None if flags.growth is None else flags.growth > GROWTH_LIMIT}


def _rows(found: list[tuple[tuple[int, ...], Written]], flag: str
          ) -> tuple[set[int], set[int]]:
    """The pass rows ``flag`` (a key of ``_MARKS``) marks at some position, and every row the
    write acted on."""
    bad, every = set(), set()
    for rows, flags in found:
        marked = _MARKS[flag](flags)
        values, start = ([False] * sum(flags.counts) if marked is None else marked.tolist()), 0
        for row, count in zip(rows, flags.counts):
            every.add(row)
            if any(values[start:start + count]):
                bad.add(row)
            start += count
    return bad, every


def _site(write: WriteOp) -> str:
    address = write.address
    return address.component if address.layer is None else f"{address.component}[{address.layer}]"


# operand kind -> how a refusal names it.
_OPERANDS = {
    "literal": lambda operand: f"operand {operand.value:g}",
    "read": lambda operand: f"operand read {operand.name}",
    "ref": lambda operand: f"operand output {operand.name}",
    "none": lambda operand: "no operand",
}


def _numbers(write: WriteOp) -> str:
    """The write's operand and parameters, as the document gave them."""
    operand: Operand = write.operand
    parts = [_OPERANDS[operand.kind](operand)]
    parts += [f"{key} {value:g}" for key, value in sorted(write.params.items())]
    return ", ".join(parts)
