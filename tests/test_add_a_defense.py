"""docs/how-to/add-a-defense.md, the one page on adding a defense: its code is examples/custom_components.py
(quoted, block by block), its commands run, and the README and the defenses package point to it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import defenses
from audit.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to" / "add-a-defense.md"
EXAMPLE = ROOT / "examples" / "custom_components.py"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def _commands(prefix: str) -> list[str]:
    return [line for block in _blocks("bash") for line in block.splitlines() if line.startswith(prefix)]


def test_the_page_quotes_the_example_file():
    source = EXAMPLE.read_text(encoding="utf-8")
    blocks = _blocks("python")
    assert len(blocks) >= 3
    for block in blocks:
        assert block in source, block.splitlines()[0]


def test_the_conformance_command_on_the_page_runs_and_conforms(monkeypatch, capsys):
    (command,) = _commands("dpfl-audit conformance ")
    monkeypatch.chdir(ROOT)
    assert main([*shlex.split(command)[1:], "--quiet"]) == 0
    assert "overall: conforms" in capsys.readouterr().out


def test_the_run_command_on_the_page_is_the_one_the_pipeline_test_runs():
    (command,) = _commands("dpfl-audit run ")
    words = shlex.split(command)
    assert words[1:3] == ["run", "examples/custom.yaml"]
    test = (ROOT / "tests" / "audit" / "test_pipeline.py").read_text(encoding="utf-8")
    assert 'main(["run", "examples/custom.yaml", "--out"' in test


def test_the_datasets_page_shows_the_same_run_command():
    from tests.helpers import DOCS, readme_commands

    (command,) = _commands("dpfl-audit run ")
    assert readme_commands("dpfl-audit run", DOCS / "how-to" / "datasets-and-models.md") == [shlex.split(command)[2:]]


def test_the_readme_and_the_defenses_package_point_to_the_page():
    assert "docs/how-to/add-a-defense.md" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/how-to/add-a-defense.md" in (defenses.__doc__ or "")
