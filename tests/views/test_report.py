"""`autotune report`: one self-contained HTML page, rendered in headless Chromium (Debian's package)."""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
import time
from pathlib import Path

import optuna
import pytest

from tests.support.cli import run_cli_in_process

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="Debian's chromium and chromium-driver are not installed (apt-get install -y chromium chromium-driver)",
)
# speed vs memory, history, importance (speed), importance (memory), knob effects, timeline, ranked
# table, the winner's loss beside the HF default's
FIGURES = 8
RENDER_TIMEOUT_S = 60


def test_pareto_front_keeps_only_configs_no_other_beats_on_memory_and_speed():
    from autotune.views._report_figures import pareto_front

    points = [(1.0, 10.0, 0), (2.0, 9.0, 1), (2.0, 15.0, 2), (3.0, 14.0, 3), (4.0, 20.0, 4), (0.5, 1.0, 5)]
    assert [p[2] for p in pareto_front(points)] == [5, 0, 2, 4]


@pytest.fixture(scope="module")
def report_file(searched_study, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    shown = run_cli_in_process(
        "report", "--storage", searched_study.storage, "--out", str(out), cwd=searched_study.workdir
    )
    assert shown.returncode == 0, shown.stderr
    assert f"wrote {out}" in shown.stdout
    return out


@pytest.mark.slow
def test_report_is_one_self_contained_page(report_file):
    page = report_file.read_text()
    assert page.count("<script") >= FIGURES + 1
    # plotly.js is inlined: no script or stylesheet comes from elsewhere, so the page works offline.
    assert re.findall(r"<script[^>]*\bsrc\s*=", page) == [] and "<link" not in page
    assert "Plotly.newPlot" in page
    assert "model TFLOPs" in page and "samples/s" in page and "ceiling" in page


@pytest.mark.slow
def test_report_shows_the_winners_loss_beside_the_defaults_and_says_whether_they_agree(report_file, searched_study):
    from autotune.result import winner_loss
    from autotune.storage import load_study
    from autotune.views.ranking import study_ranking

    study = load_study(searched_study.storage, searched_study.study_name)
    best = study_ranking(study)[0]
    loss = winner_loss(study.get_trials(), best.number, best.result)
    page = report_file.read_text()
    assert "Training loss: the winner beside the HF default" in page
    assert html.escape(loss.describe()) in page
    if loss.comparison is not None:
        assert "the losses agree" in loss.describe()


def start_chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        # No network at all: a page that needed a CDN would fail to draw, and say so in the console.
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_until_drawn(driver) -> None:
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    script = (
        "const plots = [...document.querySelectorAll('.js-plotly-plot')];"
        "return plots.length > 0 && plots.every(p => p._fullLayout && p.querySelector('.main-svg'));"
    )
    while not driver.execute_script(script):
        if time.monotonic() > deadline:
            pytest.fail(f"the figures were not drawn within {RENDER_TIMEOUT_S} s")
        time.sleep(0.2)


def full_page_png(driver) -> bytes:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1},
        },
    )
    return base64.b64decode(shot["data"])


def screenshot_report(html_path: Path, png_path: Path) -> None:
    """A full-page screenshot of a report (also how docs/report.png is made)."""
    driver = start_chromium()
    try:
        driver.get(html_path.resolve().as_uri())
        wait_until_drawn(driver)
        png_path.write_bytes(full_page_png(driver))
    finally:
        driver.quit()


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_report_draws_every_figure_in_chromium_without_errors(report_file, searched_study, tmp_path):
    driver = start_chromium()
    try:
        driver.get(report_file.resolve().as_uri())
        wait_until_drawn(driver)
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
        assert driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length") == FIGURES

        study = optuna.load_study(study_name=searched_study.study_name, storage=searched_study.storage)
        measured = [t for t in study.trials if "reused_from" not in t.user_attrs]
        drawn_points = driver.execute_script(
            "return document.querySelectorAll('#figure-0 .scatterlayer path.point').length"
        )
        assert drawn_points == len(measured)  # every trial of this study ran (or ran out of memory): one point each
        legend = driver.execute_script(
            "return [...document.querySelectorAll('#figure-0 .legendtext')].map(e => e.textContent)"
        )
        assert any(text.startswith("oom") for text in legend) and any(text.startswith("ok") for text in legend)
        ceiling = driver.execute_script(
            "return [...document.querySelectorAll('#figure-0 .annotation-text')].map(e => e.textContent)"
        )
        assert "ceiling 1.00 GiB" in ceiling
        bars = driver.execute_script("return document.querySelectorAll('#figure-5 .barlayer path').length")
        assert bars == len(study.trials)  # the timeline: one bar per trial, the OOM included
        table = driver.execute_script(
            "return [...document.querySelectorAll('#figure-6 .cell-text')].map(e => e.textContent)"
        )
        assert "rank" in table and any("TFLOPs" in text for text in table)  # plotly wraps long headers

        png = full_page_png(driver)
    finally:
        driver.quit()
    assert png.startswith(b"\x89PNG") and len(png) > 50_000
    # Kept for people (CI artifacts): AUTOTUNE_ARTIFACTS names a directory; otherwise the test's tmp dir.
    keep = Path(os.environ.get("AUTOTUNE_ARTIFACTS") or tmp_path)
    keep.mkdir(parents=True, exist_ok=True)
    (keep / "report.png").write_bytes(png)
