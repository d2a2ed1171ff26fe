"""report.html in a real browser: headless Chromium renders every section and image, logs no
console error, fetches nothing but the page and its data: URIs, shows (does not run) markup from a
run's name, and lays the page out top-down — the headline, then the figures, then the detail
tables, whose full verdict sentences stay folded until a click opens them.

`.ci/run` installs Debian's `chromium` and `chromium-driver` when they are missing; elsewhere
the test skips when they are not on the PATH.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import HOSTILE

SECTIONS = ("headline", "summary", "plots", "results", "diagnostics", "definitions", "provenance")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync")

#: page top (CSS pixels) of the headline table, the first figure and the first detail table
POSITIONS = """
const top = e => e ? e.getBoundingClientRect().top + window.scrollY : null;
return [top(document.querySelector('table.headline')), top(document.querySelector('#plots figure')),
        top(document.querySelector('#results table'))];
"""
#: does each element in the list follow the one before it in document order?
IN_ORDER = """
const nodes = [document.querySelector('table.headline'), document.querySelector('#plots figure'),
               document.querySelector('#results table')];
return nodes.slice(1).map((n, i) => !!(nodes[i].compareDocumentPosition(n) & Node.DOCUMENT_POSITION_FOLLOWING));
"""
#: every <details>: open?, and is its body (all but the summary) rendered?
DETAILS = """
return Array.from(document.querySelectorAll('details')).map(d => [d.open,
  Array.from(d.children).filter(c => c.tagName !== 'SUMMARY').some(c => c.checkVisibility())]);
"""


def _requests(performance_log: list[dict]) -> list[str]:
    """The URLs the page asked for, from Chromium's DevTools network events."""
    urls = []
    for entry in performance_log:
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def render(report: Path, screenshot: Path) -> dict:
    """Open ``report`` in headless Chromium, click the first verdict's summary; return what the page
    rendered, requested and logged."""
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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        driver.get("about:blank")
        driver.get_log("performance")  # drop what the browser's start page fetched: only the report counts
        driver.get(report.resolve().as_uri())
        try:
            alert = driver.switch_to.alert.text  # a script from the config would have raised one
        except NoAlertPresentException:
            alert = None
        sections = {s: bool(driver.find_elements("id", s)) for s in SECTIONS}
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt]);")
        title = driver.find_element("tag name", "h1").text
        headline = driver.find_element("id", "headline").text
        positions, in_order = driver.execute_script(POSITIONS), driver.execute_script(IN_ORDER)
        details_before = driver.execute_script(DETAILS)
        first = driver.find_element("css selector", "#results details.verdict-detail")
        folded_text = first.find_element("css selector", "p.full").text  # not rendered: Selenium gives ""
        first.find_element("tag name", "summary").click()
        opened = driver.execute_script("return arguments[0].open;", first)
        opened_text = first.find_element("css selector", "p.full").text
        driver.save_screenshot(str(screenshot))
        console = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
        requests = _requests(driver.get_log("performance"))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return {"sections": sections, "images": images, "title": title, "console": console, "alert": alert,
            "headline": headline, "positions": positions, "in_order": in_order, "details": details_before,
            "folded_text": folded_text, "opened": opened, "opened_text": opened_text, "requests": requests,
            "url": report.resolve().as_uri()}


@pytest.fixture(scope="module")
def page(smoke_runs, tmp_path_factory) -> dict:
    """The smoke preset's report as Chromium showed it (one browser for all the checks)."""
    _, (out, _) = smoke_runs
    screenshot = tmp_path_factory.mktemp("browser") / "report.png"
    shown = render(out / "report.html", screenshot)
    shown["screenshot"] = screenshot
    shown["results"] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return shown


def test_report_renders_in_headless_chromium(page):
    assert all(page["sections"].values()), page["sections"]
    assert len(page["images"]) >= 5  # accuracy vs ε, ROC plots, curves, reconstruction grids
    broken = [alt for complete, width, alt in page["images"] if not complete or width == 0]
    assert not broken, broken
    assert page["console"] == []
    assert page["alert"] is None and HOSTILE in page["title"]  # shown as text, never executed
    screenshot = page["screenshot"]
    assert screenshot.stat().st_size > 10_000 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_fetches_nothing_but_itself_and_data_uris(page):
    requests = page["requests"]
    assert page["url"] in requests  # the log did record the page's own load
    assert [url for url in requests if url != page["url"] and not url.startswith("data:")] == []


def test_headline_then_figures_then_details(page):
    """The reader meets one row per configuration first, the pictures next, the tables last."""
    headline, figure, details = page["positions"]
    assert None not in (headline, figure, details), page["positions"]
    assert headline < figure < details
    assert page["in_order"] == [True, True]
    for experiment in page["results"]["experiments"]:  # every configuration is in the headline block
        assert experiment["label"] in page["headline"]
        status = "VIOLATION" if experiment["soundness"] == "violation" else experiment["soundness"]
        assert status in page["headline"]


def test_verdict_sentences_are_folded_until_clicked(page):
    verdicts = [v for e in page["results"]["experiments"] for a in e["attacks"] for v in a["verdicts"]]
    details = page["details"]
    assert len(details) >= len(verdicts) > 0  # one per ε figure, plus "each configuration in words"
    assert all(not is_open and not shown for is_open, shown in details), details
    assert page["folded_text"] == ""  # the full sentence is not on screen ...
    first = verdicts[0]["text"]
    assert page["opened"] is True and page["opened_text"] == " ".join(first.split())  # ... until its summary is clicked
