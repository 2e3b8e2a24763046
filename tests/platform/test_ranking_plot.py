"""The ranking bar chart a method multirun's parent carries: drawn for points that differ in
`method`, never for other sweeps."""
from __future__ import annotations

from causalab.tracking import plots


def _points(names, key="test/iia"):
    return [({"method": name, "model": "llama"}, {key: 1.0 - i / 10, "control/iia": 0.0})
            for i, name in enumerate(names)]


def test_a_method_comparison_gets_a_png_ranking_and_other_sweeps_get_none():
    png = plots.ranking_chart(_points(["das", "pca", "random"]))
    assert png is not None and png.startswith(b"\x89PNG\r\n\x1a\n")
    assert plots.ranking_chart(_points(["das"])) is None
    assert plots.ranking_chart([({"layers": 0}, {"test/iia": 1.0}),
                                ({"layers": 1}, {"test/iia": 0.0})]) is None
    assert plots.ranking_chart(_points(["das", "pca"], key="eval/iia")) is None
