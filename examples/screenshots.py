"""Screenshots of a report.html in headless Chromium, as PNG files for documentation.

    python examples/screenshots.py REPORT.html OUT.png [--at top|figures|SELECTOR] [--width 1200] [--height 900]

``--at top`` (the default) shows the page from its top: the title, the table of contents and the
headline; ``--at figures`` scrolls to the Figures section; any other value is a CSS selector
scrolled to the top of the window (e.g. ``'#exp-2'``). The PNG is the browser window, ``--width``
CSS pixels wide and ``--height`` tall, compressed losslessly (or, past 380 KB, to 256 colours), so
that a screenshot stays under 400 KB.

Needs Selenium and Chromium with its driver (Debian: ``apt-get install chromium chromium-driver``).
The browser starts with a fresh profile and without background networking; the report itself
fetches nothing (it is self-contained).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Chromium's flags for a headless run that reaches nothing outside the page
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars")
#: named places in a report
PLACES = {"top": None, "figures": "#plots"}


#: how to get the browser and its driver
INSTALL = "Debian: apt-get install chromium chromium-driver"


def chromium_paths() -> tuple[str, str] | None:
    """(Chromium, its driver) found on the PATH, or None when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    return (browser, driver_path) if browser and driver_path else None


@contextlib.contextmanager
def chromium(width: int = 1200, height: int = 900) -> Iterator[Any]:
    """A Selenium driver of headless Chromium with a fresh profile, its window ``width`` × ``height``
    CSS pixels; quit (and its profile removed) on exit. Raises RuntimeError when Chromium or its
    driver is not installed."""
    from selenium import webdriver

    found = chromium_paths()
    if found is None:
        raise RuntimeError(f"headless Chromium not installed ({INSTALL})")
    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = tempfile.mkdtemp(prefix="dpfl-audit-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        driver.set_window_size(width, height)
        # the window's outer size includes no browser chrome when headless, but make the viewport exact
        inner = driver.execute_script("return [window.innerWidth, window.innerHeight];")
        driver.set_window_size(2 * width - inner[0], 2 * height - inner[1])
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def compact_png(png: bytes, budget: int = 380_000) -> bytes:
    """``png`` re-encoded with PNG's best compression, colours kept exactly; only when that is
    still over ``budget`` bytes, reduced to a palette of 256 colours (a page of text and flat
    figures loses little, and the file shrinks several times)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    if buffer.tell() <= budget:
        return buffer.getvalue()
    buffer = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(buffer, format="PNG",
                                                                                                   optimize=True)
    return buffer.getvalue()


def screenshot(driver: Any, report: Path, out: Path, at: str = "top") -> Path:
    """Open ``report`` in ``driver``, scroll to ``at`` (a name of :data:`PLACES` or a CSS selector)
    and write the window as a compact PNG to ``out``."""
    driver.get(Path(report).resolve().as_uri())
    selector = PLACES.get(at, at)
    if selector is None:
        driver.execute_script("window.scrollTo(0, 0);")
    else:
        found = driver.execute_script(
            "const e = document.querySelector(arguments[0]); if (!e) return false;"
            "window.scrollTo(0, e.getBoundingClientRect().top + window.scrollY - 8); return true;", selector)
        if not found:
            raise ValueError(f"{report}: nothing matches {selector!r}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(compact_png(driver.get_screenshot_as_png()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a report.html")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--at", default="top", help="top, figures or a CSS selector (default: top)")
    parser.add_argument("--width", type=int, default=1200, help="window width in CSS pixels (default 1200)")
    parser.add_argument("--height", type=int, default=900, help="window height in CSS pixels (default 900)")
    args = parser.parse_args(argv)
    with chromium(args.width, args.height) as driver:
        path = screenshot(driver, args.report, args.out, args.at)
    print(f"{path}: {path.stat().st_size // 1000} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
