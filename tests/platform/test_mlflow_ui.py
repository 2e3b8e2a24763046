"""A sweep as a researcher first sees it: run from the command line, opened in MLflow's own UI.

`python -m causalab.run experiment=das` (three ranks and their random-subspace control, on the
tiny Llama to stay fast) tracks to a SQLite store in a temporary folder and prints the command
that shows the sweep (`see the sweep: …/causalab ui --store … --run …`). The test runs that
command as printed: it starts MLflow's UI (with causalab's app, causalab/server/mlflow_app.py)
on a free port and prints the addresses of the sweep. Debian's Chromium, driven by Playwright,
opens each printed address in a fresh profile: the runs page shows the three points as its
rows before any click, in model-training navigation, with `k` and both scores as columns;
the printed compare address, the same saved view in its chart view (one click away on the
runs page), shows `iia/test` and `iia/control` each against `k` on the first screen, each
point named in the legend. Ticking the three rows and pressing Compare reaches MLflow's own
compare page of the same three runs. A point's page, its address pasted without
`workflowType` into a fresh profile, opens in model-training navigation without the assistant
pane, its description on the first screen: its score with its interval beside its control.
A three-model multirun (`-m model=tiny_llama,tiny_gpt2,tiny_qwen2`) names each point by its
model and rank (`model=tiny_gpt2 k=4`): its table, grouped by model, and its compare charts'
legend, a line a model, name each model on the first screen. SIGINT stops `causalab ui` and
its server. The browser's window is 1280x800, the smallest common laptop screen, so what is
asserted in view is in view on larger ones too. Screenshots are saved under the test's
temporary folder (their paths are printed).
"""
from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 800}  # a 13" laptop
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run"]
_PRINTED = re.compile(r"^(mlflow ui on \S+|open the sweep|compare its points): (http://\S+)")
_TINY = ("experiment=das", "site.layer=1", "steps.fit.epochs=1")
MODELS = ("tiny_llama", "tiny_gpt2", "tiny_qwen2")


def _environment() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _run_sweep(folder: Path, *overrides: str, multirun: bool = False) -> str:
    where = f"hydra.sweep.dir={folder / 'multirun'}" if multirun else \
        f"hydra.run.dir={folder / 'job'}"
    done = subprocess.run(
        [sys.executable, "-m", "causalab.run", *(["-m"] if multirun else []), *_TINY,
         *overrides, f"tracking.uri={folder}", where,
         f"run.data_root={REPO / 'documents' / 'data'}"],
        cwd=folder, env=_environment(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _ui(printed: str, folder: Path):
    """Start the command the run printed last; yield (the addresses ``causalab ui`` printed,
    its process)."""
    command = re.findall(r"^see the sweep: (.+)$", printed, re.M)[-1]
    ui = subprocess.Popen(shlex.split(command), cwd=folder, env=_environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in ui.stdout], daemon=True).start()
    found: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 240
        while "compare its points" not in found:
            assert time.monotonic() < deadline and ui.poll() is None, found
            try:
                line = lines.get(timeout=1).strip()
            except queue.Empty:
                continue
            assert not line.startswith("note: "), line  # causalab's MLflow app is registered
            match = _PRINTED.match(line)
            if match:
                found["ui" if match.group(1).startswith("mlflow ui") else match.group(1)] = \
                    match.group(2)
        yield found, ui
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(30)


@pytest.fixture
def served(tmp_path):
    """Run the sweep, start the command it printed; yield (the run's stdout, the addresses
    ``causalab ui`` printed, its process)."""
    printed = _run_sweep(tmp_path, "model=tiny_llama")
    with _ui(printed, tmp_path) as (found, ui):
        yield printed, found, ui


def _in_view(locator) -> bool:
    """Visible inside the first screen of the page, without scrolling."""
    box = locator.bounding_box()
    return bool(box) and locator.is_visible() and box["x"] >= 0 and box["y"] >= 0 and \
        box["x"] + box["width"] <= VIEWPORT["width"] and \
        box["y"] + box["height"] <= VIEWPORT["height"]


def _shown(page, text) -> bool:
    """Some element reading exactly ``text`` (or matching it, a pattern) is in view on the
    first screen."""
    found = page.get_by_text(text, exact=True) if isinstance(text, str) else \
        page.get_by_text(text)
    return any(_in_view(found.nth(index)) for index in range(found.count()))


def _all_shown(page, texts, seconds: float = 60) -> dict[str, bool]:
    """Which of ``texts`` are in view, once all are or ``seconds`` passed (plots draw late)."""
    deadline = time.monotonic() + seconds
    while True:
        shown = {text: _shown(page, text) for text in texts}
        if all(shown.values()) or time.monotonic() > deadline:
            return shown
        time.sleep(0.5)


def _point_ids(folder: Path, parent: str) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`mlflow.parentRunId` = '{parent}'")
    return {run.info.run_name: run.info.run_id for run in runs}


def _training_navigation(page) -> bool:
    """MLflow's model-training sidebar (Runs, Models, Model registry), not its GenAI one, and
    no assistant pane over the page."""
    return page.get_by_text("Model registry", exact=True).first.is_visible() and \
        not page.get_by_text("Judges", exact=True).count() and \
        not any(found.is_visible() for found in page.get_by_text("Ask questions about").all())


def _open(driver, folder: Path, name: str):
    """A fresh browser profile, as a newcomer's first visit."""
    return driver.chromium.launch_persistent_context(
        str(folder / f"profile-{name}"), executable_path=CHROMIUM, headless=True, args=_FLAGS,
        viewport=VIEWPORT)


# A point's description, first line: its score and interval, then its control's.
_SCORED = re.compile(r"^iia/test \d\.\d{3} \[\d\.\d\d, \d\.\d\d\] · control iia/control "
                     r"\d\.\d{3} \[\d\.\d\d, \d\.\d\d\] · 12 rows$")


def test_causalab_ui_serves_what_the_run_printed_the_points_as_rows_and_their_comparison(
        served, tmp_path):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian chromium is missing: run `make setup`"
    printed, found, ui = served
    assert ":5000" not in printed and " mlflow ui" not in printed
    url = found["ui"]
    assert all(address.startswith(url + "/#/") for address in found.values() if address != url)
    shots = {name: tmp_path / f"{name}.png" for name in ("sweep", "compare", "ticked", "point",
                                                          "parent")}
    keys = ("iia/test", "iia/control")
    parent = re.search(r"--run (\S+)", printed).group(1)
    points_ids = _point_ids(tmp_path, parent)
    experiment = re.search(r"#/experiments/(\d+)/", found["open the sweep"]).group(1)
    with sync_playwright() as driver:
        browser = _open(driver, tmp_path, "sweep")
        try:
            page = browser.new_page()
            page.goto(found["open the sweep"])
            points = [page.get_by_role("link", name=name, exact=True).first
                      for name in ("k=1", "k=4", "k=16")]
            for point in points:
                point.wait_for(timeout=120_000)
            page.get_by_text("iia/control", exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots["sweep"]))
            rows = [point.bounding_box()["y"] for point in points]
            sweep_in_view = [_in_view(point) for point in points]
            sweep_navigation = _training_navigation(page)
            header = {name: page.get_by_role("columnheader", name=name, exact=True).first
                      .bounding_box()["x"] for name in ("k", "iia/test", "iia/control")}
            matching = page.get_by_text("matching runs").first.inner_text()
            page.locator("label:has(input[name=runs-view-mode][value=CHART])").click()
            page.wait_for_url("**compareRunsMode=CHART**", timeout=60_000)
            page.get_by_text("k=16 (iia/control)", exact=True).first.wait_for(timeout=60_000)
            toggled = _all_shown(page, keys)
            page.locator("label:has(input[name=runs-view-mode][value=TABLE])").click()
            for point in points:
                point.wait_for(timeout=60_000)
            for point in points:
                page.locator("[role=row]").filter(has=point).first.locator(
                    "input.ag-checkbox-input").check(force=True)
            page.get_by_role("button", name="Compare").first.click()
            page.wait_for_url("**/compare-runs**", timeout=60_000)
            ticked_ids = re.findall(r"[0-9a-f]{32}", page.url.replace("%22", '"'))
            page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
            page.get_by_text("iia/control", exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots["ticked"]))
            lines = [line.strip() for line in page.inner_text("body").splitlines()]
        finally:
            browser.close()
        browser = _open(driver, tmp_path, "compare")
        try:
            page = browser.new_page()
            page.goto(found["compare its points"])
            page.get_by_text("k=16 (iia/control)", exact=True).first.wait_for(timeout=120_000)
            legend = tuple(f"k={k} ({key})" for k in (1, 4, 16) for key in keys)
            compare_in_view = _all_shown(page, (*keys, re.compile(r"^sweep: k\b"), *legend))
            page.screenshot(path=str(shots["compare"]))
            compare_navigation = _training_navigation(page)
            scrolled = page.evaluate("Math.max(window.scrollY, document.scrollingElement"
                                     ".scrollTop)")
        finally:
            browser.close()
        # A point's page, its address as pasted (no workflowType), in a newcomer's browser.
        browser = _open(driver, tmp_path, "point")
        try:
            page = browser.new_page()
            page.goto(f"{url}/#/experiments/{experiment}/runs/{points_ids['k=4']}")
            page.get_by_text(_SCORED).first.wait_for(timeout=120_000)
            point_in_view = _all_shown(page, (_SCORED, "k=4"))
            page.screenshot(path=str(shots["point"]))
            point_navigation = _training_navigation(page)
            page.goto(f"{url}/#/experiments/{experiment}/runs/{parent}")
            page.get_by_text(re.compile(r"^3 points · ")).first.wait_for(timeout=120_000)
            plot = page.locator('img[src^="get-artifact?path=plots/sweep_curve.png"]').first
            plot.wait_for(timeout=60_000)
            drawn = page.evaluate("(img) => img.complete && img.naturalWidth", plot
                                  .element_handle())
            parent_in_view = _shown(page, re.compile(r"^3 points · ")) and \
                plot.bounding_box()["y"] < VIEWPORT["height"]
            page.screenshot(path=str(shots["parent"]))
        finally:
            browser.close()
    os.kill(ui.pid, signal.SIGINT)
    assert ui.wait(60) == 0
    print("screenshots: " + " ".join(str(p) for p in shots.values()))
    assert sweep_in_view == [True, True, True] and rows == sorted(rows)
    assert matching.startswith("3 ")  # the points alone: not their parent, not other runs
    assert sweep_navigation and compare_navigation and point_navigation
    assert header["k"] < header["iia/test"] < header["iia/control"]  # left to right
    # The compare page: both scores against k, each point in the legend, not scrolled to.
    assert all(compare_in_view.values()), compare_in_view
    assert scrolled == 0 and toggled == dict.fromkeys(keys, True)
    assert found["compare its points"] == found["open the sweep"] + "&compareRunsMode=CHART"
    assert "k\t1\t4\t16" in lines  # MLflow's compare page, reached by ticking the rows
    assert sorted(ticked_ids) == sorted(points_ids.values()) and len(points_ids) == 3
    # The point's score, interval and control first on its page; the parent's plot drawn.
    assert all(point_in_view.values()), point_in_view
    assert parent_in_view and drawn == 560
    assert not _answers(url)  # SIGINT stopped the server with it
    assert all(shot.stat().st_size > 10_000 for shot in shots.values())


def test_a_three_model_multirun_names_each_model_in_its_table_and_its_compare_legend(tmp_path):
    from playwright.sync_api import sync_playwright

    printed = _run_sweep(tmp_path, f"model={','.join(MODELS)}", multirun=True)
    assert re.search(r"^multirun: 9 point\(s\) under run ", printed, re.M), printed[-2000:]
    names = [f"model={model} k={k}" for model in MODELS for k in (1, 4, 16)]
    parent = re.findall(r"--run (\S+)", printed)[-1]
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    below = client.search_runs([e.experiment_id for e in client.search_experiments()],
                               "tags.`causalab.kind` = 'point'")
    assert sorted(run.info.run_name for run in below) == sorted(names)
    shots = {name: tmp_path / f"multirun_{name}.png" for name in ("table", "compare")}
    with _ui(printed, tmp_path) as (found, ui), sync_playwright() as driver:
        assert parent in found["open the sweep"]
        browser = _open(driver, tmp_path, "multirun")
        try:
            page = browser.new_page()
            page.goto(found["open the sweep"])
            page.get_by_role("link", name=names[-1], exact=True).first.wait_for(timeout=120_000)
            table = _all_shown(page, (*names, *MODELS, *[f"Group: {m}" for m in MODELS]))
            page.screenshot(path=str(shots["table"]))
            matching = page.get_by_text("matching runs").first.inner_text()
            page.goto(found["compare its points"])
            legend = [f"{model} ({key})" for model in MODELS
                      for key in ("iia/test", "iia/control")]
            page.get_by_text(legend[-1], exact=True).first.wait_for(timeout=120_000)
            compare = _all_shown(page, ("iia/test", "iia/control", *legend))
            page.screenshot(path=str(shots["compare"]))
            navigation = _training_navigation(page)
        finally:
            browser.close()
        os.kill(ui.pid, signal.SIGINT)
        assert ui.wait(60) == 0
    print("screenshots: " + " ".join(str(p) for p in shots.values()))
    assert all(table.values()), table
    assert matching.startswith("9 ") and navigation
    assert all(compare.values()), compare
    assert all(shot.stat().st_size > 10_000 for shot in shots.values())


def test_causalab_ui_refuses_a_store_that_is_not_there_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "causalab", "ui", "--store", str(tmp_path)],
                          cwd=tmp_path, env=_environment(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: --store: there is no tracking store at " \
                          f"sqlite:///{tmp_path}/mlflow.db\n"
    assert not (tmp_path / "mlflow.db").exists()


def test_causalab_ui_on_a_store_without_a_sweep_serves_its_runs_page_and_sigterm_stops_it(
        tmp_path):
    from mlflow import MlflowClient

    experiment = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").create_experiment("causalab")
    ui = subprocess.Popen([sys.executable, "-m", "causalab", "ui", "--store",
                           str(tmp_path / "mlflow.db")], cwd=tmp_path, env=_environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    try:
        served = ui.stdout.readline()
        url = _PRINTED.match(served.strip()).group(2)
        assert _answers(url) and url.startswith("http://127.0.0.1:")
        assert ui.stdout.readline().strip() == (
            f"runs: {url}/#/experiments/{experiment}/runs?workflowType=machine_learning")
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(60) == 0
        assert ui.stdout.read().strip() == f"stopped {url}"
        assert not _answers(url)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(30)


def test_a_saved_view_searches_a_sweep_s_points_by_parent_or_for_a_multirun_by_their_ids():
    import json

    from causalab.tracking import landing

    own = landing.points_filter("p", ["a", "b"], ["p", "p"])
    assert own == "tags.`mlflow.parentRunId` = 'p'"
    jobs = landing.points_filter("p", ["a", "b"], ["job1", "job2"])  # a multirun's jobs hold them
    assert jobs == "attributes.run_id IN ('a', 'b')"
    points = [({"k": k}, {"iia/test": 1.0, "iia/control": 0.0, "ce/test": 1.0,
                          "ce/control": 2.0}) for k in (1, 4)]
    state = json.loads(json.loads(landing.view_state(points, ["k"], name="das", created_ms=1,
                                                       search=own))["state"])
    assert state["searchFilter"] == own and state["orderByAsc"] is True
    assert state["selectedColumns"] == state["columnOrder"] == [
        "params.`k`", "metrics.`iia/test`", "metrics.`iia/control`", "metrics.`ce/test`",
        "metrics.`ce/control`"]
    charts, (section,) = state["compareRunCharts"], state["compareRunSections"]
    assert state["isAccordionReordered"] is True and state["runListHidden"] is False
    # points that logged no step axis: each score against the numeric param
    assert [(c["type"], c.get("xaxis", {}).get("key"), c.get("yaxis", {}).get("key"))
            for c in charts] == [("SCATTER", "k", "iia/test"), ("SCATTER", "k", "iia/control")]
    assert {c["metricSectionId"] for c in charts} == {section["uuid"]} and section["columns"] == 2
    assert len({c["uuid"] for c in charts}) == 2


def test_a_sweep_without_a_numeric_coordinate_charts_its_scores_as_bars_by_point():
    from causalab.tracking import landing

    points = [({"method": m}, {"iia/test": 1.0, "iia/control": 0.0}) for m in ("das", "pca")]
    charts, (section,) = landing.view_charts(points, ["method"])
    assert [(c["type"], c.get("metricKey")) for c in charts] == [
        ("BAR", "iia/test"), ("BAR", "iia/control")]
    assert section["name"] == "sweep: method"


def test_the_compare_address_is_the_saved_view_s_chart_view():
    from causalab.tracking import landing

    lines = landing.where("http://h:1/", "3", "p", ["a", "b"])
    assert lines == ["open the sweep: http://h:1/#/experiments/3/runs?viewStateShareKey=p"
                     "&workflowType=machine_learning",
                     "compare its points: http://h:1/#/experiments/3/runs?viewStateShareKey=p"
                     "&workflowType=machine_learning&compareRunsMode=CHART"]
    assert landing.where("http://h:1", "3", "p", ["a"]) == lines[:1]


def test_a_run_the_store_does_not_hold_is_refused_as_no_sweep_parent(tmp_path):
    from mlflow import MlflowClient

    from causalab.cli.ui import sweep_lines
    from causalab.errors import UsageError

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).search_experiments()  # a store, made by MLflow, without that run
    with pytest.raises(UsageError) as refused:
        sweep_lines(uri, "http://127.0.0.1:1", run_id="0123456789abcdef")
    assert refused.value.path == ("--run",)
    assert "run 0123456789abcdef is no sweep parent" in refused.value.message
