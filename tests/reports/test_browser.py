"""report.html in a real browser: headless Chromium renders every section and image, logs no
console error, and shows (does not run) markup from a run's name.

`.ci/run` installs Debian's `chromium` and `chromium-driver` when they are missing; elsewhere
the test skips when they are not on the PATH.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import HOSTILE

SECTIONS = ("summary", "results", "diagnostics", "plots", "definitions", "provenance")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync")


def render(report: Path, screenshot: Path) -> dict:
    """Open ``report`` in headless Chromium; return what the page rendered and logged."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.common.exceptions import NoAlertPresentException

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not browser or not driver_path:
        pytest.skip("headless Chromium not installed (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = tempfile.mkdtemp(prefix="dpfl-audit-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}", "--window-size=1400,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        driver.get(report.resolve().as_uri())
        try:
            alert = driver.switch_to.alert.text  # a script from the config would have raised one
        except NoAlertPresentException:
            alert = None
        sections = {s: bool(driver.find_elements("id", s)) for s in SECTIONS}
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt]);")
        title = driver.find_element("tag name", "h1").text
        driver.save_screenshot(str(screenshot))
        console = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return {"sections": sections, "images": images, "title": title, "console": console, "alert": alert}


def test_report_renders_in_headless_chromium(smoke_runs, tmp_path):
    _, (out, _) = smoke_runs
    screenshot = tmp_path / "report.png"
    page = render(out / "report.html", screenshot)
    assert all(page["sections"].values()), page["sections"]
    assert len(page["images"]) >= 5  # accuracy vs ε, ROC plots, curves, reconstruction grids
    broken = [alt for complete, width, alt in page["images"] if not complete or width == 0]
    assert not broken, broken
    assert page["console"] == []
    assert page["alert"] is None and HOSTILE in page["title"]  # shown as text, never executed
    assert screenshot.stat().st_size > 10_000 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
