"""The ranking bar chart a method multirun's parent carries: drawn for points that differ in
`method`, never for other sweeps; a control bar beside each method that has one."""
from __future__ import annotations

from causalab.tracking import plots


def _points(names, key="iia/test"):
    return [({"method": name, "model": "llama"}, {key: 1.0 - i / 10, "iia/control": 0.0})
            for i, name in enumerate(names)]


def test_a_method_comparison_gets_a_png_ranking_and_other_sweeps_get_none():
    png = plots.ranking_chart(_points(["das", "pca", "random"]))
    assert png is not None and png.startswith(b"\x89PNG\r\n\x1a\n")
    assert plots.ranking_chart(_points(["das"])) is None
    assert plots.ranking_chart([({"layers": 0}, {"iia/test": 1.0}),
                                ({"layers": 1}, {"iia/test": 0.0})]) is None


def test_each_method_has_its_test_bar_and_its_control_bar_and_a_zero_score_is_drawn():
    from matplotlib.patches import Rectangle

    figure = plots.ranking_figure(_points(["das", "pca"]), title="causalab:weekday-llama")
    (axes,) = figure.axes
    bars = [p for p in axes.patches if isinstance(p, Rectangle)]
    assert sorted(round(b.get_height(), 3) for b in bars) == [0.0, 0.0, 0.9, 1.0]
    labels = sorted(t.get_text() for t in axes.texts)
    assert labels == ["0.00", "0.00", "0.90", "1.00"]
    # A zero bar has no height, so each bar carries a cap line at its value.
    caps = [line for line in axes.lines if list(line.get_ydata()) == [0.0, 0.0]
            and line.get_linewidth() > 1.5]
    assert len(caps) == 2
    assert "causalab:weekday-llama" in figure.get_suptitle()
