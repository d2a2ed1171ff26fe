"""report.html in a real browser: headless Chromium renders every section and image, logs no
console error, fetches nothing but the page and its data: URIs, shows (does not run) markup from a
run's name, and lays the page out top-down — the headline, then the figures, then the detail
tables, whose full verdict sentences stay folded until a click opens them.

The structure a reader relies on: every link of the table of contents leads to an element of the
page; every verdict is a badge with its status in words (one style for all, a colour each, none
in italics); every image has alt text, loads, and is shown at least 200 pixels wide; the print
stylesheet takes effect when the page is printed (nothing sticky, figures kept whole, major
sections on new pages). examples/screenshots.py makes the documentation's screenshots with the
same browser.

`.ci/run` installs Debian's `chromium` and `chromium-driver` when they are missing; elsewhere
the test skips when they are not on the PATH.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import HOSTILE, load_script

SECTIONS = ("headline", "summary", "plots", "results", "diagnostics", "definitions", "provenance")

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


#: the table of contents' links, and whether each leads to an element of the page
CONTENTS = """
return Array.from(document.querySelectorAll('nav#contents a')).map(a => [a.getAttribute('href'),
  !!document.getElementById(a.getAttribute('href').slice(1))]);
"""
#: every verdict place (headline cells, detail summaries, soundness lines): its badge's text, classes,
#: font style and background colour (null: no badge)
BADGES = """
const places = Array.from(document.querySelectorAll('td.verdict-cell, details.verdict-detail > summary, p.soundness'));
return places.map(p => { const b = p.querySelector('.badge'); if (!b) return null;
  const s = getComputedStyle(b); return [b.textContent.trim(), b.className, s.fontStyle, s.backgroundColor, s.color]; });
"""
#: every figure image: alt text, loaded, natural and shown width
IMAGES = """
return Array.from(document.querySelectorAll('#plots figure img')).map(i => [i.alt, i.complete, i.naturalWidth,
  i.getBoundingClientRect().width]);
"""
#: under print media: positions used, the figures' and sections' page-break rules
PRINTED = """
const positions = new Set(Array.from(document.querySelectorAll('*')).map(e => getComputedStyle(e).position));
const figure = document.querySelector('#plots figure');
const before = id => getComputedStyle(document.getElementById(id)).breakBefore;
return [Array.from(positions), getComputedStyle(figure).breakInside, before('plots'), before('results')];
"""


def _requests(performance_log: list[dict]) -> list[str]:
    """The URLs the page asked for, from Chromium's DevTools network events."""
    urls = []
    for entry in performance_log:
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def browser_script():
    """examples/screenshots.py, whose headless Chromium (fresh profile, no background networking)
    the tests use too; skips when Selenium, Chromium or its driver is missing."""
    pytest.importorskip("selenium.webdriver")
    script = load_script(Path(__file__).resolve().parents[2] / "examples" / "screenshots.py", "report_screenshots")
    if script.chromium_paths() is None:
        pytest.skip(f"headless Chromium not installed ({script.INSTALL})")
    return script


def render(report: Path, screenshot: Path) -> dict:
    """Open ``report`` in headless Chromium, click the first verdict's summary; return what the page
    rendered, requested and logged."""
    script = browser_script()
    from selenium.common.exceptions import NoAlertPresentException

    with script.chromium(1400, 2000) as driver:
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
        contents, badges, figures = driver.execute_script(CONTENTS), driver.execute_script(BADGES), driver.execute_script(IMAGES)
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
        printed = driver.execute_script(PRINTED)
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
        details_before = driver.execute_script(DETAILS)
        first = driver.find_element("css selector", "#results details.verdict-detail")
        folded_text = first.find_element("css selector", "p.full").text  # not rendered: Selenium gives ""
        first.find_element("tag name", "summary").click()
        opened = driver.execute_script("return arguments[0].open;", first)
        opened_text = first.find_element("css selector", "p.full").text
        driver.save_screenshot(str(screenshot))
        console = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
        requests = _requests(driver.get_log("performance"))
    return {"sections": sections, "images": images, "title": title, "console": console, "alert": alert,
            "headline": headline, "positions": positions, "in_order": in_order, "details": details_before,
            "folded_text": folded_text, "opened": opened, "opened_text": opened_text, "requests": requests,
            "url": report.resolve().as_uri(), "contents": contents, "badges": badges, "figures": figures,
            "printed": printed}


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


def test_contents_links_lead_to_the_page_s_elements(page):
    assert len(page["contents"]) >= 7 + len(page["results"]["experiments"])
    assert all(found for _, found in page["contents"]), [href for href, found in page["contents"] if not found]


def test_every_verdict_is_a_badge_in_words_and_none_is_italic(page):
    badges = page["badges"]
    assert badges and None not in badges  # every verdict place has its badge
    statuses = {"VIOLATION", "estimate above claim", "consistent", "inconclusive", "not covered", "vacuous", "no claim",
                "no measurement", "diverged"}
    assert all(text in statuses and "badge" in classes.split() for text, classes, *_ in badges)
    assert all(style == "normal" for _, _, style, *_ in badges)
    # one colour per status, and differing statuses look different
    looks = {}
    for text, _, _, background, color in badges:
        looks.setdefault(text, set()).add((background, color))
    assert all(len(seen) == 1 for seen in looks.values()), looks
    assert len({next(iter(seen)) for seen in looks.values()}) == len(looks)


def test_every_figure_has_alt_text_loads_and_is_readable_in_size(page):
    figures = page["figures"]
    assert figures
    for alt, complete, natural, shown in figures:
        assert alt.strip() and complete and natural > 0, alt
        assert shown >= 200, (alt, shown)


def test_the_print_stylesheet_takes_effect(page):
    positions, figure_break, plots_break, results_break = page["printed"]
    assert not {"sticky", "fixed"} & set(positions)
    assert figure_break == "avoid" and plots_break == "page" and results_break == "page"


def test_screenshots_script_makes_small_wide_pngs(smoke_runs, tmp_path):
    """examples/screenshots.py, which makes the documentation's screenshots: a PNG of the window,
    1200 CSS pixels wide, well under 400 KB."""
    script = browser_script()
    _, (out, _) = smoke_runs
    for at in ("top", "figures"):
        png = tmp_path / f"{at}.png"
        assert script.main([str(out / "report.html"), str(png), "--at", at]) == 0
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 400_000
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert (width, height) == (1200, 900)
    with pytest.raises(ValueError, match="nothing matches"):
        script.main([str(out / "report.html"), str(tmp_path / "x.png"), "--at", "#no-such-element"])
