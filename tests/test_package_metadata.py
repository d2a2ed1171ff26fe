"""The files a published package carries agree with each other and with the code: LICENSE is the
Apache License 2.0 that pyproject.toml names, CITATION.cff is valid CFF 1.2.0 for this version,
CHANGELOG.md's newest release is this version, and the version is written once."""

from __future__ import annotations

import datetime
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import yaml

import audit

ROOT = Path(__file__).resolve().parents[1]

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

#: SHA-256 of https://www.apache.org/licenses/LICENSE-2.0.txt (its MD5 is 3b83ef96387f14655fc854ddc3c6bd57)
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _releases() -> list[tuple[str, str]]:
    return RELEASE.findall((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))


def test_the_version_is_written_once_and_read_by_the_package_metadata():
    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "audit.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", audit.__version__)
    # setuptools reads the literal without importing the package: it must stay a plain string assignment
    source = (ROOT / "audit" / "__init__.py").read_text(encoding="utf-8")
    assert len(re.findall(rf'^__version__ = "{re.escape(audit.__version__)}"', source, re.MULTILINE)) == 1


def test_the_license_is_the_full_apache_2_text_that_pyproject_names():
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256  # byte for byte the official text
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_the_citation_file_is_cff_1_2_for_this_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert {"cff-version", "message", "title", "authors"} <= set(cff)  # CFF 1.2.0's required keys
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["version"] == audit.__version__
    assert cff["license"] == _pyproject()["project"]["license"]
    assert cff["authors"] == [{"name": "dpfl-audit developers"}]
    assert isinstance(cff["abstract"], str) and cff["abstract"].strip()
    # released on the date the changelog gives this version
    released = dict(_releases())[audit.__version__]
    assert str(cff["date-released"]) == released
    datetime.date.fromisoformat(released)
    # the five papers whose algorithms the defenses implement
    references = cff["references"]
    assert len(references) == 5
    for reference in references:
        assert reference["type"] in {"article", "conference-paper"} and reference["title"]
        assert reference["authors"] and all(a["family-names"] and a["given-names"] for a in reference["authors"])
        assert 2000 < reference["year"] <= datetime.date.today().year
    titles = " | ".join(r["title"] for r in references)
    for name in ("Local Regularization and Sparsification", "Universally Harmonizing", "Flatter Landscape",
                 "Low-bandwidth Devices", "LDP-FL"):
        assert name in titles


def test_the_changelog_newest_release_is_this_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n") and "## [Unreleased]" in text
    releases = _releases()
    assert releases and releases[0][0] == audit.__version__
    versions = [tuple(int(part) for part in version.split(".")) for version, _ in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    dates = [date for _, date in releases]
    assert dates == sorted(dates, reverse=True)
    # user-facing text: no commit hashes or issue numbers
    assert not re.search(r"\b[0-9a-f]{7,40}\b|\bissue \d+|#\d+", text, re.IGNORECASE)


def test_the_command_line_prints_the_version():
    result = subprocess.run([sys.executable, "-m", "audit", "--version"], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"dpfl-audit {audit.__version__}"
