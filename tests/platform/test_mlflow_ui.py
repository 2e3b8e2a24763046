"""A sweep as a researcher first sees it: run from the command line, opened in MLflow's own UI.

`python -m causalab.run experiment=das` (three ranks and their random-subspace control, on the
tiny Llama to stay fast) tracks to a SQLite store in a temporary folder and prints the address
of the sweep. The test starts `mlflow ui` on that store, on 127.0.0.1 in a process group of its
own, and drives Debian's Chromium with Playwright: it opens the printed address (the runs page
on the sweep's saved view), expands the sweep, ticks its three points, presses Compare, and
finds the swept param and both scores in the compare table. Screenshots of the three pages are
saved under the test's temporary folder (their paths are printed).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MLFLOW = Path(sys.executable).with_name("mlflow")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run"]
_PRINTED = re.compile(r"^(open the sweep|compare its points): (http://\S+)$", re.M)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _run_sweep(folder: Path) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        [sys.executable, "-m", "causalab.run", "experiment=das", "model=tiny_llama",
         "site.layer=1", "steps.fit.epochs=1", f"tracking.uri={folder}",
         f"hydra.run.dir={folder / 'job'}", f"run.data_root={REPO / 'documents' / 'data'}"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _close_assistant(page) -> None:
    """MLflow 3.17 opens its assistant pane on a browser's first visit, over a quarter of the
    runs table; a researcher closes it once (the profile remembers), and so does the test."""
    close = page.locator("button[data-component-id='mlflow.assistant.chat_panel.close']")
    if close.count() and close.first.is_visible():
        close.first.click()
        close.first.wait_for(state="hidden", timeout=30_000)


@pytest.fixture
def mlflow_ui(tmp_path):
    """Start ``mlflow ui`` on the sweep's store; yield (its URL, the printed lines)."""
    printed = dict(_PRINTED.findall(_run_sweep(tmp_path)))
    port = _free_port()
    log = open(tmp_path / "ui.log", "wb")
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    process = subprocess.Popen(
        [str(MLFLOW), "ui", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _answers(url):
            assert process.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "ui.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url, printed
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        log.close()


def test_the_printed_address_opens_the_sweep_and_its_points_compare_k_with_both_scores(
        mlflow_ui, tmp_path):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian chromium is missing: run `make setup`"
    url, printed = mlflow_ui
    assert set(printed) == {"open the sweep", "compare its points"}
    landing = printed["open the sweep"].replace("http://127.0.0.1:5000", url)
    assert "viewStateShareKey=" in landing
    shots = {name: tmp_path / f"{name}.png"
             for name in ("landing", "expanded", "compare", "table")}
    with sync_playwright() as driver:
        browser = driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=_FLAGS,
            viewport={"width": 1600, "height": 1000})
        try:
            page = browser.new_page()
            page.goto(landing)
            page.get_by_text("matching runs").first.wait_for(timeout=120_000)
            page.get_by_text("iia/control", exact=True).first.wait_for(timeout=60_000)
            _close_assistant(page)
            page.screenshot(path=str(shots["landing"]), full_page=True)
            header = page.locator("[role=columnheader]").all_inner_texts()
            sweep = page.locator("[role=row]").filter(has_text="experiment=das").first
            sweep.locator("button[data-component-id$='runnamecellrenderer.tsx_46']").click()
            for name in ("k=1", "k=4", "k=16"):
                point = page.locator("[role=row]").filter(
                    has=page.get_by_role("link", name=name, exact=True)).first
                point.wait_for(timeout=60_000)
                point.locator("input.ag-checkbox-input").check(force=True)
            page.screenshot(path=str(shots["expanded"]), full_page=True)
            page.get_by_role("button", name="Compare").first.click()
            page.wait_for_url("**/compare-runs**", timeout=60_000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots["compare"]), full_page=True)
            control = page.get_by_text("iia/control", exact=True).last
            control.scroll_into_view_if_needed(timeout=60_000)
            compared = [page.get_by_text(key, exact=True).last.is_visible()
                        for key in ("iia/test", "iia/control")]
            page.screenshot(path=str(shots["table"]), full_page=True)
            lines = [line.strip() for line in page.inner_text("body").splitlines()]
            compare_ids = re.findall(r"[0-9a-f]{32}", page.url.replace("%22", '"'))
        finally:
            browser.close()
    print("screenshots: " + " ".join(str(p) for p in shots.values()))
    assert {"k", "iia/test", "iia/control"} <= {h.strip() for h in header}
    assert compared == [True, True]
    assert "k\t1\t4\t16" in lines
    # The compare page the run printed is the one the clicks reached: the same three runs.
    assert sorted(compare_ids) == sorted(re.findall(r"[0-9a-f]{32}", printed["compare its points"]))
    assert all(shot.stat().st_size > 10_000 for shot in shots.values())
