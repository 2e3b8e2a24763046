"""Cayley basis, forward + backward: a dense d×d solve against causalab's Woodbury form.

Run: ``.venv/bin/python scripts/bench/cayley.py [--d 2048] [--k 16] [--repeats 3] [--threads 1]``. Prints one
line with both times in milliseconds and ``ratio`` = dense / woodbury (expected well above 5
at d = 2048, k = 16). Both run in one process, on the CPU, in float32, on one
thread by default so a busy machine's OpenMP spinning does not swamp the small products.
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from causalab.engine.featurizers.subspace import cayley_basis


def dense_basis(weight: torch.Tensor) -> torch.Tensor:
    """Q = (I − A)⁻¹ (I + A) E by a dense d×d solve."""
    d, k = weight.shape
    eye = torch.eye(d, dtype=weight.dtype)
    frame = eye[:, :k]
    skew = weight @ frame.T - frame @ weight.T
    return torch.linalg.solve(eye - skew, (eye + skew) @ frame)


def _seconds(basis_of, weight: torch.Tensor, probe: torch.Tensor, repeats: int) -> float:
    """Best wall time of one forward + backward over ``repeats`` runs (after one warm-up)."""
    best = math.inf
    for attempt in range(repeats + 1):
        leaf = weight.clone().requires_grad_(True)
        start = time.perf_counter()
        torch.autograd.backward((basis_of(leaf) * probe).sum())
        elapsed = time.perf_counter() - start
        if attempt:
            best = min(best, elapsed)
    return best


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 keeps small products clear of OpenMP contention")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(args.d, args.k, generator=generator) / math.sqrt(args.d)
    probe = torch.randn(args.d, args.k, generator=generator)
    try:
        dense = _seconds(dense_basis, weight, probe, args.repeats)
        woodbury = _seconds(cayley_basis, weight, probe, args.repeats)
    finally:
        torch.set_num_threads(threads)
    ratio = dense / woodbury
    print(f"cayley d={args.d} k={args.k} threads={args.threads} dense_ms={dense * 1e3:.2f} "
          f"woodbury_ms={woodbury * 1e3:.3f} ratio={ratio:.1f}")
    return ratio


if __name__ == "__main__":
    main()
