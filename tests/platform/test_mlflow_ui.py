"""A sweep as a researcher first sees it: run from the command line, opened in MLflow's own UI.

`python -m causalab.run experiment=das` (three ranks and their random-subspace control, on the
tiny Llama to stay fast) tracks to a SQLite store in a temporary folder and prints the command
that shows the sweep (`see the sweep: …/causalab ui --store … --run …`). The test runs that
command as printed: it starts MLflow's UI on a free port and prints the addresses of the
sweep. Debian's Chromium, driven by Playwright, opens each printed address in a fresh profile:
the runs page shows the three points as its rows before any click, in model-training
navigation, with `k` and both scores as columns; the printed compare address, the same saved
view in its chart view (one click away on the runs page), shows `k`, `iia/test` and
`iia/control` on the first screen: `iia/test` and `iia/control` each plotted against `k`.
Ticking the three rows and pressing Compare reaches MLflow's own compare page of the same
three runs. SIGINT stops `causalab ui` and its server. The browser's window is 1280x800, the
smallest common laptop screen, so what is asserted in view is in view on larger ones too.
Screenshots are saved under the test's temporary folder (their paths are printed).
"""
from __future__ import annotations

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


def _environment() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _run_sweep(folder: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "causalab.run", "experiment=das", "model=tiny_llama",
         "site.layer=1", "steps.fit.epochs=1", f"tracking.uri={folder}",
         f"hydra.run.dir={folder / 'job'}", f"run.data_root={REPO / 'documents' / 'data'}"],
        cwd=folder, env=_environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.fixture
def served(tmp_path):
    """Run the sweep, start the command it printed; yield (the run's stdout, the addresses
    ``causalab ui`` printed, its process)."""
    printed = _run_sweep(tmp_path)
    command = re.search(r"^see the sweep: (.+)$", printed, re.M).group(1)
    ui = subprocess.Popen(shlex.split(command), cwd=tmp_path, env=_environment(),
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
                match = _PRINTED.match(lines.get(timeout=1).strip())
            except queue.Empty:
                continue
            if match:
                found["ui" if match.group(1).startswith("mlflow ui") else match.group(1)] = \
                    match.group(2)
        yield printed, found, ui
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(30)


def _in_view(locator) -> bool:
    """Visible inside the first screen of the page, without scrolling."""
    box = locator.bounding_box()
    return bool(box) and locator.is_visible() and box["x"] >= 0 and box["y"] >= 0 and \
        box["x"] + box["width"] <= VIEWPORT["width"] and \
        box["y"] + box["height"] <= VIEWPORT["height"]


def _shown(page, text: str) -> bool:
    """Some element reading exactly ``text`` is in view on the first screen."""
    found = page.get_by_text(text, exact=True)
    return any(_in_view(found.nth(index)) for index in range(found.count()))


def _all_shown(page, texts, seconds: float = 60) -> dict[str, bool]:
    """Which of ``texts`` are in view, once all are or ``seconds`` passed (plots draw late)."""
    deadline = time.monotonic() + seconds
    while True:
        shown = {text: _shown(page, text) for text in texts}
        if all(shown.values()) or time.monotonic() > deadline:
            return shown
        time.sleep(0.5)


def _point_ids(folder: Path, parent: str) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`mlflow.parentRunId` = '{parent}'")
    return [run.info.run_id for run in runs]


def _training_navigation(page) -> bool:
    """MLflow's model-training sidebar (Runs, Models, Model registry), not its GenAI one."""
    return page.get_by_text("Model registry", exact=True).first.is_visible() and \
        not page.get_by_text("Judges", exact=True).count()


def _open(driver, folder: Path, name: str):
    """A fresh browser profile, as a newcomer's first visit."""
    return driver.chromium.launch_persistent_context(
        str(folder / f"profile-{name}"), executable_path=CHROMIUM, headless=True, args=_FLAGS,
        viewport=VIEWPORT)


def test_causalab_ui_serves_what_the_run_printed_the_points_as_rows_and_their_comparison(
        served, tmp_path):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian chromium is missing: run `make setup`"
    printed, found, ui = served
    assert ":5000" not in printed and " mlflow ui" not in printed
    url = found["ui"]
    assert all(address.startswith(url + "/#/") for address in found.values() if address != url)
    shots = {name: tmp_path / f"{name}.png" for name in ("sweep", "compare", "ticked")}
    keys = ("k", "iia/test", "iia/control")
    points_ids = _point_ids(tmp_path, re.search(r"--run (\S+)", printed).group(1))
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
            page.get_by_text("k vs. iia/control", exact=True).first.wait_for(timeout=60_000)
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
            for title in ("k vs. iia/test", "k vs. iia/control"):
                page.get_by_text(title, exact=True).first.wait_for(timeout=120_000)
            compare_in_view = _all_shown(page, (*keys, "k=1", "k=4", "k=16"))
            page.screenshot(path=str(shots["compare"]))
            compare_navigation = _training_navigation(page)
            scrolled = page.evaluate("Math.max(window.scrollY, document.scrollingElement"
                                     ".scrollTop)")
        finally:
            browser.close()
    os.kill(ui.pid, signal.SIGINT)
    assert ui.wait(60) == 0
    print("screenshots: " + " ".join(str(p) for p in shots.values()))
    assert sweep_in_view == [True, True, True] and rows == sorted(rows)
    assert matching.startswith("3 ")  # the points alone: not their parent, not other runs
    assert sweep_navigation and compare_navigation
    assert header["k"] < header["iia/test"] < header["iia/control"]  # left to right
    # The compare page: both scores against k and the three points' names, not scrolled to.
    assert compare_in_view == dict.fromkeys((*keys, "k=1", "k=4", "k=16"), True), compare_in_view
    assert scrolled == 0 and toggled == dict.fromkeys(keys, True)
    assert found["compare its points"] == found["open the sweep"] + "&compareRunsMode=CHART"
    assert "k\t1\t4\t16" in lines  # MLflow's compare page, reached by ticking the rows
    assert sorted(ticked_ids) == sorted(points_ids) and len(points_ids) == 3
    assert not _answers(url)  # SIGINT stopped the server with it
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
    assert [(c["type"], c.get("xaxis", {}).get("key"), c.get("yaxis", {}).get("key"))
            for c in charts] == [("SCATTER", "k", "iia/test"), ("SCATTER", "k", "iia/control"),
                                 ("PARALLEL", None, None)]
    assert charts[2]["selectedParams"] == ["k"]
    assert charts[2]["selectedMetrics"] == ["iia/test", "iia/control"]
    assert {c["metricSectionId"] for c in charts} == {section["uuid"]} and section["columns"] == 2
    assert len({c["uuid"] for c in charts}) == 3


def test_a_sweep_without_a_numeric_coordinate_charts_its_scores_as_bars_by_point():
    from causalab.tracking import landing

    points = [({"method": m}, {"iia/test": 1.0, "iia/control": 0.0}) for m in ("das", "pca")]
    charts, (section,) = landing.view_charts(points, ["method"])
    assert [(c["type"], c.get("metricKey")) for c in charts] == [
        ("BAR", "iia/test"), ("BAR", "iia/control"), ("PARALLEL", None)]
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
