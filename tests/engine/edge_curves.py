"""The faithfulness check every edge test makes: each circuit of the top-k edges patched by
hand (every edge outside it given the counterfactual sender's output in place of the sender's
output in this same forward, with plain hooks) against causalab's curve."""
from __future__ import annotations

from typing import Callable

import pytest


def check_curve(curve, ks: list, checked: tuple, found, mean, cf_out: dict,
                run: Callable[[dict], object], m_base: float, m_cf: float) -> None:
    """``run(adds)`` is the test's hooked base forward, ``adds[receiver](senders so far)``
    added to that receiver's input, returning the metric per row. Both ends are checked too:
    no edge kept is the counterfactual's forward, every edge kept the base's."""
    order = sorted(found.edges(), key=lambda e: -abs(float(mean[e])))
    for k in checked:
        outside: dict = {}
        for u, v in order[k:]:
            outside.setdefault(found.receivers[v], []).append(found.senders[u])

        def add(senders):
            return lambda now: sum(cf_out[s] - now[s] for s in senders)
        hand = float(run({r: add(s) for r, s in outside.items()}).mean())
        print(f"k={k}: causalab {curve.metric[ks.index(k)]:.6f} (faithfulness "
              f"{curve.faithfulness[ks.index(k)]:.4f}), hand {hand:.6f}")
        # float32 sums over narrow residuals in another order: 1e-4 is ~1e3 ulps.
        assert curve.metric[ks.index(k)] == pytest.approx(hand, abs=1e-4)
        assert curve.faithfulness[ks.index(k)] == pytest.approx(
            (hand - m_cf) / (m_base - m_cf), abs=1e-4)
    assert curve.faithfulness[0] == pytest.approx(0.0, abs=1e-4)
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-4)
