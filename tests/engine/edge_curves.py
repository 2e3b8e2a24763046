"""The faithfulness check every edge test makes: each circuit of the top-k edges patched by
hand (every edge outside it given the counterfactual sender's output in place of the sender's
output in this same forward, with plain hooks) against causalab's curve."""
from __future__ import annotations

from typing import Callable

import pytest

from causalab.engine.attribution import edges


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


def check_faithfulness(model, base: dict, cf: dict, metric, ks: list, checked: tuple,
                       cf_out: dict, run: Callable[[dict, dict], object],
                       receivers: str = "heads") -> None:
    """causalab's curve over ``ks`` (EAP-IG, 3 steps) against hand-patched circuits at each k
    of ``checked``; ``run(batch, adds)`` is the test's hooked forward of ``batch``."""
    found = edges.graph(model, receivers)
    mean = edges.scores(model, base, cf, metric, steps=3, receivers=receivers).mean(0)
    curve = edges.faithfulness(model, [(base, cf, metric)], mean, ks, receivers)
    m_base, m_cf = float(run(base, {}).mean()), float(run(cf, {}).mean())
    check_curve(curve, ks, checked, found, mean, cf_out, lambda adds: run(base, adds),
                m_base, m_cf)
