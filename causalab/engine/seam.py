"""The write seam: the one ``gather``, the one ``apply_write``, and the ``scatter`` only they use.

Pure tensor work on the activation an address holds; it never opens a trace, never sees a
document or a tokenizer, and never decides raggedness (the plan's positions did that). The
walk calls these functions inside the trace on the module tensors, one gathered index per
batch: nothing here loops over rows at write time.

Layouts, named by ``address.seq_axis`` and the tensor's rank:

* module boundary ``(batch, seq, d)``, sequence axis 1;
* attention interior ``(batch, heads, seq, head_dim)``, sequence axis 2; features come back
  head-major, ``heads * head_dim`` wide;
* key-axis components (``attention_scores``/``attention_probs``) ``(batch, heads, q, keys)``:
  ``pos`` selects the query axis and features come back ``heads * keys`` wide, each head's
  keys side by side;
* ``input_ids`` ``(batch, seq)``: no feature axis, gathered ``(rows, w)``.

A ``heads``/``units`` selection regroups the flat feature axis as ``(groups, per_group)`` and
keeps the named groups only: ``(…, len(take) * per_group)``. ``scatter`` restores the model's
own layout with only those groups replaced.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol, Sequence

from causalab.compile.plan import Address, WriteOp
from causalab.engine.mechanisms import MECHANISMS, NEEDS_F0, Operand
from causalab.errors import RunError
from causalab.lazy import torch


class Featurizer(Protocol):
    """What the seam asks of a featurizer (engine/featurizers): its space and back."""

    def featurize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def inverse(self, f: torch.Tensor, err: torch.Tensor | None,
                x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Window:
    """Where a read or write lands in one batch: one gathered index over all its rows.

    ``batch_rows`` and ``positions`` are ``(total,)`` integer tensors, row-major (every
    position of row 0, then row 1, …). ``counts`` holds each row's window width. ``width``
    is ``w`` when the value is rectangular ``(rows, w, …)`` and ``None`` when it is flat
    ``(total, …)``.

    >>> Window.from_windows([(3, 4), (5, 6)]).width
    2
    """

    batch_rows: torch.Tensor
    positions: torch.Tensor
    width: int | None
    counts: tuple[int, ...]

    @property
    def flat_counts(self) -> tuple[int, ...] | None:
        """Each row's width when the value is flat (what slices it per row), else None."""
        return None if self.width is not None else self.counts

    @classmethod
    def from_windows(cls, windows: Sequence[Sequence[int]], *, ragged: bool = False) -> "Window":
        """Build the gathered index for batch rows ``0 … len(windows) − 1``.

        ``ragged`` is the compiler's decision over the whole pass; a ragged selection stays
        flat even when this batch happens to look rectangular.
        """
        counts = tuple(len(window) for window in windows)
        rows = [row for row, count in enumerate(counts) for _ in range(count)]
        flat = [int(p) for window in windows for p in window]
        same = len(set(counts)) == 1 and counts[0] > 0
        width = counts[0] if same and not ragged else None
        # An empty index would default to float; index tensors must be integers.
        return cls(torch.tensor(rows, dtype=torch.long), torch.tensor(flat, dtype=torch.long),
                   width, counts)

    @property
    def rows(self) -> int:
        return len(self.counts)

    @property
    def total(self) -> int:
        return int(self.batch_rows.shape[0])


def _feature_shape(activation: torch.Tensor, address: Address) -> tuple[int, ...]:
    """Shape of one position's features in the model's layout: ``(d,)``, ``(heads, X)`` or ``()``."""
    if address.seq_axis == 2:
        return (activation.shape[1], activation.shape[3])
    return tuple(activation.shape[2:])


def _sequence_last(activation: torch.Tensor, address: Address) -> torch.Tensor:
    """A view with batch and sequence leading: ``(batch, seq, …)``, no copy."""
    return activation.transpose(1, 2) if address.seq_axis == 2 else activation


def _columns(activation: torch.Tensor, address: Address) -> torch.Tensor | None:
    """Flat feature indices a heads/units selection keeps, or None for the whole site."""
    take = address.heads if address.heads is not None else address.units
    if take is None:
        return None
    shape = _feature_shape(activation, address)
    full = 1
    for size in shape:
        full *= size
    groups = address.groups
    if groups is None:
        groups = shape[0] if address.heads is not None else full
    if full % groups:
        raise RunError((address.component,), f"{full} features do not split into {groups} groups")
    per_group = full // groups
    take_t = torch.tensor(take, dtype=torch.long, device=activation.device)
    offsets = torch.arange(per_group, dtype=torch.long, device=activation.device)
    return (take_t[:, None] * per_group + offsets[None, :]).reshape(-1)


def _indices(activation: torch.Tensor, address: Address, window: Window) -> tuple[torch.Tensor, ...]:
    """One advanced index into ``_sequence_last(activation)``: ``(total,)`` or ``(total, cols)``."""
    rows = window.batch_rows.to(activation.device)
    positions = window.positions.to(activation.device)
    cols = _columns(activation, address)
    if cols is None:
        return rows, positions
    if address.seq_axis == 2:
        per_head = activation.shape[3]
        return rows[:, None], positions[:, None], (cols // per_head)[None, :], (cols % per_head)[None, :]
    return rows[:, None], positions[:, None], cols[None, :]


def gather(activation: torch.Tensor, address: Address, window: Window) -> torch.Tensor:
    """The value at ``address`` over ``window``: ``(rows, w, width)`` or flat ``(total, width)``.

    ``width`` is the site's (after any heads/units selection); ``input_ids`` gathers
    ``(rows, w)`` / ``(total,)`` integers. The result is in the activation's dtype.
    """
    picked = _sequence_last(activation, address)[_indices(activation, address, window)]
    flat = picked.flatten(1) if activation.dim() > 2 else picked
    if window.width is None:
        return flat
    return flat.reshape(window.rows, window.width, *flat.shape[1:])


def scatter(activation: torch.Tensor, address: Address, window: Window,
            value: torch.Tensor) -> torch.Tensor:
    """A new tensor: ``activation`` with ``value`` (shaped as :func:`gather` returns) put back.

    Never in place, so it is safe under autograd; gradients reach both the untouched part of
    ``activation`` and ``value``. Only the site's selected groups are replaced.
    """
    index = _indices(activation, address, window)
    if activation.dim() == 2:
        shape: tuple[int, ...] = (window.total,)
    elif len(index) == 2:
        shape = (window.total, *_feature_shape(activation, address))
    else:
        shape = (window.total, index[-1].shape[-1])
    flat = value.to(activation.dtype).reshape(shape)
    placed = _sequence_last(activation, address).index_put(index, flat)
    return placed.transpose(1, 2) if address.seq_axis == 2 else placed


def _no_autocast(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


def express(featurizer: Featurizer | None, x: torch.Tensor) -> torch.Tensor:
    """A gathered value in ``featurizer``'s space, in float32 with autocast off (what a read
    with a featurizer yields). ``featurizer=None`` means identity."""
    with _no_autocast(x.device):
        x32 = x.float()
        return x32 if featurizer is None else featurizer.featurize(x32)[0]


def _operand(operand: Operand, f: torch.Tensor, full: int,
             features: torch.Tensor | None) -> Operand:
    """Move a tensor operand to f's device in float32, align its layout, cut it to ``features``."""
    if operand is None or isinstance(operand, (int, float)):
        return operand
    op = operand.to(device=f.device, dtype=torch.float32)
    if op.dim() == 3 and f.dim() == 2 and op.shape[0] * op.shape[1] == f.shape[0]:
        op = op.reshape(f.shape[0], op.shape[2])
    elif op.dim() == 2 and f.dim() == 3 and op.shape[0] == f.shape[0] * f.shape[1]:
        op = op.reshape(f.shape[0], f.shape[1], op.shape[1])
    if features is not None and op.dim() > 0 and op.shape[-1] == full:
        op = op.index_select(-1, features)
    return op


def apply_write(activation: torch.Tensor, write: WriteOp, window: Window,
                featurizer: Featurizer | None, operand: Operand, original: torch.Tensor | None = None) -> torch.Tensor:
    """``write = inverse(do(featurize(x)), err, x)`` at ``write.address`` over ``window``.

    ``activation`` is the address's tensor as the previous write left it; ``original`` is
    the same tensor before any write of this forward (needed by ``renormalize`` for f₀).
    ``operand`` is a number, ``None``, or a tensor in the featurizer's space shaped like f
    (``(rows, w, k)`` / ``(total, k)``) or broadcastable to it (a mean: ``(w, k)``/``(k,)``).
    ``featurizer=None`` means identity. Featurizer arithmetic runs in float32 with autocast
    off on the activation's device; the result goes back in the activation's dtype.

    >>> import torch
    >>> from causalab.compile.plan import Address, Operand, PositionSpec, WriteOp
    >>> address = Address("block_output", 0, "layers_output", (0, 60), 1, 4, 4)
    >>> write = WriteOp("zero", "s", address, PositionSpec(index=-1), "swap", Operand("literal", value=0.0))
    >>> out = apply_write(torch.ones(1, 3, 4), write, Window.from_windows([(2,)]), None, 0.0)
    >>> out[0, :, 0].tolist()
    [1.0, 1.0, 0.0]
    """
    address = write.address
    with _no_autocast(activation.device):
        x = gather(activation, address, window).float()
        f, err = (x, None) if featurizer is None else featurizer.featurize(x)
        f0 = None
        if write.mechanism in NEEDS_F0:
            if original is None:
                raise RunError((write.name,), f"{write.mechanism} needs the pre-write value")
            f0 = express(featurizer, gather(original, address, window))
        features = None
        if write.features is not None:
            features = torch.tensor(write.features, dtype=torch.long, device=f.device)
        op = _operand(operand, f, f.shape[-1], features)
        touched = f if features is None else f.index_select(-1, features)
        if f0 is not None and features is not None:
            f0 = f0.index_select(-1, features)
        done = MECHANISMS[write.mechanism](touched, op, f0=f0, **write.params)
        f_new = done if features is None else f.index_copy(-1, features, done)
        x_new = f_new if featurizer is None else featurizer.inverse(f_new, err, x)
    return scatter(activation, address, window, x_new.to(activation.dtype))


# How many times its norm before this forward's writes a write may leave a position's value:
# 1/ε of float32 (2**23), the dtype the seam and the norms compute in. Past it, anything the
# model adds there afterwards (a later block's output, of the size the value had) is below
# float32's precision relative to the written value and rounds away, and the next norm
# divides the write's own number out: the scores depend on neither (t = 1e20 and 2e20 score
# the same), so they are no measurement of the model.
GROWTH_LIMIT = 2.0 ** 23


class Written(NamedTuple):
    """What a write tap gives back beside its tensor: per position of its window whether the
    write left a NaN or Inf where the value before it held none, whether it left finite
    values whose sum of squares overflows, and how many times the norm it had before this
    forward's writes it left the value (``(total,)`` each, still on the device: nothing
    waits on them until the pass's result is read), the window's per-row widths, and the
    dtype it wrote in."""

    non_finite: torch.Tensor
    counts: tuple[int, ...]
    dtype: torch.dtype
    norm_overflow: torch.Tensor | None = None
    growth: torch.Tensor | None = None


def check_write(before: torch.Tensor, after: torch.Tensor, address: Address,
                window: Window, original: torch.Tensor | None = None) -> Written:
    """Which of ``window``'s positions ``after`` (what :func:`apply_write` returned) holds a
    non-finite value at where ``before`` (its input) held only finite ones: the write's own
    numbers overflowed the dtype there. Which hold finite values whose sum of squares
    overflows the dtype a norm computes it in (float32, or the model's if wider): the next
    RMSNorm or LayerNorm divides by infinity there and every logit downstream comes out a
    constant. And, given ``original`` (the address's tensor before any write of this
    forward), how many times its norm there the write left the whole site's value (0 where
    that norm is 0 or not finite, and at a key-axis component, whose masked keys are no
    vector a norm sees): past :data:`GROWTH_LIMIT` the model no longer registers at the
    position. One reduction per written address; device work only, no host sync.

    >>> import torch
    >>> from causalab.compile.plan import Address
    >>> address = Address("block_output", 0, "layers_output", (0, 60), 1, 4, 4)
    >>> after = torch.ones(2, 3, 4); after[1, 2, 0] = float("inf"); after[0, 2, 1] = 1e30
    >>> window = Window.from_windows([(2,), (2,)])
    >>> written = check_write(torch.ones(2, 3, 4), after, address, window, torch.ones(2, 3, 4))
    >>> written.non_finite.tolist(), written.norm_overflow.tolist()
    ([False, True], [True, False])
    >>> bool(written.growth[0] > GROWTH_LIMIT), written.growth[1].item()
    (True, 0.0)
    """
    with torch.no_grad():
        total = window.total
        x = gather(before.detach(), address, window).reshape(total, -1)
        y = gather(after.detach(), address, window).reshape(total, -1)
        was_finite = torch.isfinite(x).all(-1)
        is_finite = torch.isfinite(y).all(-1)
        flags = was_finite & ~is_finite
        squares = torch.promote_types(after.dtype, torch.float32)
        norm_overflow = (is_finite & torch.isfinite(x.to(squares).square().sum(-1))
                         & ~torch.isfinite(y.to(squares).square().sum(-1)))
        growth = None
        if original is not None and not address.key_axis and after.dim() > 2:
            growth = _growth(original.detach(), after.detach(), address, window, squares)
    return Written(flags, window.counts, after.dtype, norm_overflow, growth)


def _growth(original: torch.Tensor, after: torch.Tensor, address: Address, window: Window,
            squares: torch.dtype) -> torch.Tensor:
    """``‖after‖ / ‖original‖`` per position of ``window`` over the whole site (every head and
    unit: a slice the model left at zero, a ReLU neuron, still has a scale around it), in
    ``squares``; 0 where the original's norm is 0 or not finite, or the result not finite
    (the two checks before this one say that)."""
    whole = replace(address, heads=None, units=None)
    total = window.total
    o = gather(original, whole, window).reshape(total, -1).to(squares)
    y = gather(after, whole, window).reshape(total, -1).to(squares)
    # max-scaled norms: a value near float32's largest still has a finite norm to compare.
    o_norm = _norm(o)
    y_norm = _norm(y)
    usable = torch.isfinite(o_norm) & (o_norm > 0) & torch.isfinite(y).all(-1)
    return torch.where(usable, y_norm / torch.where(usable, o_norm, torch.ones_like(o_norm)),
                       torch.zeros_like(o_norm))


def _norm(x: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each row, scaled by its largest magnitude first so squares never
    overflow (a row of 1e30s has norm 2e30, not inf)."""
    top = x.abs().amax(-1, keepdim=True)
    safe = torch.where(top > 0, top, torch.ones_like(top))
    return torch.linalg.vector_norm(x / safe, dim=-1) * top.squeeze(-1)
