"""Every picture a run or a sweep parent carries reads: each is drawn here from plain numbers and
checked on the figure itself, as the Agg renderer lays it out: no two texts (tick labels, axis
labels, titles, legend entries, values on bars) overlap, none leaves the figure, no axis has
more than 12 tick labels, every figure is titled with its model, and legend labels are short."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from causalab.plots import curves as plots

TITLE = "causalab:weekday-llama · block_input L2 pos -1"


def _das(model=None, ks=(1, 4, 16)):
    points = []
    for k in ks:
        place = {"experiment": "das", "model": model, "k": k} if model else {"k": k}
        points.append((place, {"iia/test": min(1.0, k / 16 + 0.1), "iia/control": 0.0,
                               "logit_diff/test": k / 2 - 6, "logit_diff/control": -9.6,
                               "ce/test": 8 - k / 2, "ce/control": 9.6, "n/iia/test": 12.0}))
    return points


def _kinds():
    wave = [({"layers": [layer]}, {"logit_diff/patch": 5 * math.sin(layer / 5),
                                   "iia/patch": layer / 30}) for layer in range(30)]
    heads = [({"layers": [layer], "heads": [head]}, {"logit_diff/patch": -4.9 + head / 90})
             for layer in range(30) for head in range(9)]
    places = [({"layers": [layer], "pos": pos}, {"iia/patch": layer / 4, "logit_diff/patch": 1.0})
              for layer in range(4) for pos in (-5, -4, -1)]
    methods = ["das", "dbm", "full", "pca", "sae", "neurons", "random"]
    ranking = [({"method": m, "model": "llama"},
                {"iia/test": v, "logit_diff/test": 9 * v - 8.95,
                 **({"iia/control": 0.0} if m in ("das", "pca") else {})})
               for m, v in zip(methods, [1.0, 0.92, 1.0, 1.0, 1.0, 0.42, 0.0])]
    fit_only = [({"featurizers.rot.k": k}, {"eval/logit_diff": k / 3, "train/loss": 3 - k / 8})
                for k in (1, 4, 16)]
    neuron_sets = [({"units": list(range(start, start + 4))},
                    {"iia/patch": start / 16, "logit_diff/patch": start - 9.4})
                   for start in (0, 4, 8, 12)]
    wide_sets = [({"units": list(range(start, start + 64))}, {"iia/patch": start / 256})
                 for start in (0, 64, 128)]
    sites = [({"sites.target": {"component": component, "layers": [1]}}, {"iia/patch": v})
             for component, v in (("block_output", 1.0), ("attention_output", 0.5),
                                  ("mlp_output", 0.25))]
    grid = [({"k": k, "fit.lr": lr}, {"iia/test": k / 16, "iia/control": 0.0})
            for k in (1, 2, 4, 8, 16) for lr in (0.001, 0.003, 0.01, 0.03)]
    return {
        "rank curve": plots.sweep_figures(_das(), title=TITLE),
        "multi-model multirun": plots.sweep_figures(
            _das("causalab:weekday-llama") + _das("causalab:weekday-gpt2")
            + _das("causalab:weekday-qwen2"), title="3 models · block_input L2 pos -1"),
        "30-layer curve": plots.sweep_figures(wave, title="causalab:smollm2-135m · block_output"),
        "30x9 head heatmap": plots.sweep_figures(heads, title="causalab:smollm2-135m"),
        "layer x position heatmap": plots.sweep_figures(places, title=TITLE),
        "method ranking": plots.sweep_figures(ranking, title=TITLE),
        "fit-only rank sweep": plots.sweep_figures(fit_only, title=TITLE),
        "rank x learning rate": plots.sweep_figures(grid, title=TITLE),
        "neuron sets": plots.sweep_figures(neuron_sets, title=TITLE),
        "64-neuron sets": plots.sweep_figures(wide_sets, title=TITLE),
        "swept sites": plots.sweep_figures(sites, title=TITLE),
        "loss curve": {"loss": plots.loss_figure(
            [3 - i / 40 for i in range(300)], [i / 30 for i in range(30)],
            title=f"{TITLE} · fit", eval_name="eval/iia")},
    }


KINDS = _kinds()


def _texts(figure):
    """(text, window box) of every text the renderer draws."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    found = [t for t in (figure._suptitle, figure._supxlabel) if t is not None]
    for legend in figure.legends:
        found += legend.get_texts()
    for axes in figure.axes:
        found += [axes.title, axes._left_title, axes._right_title, axes.xaxis.label,
                  axes.yaxis.label, *axes.texts]
        found += _tick_labels(axes, renderer)
        if axes.get_legend() is not None:
            found += axes.get_legend().get_texts()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in found
            if t.get_visible() and t.get_text().strip()]


def _tick_labels(axes, renderer) -> list:
    """The tick labels drawn: a locator also names ticks just past the view, never drawn."""
    frame = axes.get_window_extent(renderer)
    found = []
    for axis, low, high, centre in ((axes.xaxis, frame.x0, frame.x1, lambda b: (b.x0 + b.x1) / 2),
                                    (axes.yaxis, frame.y0, frame.y1, lambda b: (b.y0 + b.y1) / 2)):
        for label in axis.get_ticklabels(which="both"):
            if low - 1 <= centre(label.get_window_extent(renderer)) <= high + 1:
                found.append(label)
    return found


def _overlap(a, b, slack=1.0) -> bool:
    return (a.x0 < b.x1 - slack and b.x0 < a.x1 - slack
            and a.y0 < b.y1 - slack and b.y0 < a.y1 - slack)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_no_two_texts_of_a_picture_overlap_and_none_leaves_it(kind):
    assert KINDS[kind], f"{kind}: no picture drawn"
    for name, figure in KINDS[kind].items():
        texts = _texts(figure)
        width, height = figure.canvas.get_width_height()
        for index, (text, box) in enumerate(texts):
            assert box.x0 >= -2 and box.y0 >= -2 and box.x1 <= width + 2 \
                and box.y1 <= height + 2, f"{kind} {name}: {text!r} leaves the figure"
            for other, other_box in texts[index + 1:]:
                assert not _overlap(box, other_box), f"{kind} {name}: {text!r} overlaps {other!r}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_no_axis_of_a_picture_has_more_than_twelve_tick_labels(kind):
    for name, figure in KINDS[kind].items():
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        for axes in figure.axes:
            drawn = _tick_labels(axes, renderer)
            for axis in (axes.xaxis, axes.yaxis):
                shown = [t for t in axis.get_ticklabels(which="both") if t in drawn
                         and t.get_visible() and t.get_text().strip()]
                assert len(shown) <= 12, f"{kind} {name}: {[t.get_text() for t in shown]}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_picture_is_titled_with_its_model_and_its_legends_are_short(kind):
    for name, figure in KINDS[kind].items():
        assert "causalab:" in figure.get_suptitle() or "models" in figure.get_suptitle()
        legends = [a.get_legend() for a in figure.axes if a.get_legend()] + figure.legends
        for legend in legends:
            for text in legend.get_texts():
                assert len(text.get_text()) <= 32 and "experiment=" not in text.get_text()


def test_a_thirty_layer_axis_is_ticked_every_third_layer():
    (figure,) = KINDS["30-layer curve"].values()
    figure.canvas.draw()
    shown = [t.get_text() for t in figure.axes[0].xaxis.get_ticklabels()]
    assert shown == [str(layer) for layer in range(0, 30, 3)]


def test_a_multi_model_multirun_has_a_column_of_panels_per_model():
    (figure,) = KINDS["multi-model multirun"].values()
    titles = sorted({a.get_title() for a in figure.axes if a.get_title()})
    assert titles == ["causalab:weekday-gpt2", "causalab:weekday-llama", "causalab:weekday-qwen2"]
    # one row per quantity (iia, logit_diff, ce) in each of the three columns
    assert len(figure.axes) == 9


def test_a_fit_only_sweep_is_plotted_by_its_fits_last_values():
    (name,) = KINDS["fit-only rank sweep"]
    assert name == "plots/sweep_curve.png"
    (figure,) = KINDS["fit-only rank sweep"].values()
    ys = {a.get_ylabel() for a in figure.axes}
    assert ys == {"logit_diff", "loss"}
    axes = next(a for a in figure.axes if a.get_ylabel() == "logit_diff")
    (line,) = axes.lines
    assert list(line.get_ydata()) == pytest.approx([1 / 3, 4 / 3, 16 / 3])


def test_a_swept_set_of_neurons_is_a_bar_each_labelled_as_the_command_line_shows_it():
    # a list is a coordinate value too (experiment=patching site=neurons): once, the parent's
    # plot failed on it and took the whole run's tracking down with it
    (figure,) = KINDS["neuron sets"].values()
    figure.canvas.draw()
    labels = [t.get_text() for t in figure.axes[0].xaxis.get_ticklabels()]
    assert labels == ["[12,13,14,15]", "[8,9,10,11]", "[4,5,6,7]", "[0,1,2,3]"]  # best first
    (figure,) = KINDS["64-neuron sets"].values()
    figure.canvas.draw()
    labels = [t.get_text() for t in figure.axes[0].xaxis.get_ticklabels()]
    assert labels == ["[128,…,191] (64)", "[64,…,127] (64)", "[0,…,63] (64)"]


def test_a_test_score_and_its_control_are_two_lines_of_one_panel():
    (figure,) = KINDS["rank curve"].values()
    axes = next(a for a in figure.axes if a.get_ylabel() == "iia")
    assert sorted(t.get_text() for t in axes.get_legend().get_texts()) == ["control", "test"]
    control = next(line for line in axes.lines if line.get_label() == "control")
    assert list(control.get_ydata()) == [0.0, 0.0, 0.0]


def _lines_of(figure, ylabel):
    axes = next(a for a in figure.axes if a.get_ylabel() == ylabel)
    return axes, [(list(line.get_xdata()), list(line.get_ydata()), line.get_label())
                  for line in axes.lines]


def test_a_hydra_layer_multirun_is_one_connected_curve_per_quantity_in_layer_order():
    # What the parent reads back from `-m experiment=patching site.layer=0,1,2,3`: the job's
    # override and the `layers` it rendered to, in the order the jobs finished (0, 2, 1, 3).
    points = [({"experiment": "patching", "site.layer": str(layer), "layers": [layer]},
               {"iia/patch": 1.0, "logit_diff/patch": 9.2 + layer / 100})
              for layer in (0, 2, 1, 3)]
    assert plots.varied([c for c, _ in points]) == ["site.layer"]
    (name, figure), = plots.sweep_figures(points, title=TITLE).items()
    assert name == "plots/layer_curve.png"
    axes, lines = _lines_of(figure, "iia")
    assert lines == [([0, 1, 2, 3], [1.0, 1.0, 1.0, 1.0], "patch")]
    assert axes.get_ylim() == pytest.approx((-0.05, 1.05))  # a fraction spans 0 to 1
    axes, lines = _lines_of(figure, "logit_diff")
    assert [xs for xs, _, _ in lines] == [[0, 1, 2, 3]]
    assert axes.get_ylim()[0] > 9.0  # a logit difference keeps its data's range


def test_positions_named_in_the_prompt_keep_its_order_and_a_fraction_colours_0_to_1():
    # IOI's layer x position sweep: S1, S2, END as the prompt reads (the document's order),
    # never sorted as words; its best cell 0.87 is not drawn as 1.0.
    points = [({"layers": [layer], "pos": pos}, {"iia/patch": 0.87 * (layer + 1) / 4})
              for layer in range(4) for pos in ("S1", "S2", "END")]
    (name, figure), = plots.sweep_figures(points, title=TITLE).items()
    assert name == "plots/position_heatmap.png"
    (axes, _colour_bar) = figure.axes
    figure.canvas.draw()
    assert [t.get_text() for t in axes.get_xticklabels()] == ["S1", "S2", "END"]
    assert axes.images[0].get_clim() == (0.0, 1.0)


def test_numbers_are_placed_by_size_and_several_models_get_a_panel_each():
    points = [({"model": model, "k": k}, {"iia/test": k / 16, "iia/control": 0.0})
              for model in ("causalab:weekday-qwen2", "causalab:weekday-llama") for k in (16, 1, 4)]
    (figure,) = plots.sweep_figures(points, title=TITLE).values()
    assert [a.get_title() for a in figure.axes] == ["causalab:weekday-qwen2",
                                                    "causalab:weekday-llama"]
    for axes in figure.axes:
        test = next(line for line in axes.lines if line.get_label() == "test")
        assert list(test.get_xdata()) == [1, 4, 16]
        assert axes.get_ylim() == pytest.approx((-0.05, 1.05))


REPO = Path(__file__).resolve().parents[2]


def _environment() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def test_an_untracked_sweep_writes_its_pictures_into_its_output_folder(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "causalab", "run", str(REPO / "documents/v2/logit_lens.json"),
         "--out", str(tmp_path / "lens"), "--no-track", "--device-map", "cpu",
         "--data-root", str(REPO / "documents" / "data")],
        cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    picture = tmp_path / "lens" / "plots" / "layer_curve.png"
    assert done.stdout.splitlines()[-1] == str(picture)
    assert picture.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_the_four_layer_hydra_multirun_parent_plot_is_one_connected_curve_per_quantity(tmp_path):
    from causalab.tracking import landing
    from causalab.tracking import runs as store

    done = subprocess.run(
        [sys.executable, "-m", "causalab.run", "-m", "experiment=patching",
         "site.layer=0,1,2,3", f"tracking.uri={tmp_path}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
         f"run.data_root={REPO / 'documents' / 'data'}"],
        cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # named by its layer once (not `layer=0,layers=0`); iia ties at 1.0: the first layer is
    # among those first on its step's iia (scores.ranking)
    line, = [line for line in done.stdout.splitlines() if line.startswith("multirun:")]
    assert "first on iia/" in line and "layer=0" in line and "layers=" not in line, line
    mlflow = store.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment, parent, _ = landing.newest_landed(mlflow)
    runs = landing.stored_points(mlflow, experiment, parent)
    points = [(landing.coordinates_of(run), dict(run.data.metrics)) for run in runs]
    (name, figure), = plots.sweep_figures(points, title="t").items()
    assert name == "plots/layer_curve.png"
    for quantity in ("iia", "logit_diff"):
        _, lines = _lines_of(figure, quantity)
        assert [(xs, label) for xs, _, label in lines] == [([0, 1, 2, 3], "patch")]
    names = {a.path for a in mlflow.list_artifacts(parent, "plots")}
    assert names == {"plots/layer_curve.png"}
    assert (tmp_path / "sweep" / "plots" / "layer_curve.png").is_file()


def test_a_curve_shades_each_scores_interval_and_a_ranking_bar_carries_its_whisker():
    # Intervals as a point logs them beside its score (``iia/test.lo``/``.hi``).
    points = [({"k": k}, {"iia/test": v, "iia/test.lo": v - 0.1, "iia/test.hi": min(v + 0.2, 1.0),
                          "iia/control": 0.0})
              for k, v in ((1, 0.2), (4, 0.6), (16, 0.9))]
    axes = plots.curve_figure(points, "k").axes[0]
    bands = [c for c in axes.collections if c.get_paths()]
    assert len(bands) == 1  # the test line has intervals, the control line none
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert math.isclose(ys.min(), 0.1) and math.isclose(ys.max(), 1.0)
    methods = [({"method": m}, {"iia/test": v, "iia/test.lo": v - 0.25, "iia/test.hi": v})
               for m, v in (("das", 0.75), ("pca", 0.5))]
    figure = plots.ranking_figure(methods)
    whiskers = [seg for c in figure.axes[0].collections for seg in c.get_segments()]
    assert sorted((round(s[0][1], 6), round(s[1][1], 6)) for s in whiskers) == [
        (0.25, 0.5), (0.5, 0.75)]


def test_a_tracked_sweep_draws_its_pictures_once_for_its_folder_and_its_parent(tmp_path,
                                                                              monkeypatch):
    import json

    from mlflow import MlflowClient

    from causalab.engine.events import Chain
    from causalab.pipeline import run_document
    from causalab.plots import sweep_files
    from causalab.tracking import TrackingEvents

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    drawn = []

    original = plots.sweep_plots
    monkeypatch.setattr(plots, "sweep_plots", lambda points, *, title="": (
        drawn.append(len(points)), original(points, title=title))[1])
    monkeypatch.setattr(sweep_files, "sweep_plots", plots.sweep_plots)
    out = tmp_path / "lens"
    document = json.loads((REPO / "documents/v2/logit_lens.json").read_text())
    with TrackingEvents(tracking_uri=str(tmp_path), out=str(out)) as events:
        written = run_document(document, out=str(out), data_root=str(REPO / "documents" / "data"),
                               events=Chain(events, sweep_files.SweepPictures(out)))
    picture = out / "plots" / "layer_curve.png"
    assert drawn == [2] and written.count(str(picture)) == 1
    stored = MlflowClient(events.uri).download_artifacts(events.sweep_run_id,
                                                         "plots/layer_curve.png", str(tmp_path))
    assert Path(stored).read_bytes() == picture.read_bytes()


def test_a_sweep_curve_says_how_many_rows_each_point_was_scored_on_and_what_its_band_is():
    points = [({"k": k}, {"iia/test": v, "iia/test.lo": v - 0.1, "iia/test.hi": v + 0.05,
                          "iia/control": 0.0, "n/iia/test": 12.0, "n/iia/control": 12.0})
              for k, v in ((1, 0.2), (4, 0.6), (16, 0.9))]
    caption = plots.curve_figure(points, "k")._supxlabel.get_text()
    assert caption == "each point scored on 12 rows\nshaded: the mean's 95 % interval over its rows"
    unbanded = [(c, {k: v for k, v in m.items() if not k.endswith((".lo", ".hi"))})
                for c, m in points]
    assert plots.curve_figure(unbanded, "k")._supxlabel.get_text() == "each point scored on 12 rows"
    heads = [({"layers": [layer], "heads": [head]}, {"iia/patch": 0.5, "n/iia/patch": 40.0 + head})
             for layer in range(2) for head in range(3)]
    figure = plots.sweep_figures(heads)["plots/head_heatmap.png"]
    assert figure._supxlabel.get_text() == "each point scored on 40–42 rows"


def _rank_sweep(tmp_path, monkeypatch, tracked: bool):
    """The tiny rank sweep (three fits) run with the fit pictures ahead of tracking, as the
    front doors chain them; the titles every loss picture was drawn with."""
    import json

    from causalab.engine.events import Chain
    from causalab.pipeline import run_document
    from causalab.plots import sweep_files
    from causalab.tracking import TrackingEvents

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    titles = []
    original = plots.loss_curve
    monkeypatch.setattr(sweep_files, "loss_curve", lambda *a, title="", **k: (
        titles.append(title), original(*a, title=title, **k))[1])
    monkeypatch.setattr(plots, "loss_curve", sweep_files.loss_curve)
    out = tmp_path / "ranks"
    document = json.loads((REPO / "documents/v2/das_rank_sweep.json").read_text())
    data = str(REPO / "documents" / "data")
    if not tracked:
        written = run_document(document, out=str(out), data_root=data,
                               events=Chain(sweep_files.FitPictures(out)))
        return out, written, titles, None
    with TrackingEvents(tracking_uri=str(tmp_path), out=str(out)) as events:
        written = run_document(document, out=str(out), data_root=data,
                               events=Chain(sweep_files.FitPictures(out), events))
    return out, written, titles, events


def test_an_untracked_fit_draws_its_loss_beside_its_points_tables_titled_with_its_point(
        tmp_path, monkeypatch):
    out, written, titles, _ = _rank_sweep(tmp_path, monkeypatch, tracked=False)
    for k in (1, 4, 16):
        picture = out / f"k={k}" / "fit_loss.png"
        assert picture.read_bytes().startswith(b"\x89PNG") and str(picture) in written
        assert (out / f"k={k}" / "rot.safetensors").is_file()  # beside the point's files
    assert sorted(titles) == sorted(f"causalab:tiny-llama · block_output L0 pos -1 · k={k} · fit"
                                    for k in (1, 4, 16)), titles


def test_a_tracked_fit_is_drawn_once_its_file_is_its_runs_plots_fit_loss(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    out, written, titles, events = _rank_sweep(tmp_path, monkeypatch, tracked=True)
    assert len(titles) == 3  # the folder's pictures are the runs': none drawn twice
    client = MlflowClient(events.uri)
    for label, run_id in events.point_runs.items():
        names = {a.path for a in client.list_artifacts(run_id, "plots")}
        assert names == {"plots/fit_loss.png"}, names
        assert "fit_loss.png" not in {a.path for a in client.list_artifacts(run_id)}
        stored = client.download_artifacts(run_id, "plots/fit_loss.png", str(tmp_path / label))
        assert Path(stored).read_bytes() == (out / label / "fit_loss.png").read_bytes()
