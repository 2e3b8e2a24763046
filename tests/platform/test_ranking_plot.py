"""The ranking bar chart a method multirun's parent carries: drawn for points that differ in
`method`, never for other sweeps; a control bar beside each method that has one."""
from __future__ import annotations

from causalab.plots import curves as plots


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
    import matplotlib.colors
    from matplotlib.patches import Rectangle

    figure = plots.ranking_figure(_points(["das", "pca"]), title="causalab:weekday-llama")
    (axes,) = figure.axes
    bars = [p for p in axes.patches if isinstance(p, Rectangle)]
    # A zero score is a thin bar of its colour (2% of the value axis's span of 1.0), so it
    # is seen as a bar and its legend swatch matches something drawn; its text says 0.00.
    assert sorted(round(b.get_height(), 3) for b in bars) == [0.02, 0.02, 0.9, 1.0]
    assert {b.get_facecolor() for b in bars if b.get_height() < 0.1} == {
        matplotlib.colors.to_rgba("tab:grey")}
    labels = sorted(t.get_text() for t in axes.texts)
    assert labels == ["0.00", "0.00", "0.90", "1.00"]
    # Each bar also carries a cap line at its true value.
    caps = [line for line in axes.lines if list(line.get_ydata()) == [0.0, 0.0]
            and line.get_linewidth() > 1.5]
    assert len(caps) == 2
    assert "causalab:weekday-llama" in figure.get_suptitle()


def test_the_floor_method_is_a_light_grey_bar_as_its_legend_swatch_even_at_zero():
    import matplotlib.colors

    figure = plots.ranking_figure([({"method": m}, {"iia/test": v}) for m, v in
                                   (("das", 1.0), ("random", 0.0))], title="causalab:x")
    (axes,) = figure.axes
    grey = matplotlib.colors.to_rgba("lightgrey")
    (floor,) = [b for b in axes.patches if b.get_facecolor() == grey]
    (swatch,) = [h for h in figure.legends[0].get_patches() if h.get_facecolor() == grey]
    assert floor.get_height() > 0 and not floor.get_hatch() and not swatch.get_hatch()
