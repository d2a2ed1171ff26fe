"""The docs (README.md and docs/) as a user meets them.

- Every runnable shell block — a ```bash fence on the line right after ``<!-- runnable -->`` — runs,
  each page's blocks in order in one fresh working directory (with ``examples`` linked in), the
  environment's ``dpfl-audit`` and ``python`` first on PATH. A block that fails fails its page's test
  with the block's line and output.
- Every command a bash block shows (``dpfl-audit ...``, ``python ...``, ``.venv/bin/...``) is run:
  in a runnable block, by a test that reads it from its page with ``readme_commands(PROGRAM, PAGE)``,
  or (the install and test commands) by .ci/run.
- User-facing text cites papers, never the project's internal references (issue, spec or paper
  numbers, commit hashes, ``../shared``), and names only docs pages that exist.
- The generated reference (``docs/_hooks/generated.py``, run by ``mkdocs build`` in .ci/run): each
  generator checked against its source — the parser, the config schema, the JSON Schemas, the public
  API and the recorded benchmark files.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "_hooks" / "generated.py"
RUNNABLE = "<!-- runnable -->"
#: command lines the docs must show only if something runs them
PROGRAMS = ("dpfl-audit", "python", ".venv/bin/")


@pytest.fixture(scope="module")
def hook():
    return load_script(HOOK, "docs_generated_hook")


def doc_pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (the hook's folder aside)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p.is_file() and "_hooks" not in p.relative_to(ROOT).parts]


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    runnable: bool


def bash_blocks(page: Path) -> list[Block]:
    """The page's ```bash blocks, in order (fences indented in a list or an admonition included,
    their indentation removed)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```bash\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, start = len(fence.group(1)), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        runnable = start > 0 and lines[start - 1].strip() == RUNNABLE
        blocks.append(Block(page, start + 1, "\n".join(body) + "\n", runnable))
        i += 1
    return blocks


def command_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, command) of each command in ``block`` that starts with one of PROGRAMS
    (a line continued with a backslash joined to the next)."""
    out, pending, first = [], "", 0
    for offset, line in enumerate(block.code.splitlines(), start=1):
        if not pending:
            first = block.line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text, pending = (pending + line).strip(), ""
        if text.startswith(PROGRAMS):
            out.append((first, text))
    return out


#: marks a plain fence as the output of the page's last runnable block before it: checked against what that
#: block printed, so the figures a page shows are the ones the code prints
OUTPUT = "<!-- output -->"


def output_blocks(page: Path) -> list[tuple[int, str]]:
    """(line of the opening fence, text) of every fence right after an ``<!-- output -->`` line."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines[:-1]):
        if line.strip() == OUTPUT and lines[i + 1].strip().startswith("```"):
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip().startswith("```"))
            found.append((i + 2, "\n".join(lines[i + 2:end])))
    return found


def missing_lines(shown: str, printed: str) -> list[str]:
    """The lines of ``shown`` that no line of ``printed`` matches. Runs of blanks count as one, and
    "…" stands for anything (a shortened line): the pieces between must appear in order in one
    printed line."""
    printed_lines = [" ".join(line.split()) for line in printed.splitlines()]

    def matches(pieces: list[str], line: str) -> bool:
        at = 0
        for piece in pieces:
            at = line.find(piece, at)
            if at < 0:
                return False
            at += len(piece)
        return True

    missing = []
    for line in shown.splitlines():
        pieces = [" ".join(piece.split()) for piece in line.split("…") if piece.strip()]
        if pieces and not any(matches(pieces, printed_line) for printed_line in printed_lines):
            missing.append(line)
    return missing


def test_missing_lines_finds_what_was_not_printed():
    printed = "fedavg    92.0%   ∞  –  none  lira AUC 1.000, shokri AUC 0.9\nreport: out/report.html"
    assert missing_lines("fedavg 92.0% ∞ – none  lira AUC 1.000 …", printed) == []
    assert missing_lines("fedavg 92.0% … shokri AUC 0.9\n\nreport: out/report.html", printed) == []
    assert missing_lines("fedavg 91.0% … shokri", printed) == ["fedavg 91.0% … shokri"]
    assert missing_lines("shokri … fedavg", printed) == ["shokri … fedavg"]  # pieces in order


def test_every_output_block_follows_a_runnable_block():
    for page in doc_pages():
        runnable_lines = [b.line for b in bash_blocks(page) if b.runnable]
        for line, _ in output_blocks(page):
            assert any(r < line for r in runnable_lines), \
                f"{relative(page)}:{line}: an output block with no runnable block before it"


def runnable_pages() -> list[Path]:
    return [page for page in doc_pages() if any(b.runnable for b in bash_blocks(page))]


# ---------------------------------------------------------------------------------------------
# runnable blocks


def test_the_docs_have_runnable_blocks():
    """The runnable blocks are what keeps the docs' commands honest: losing every marker would
    leave the test below with nothing to run."""
    assert runnable_pages(), "no page has a `<!-- runnable -->` bash block"


@pytest.mark.parametrize("page", runnable_pages(), ids=relative)
def test_runnable_blocks_run(page: Path, tmp_path: Path):
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    runnable = [b for b in bash_blocks(page) if b.runnable]
    shown = output_blocks(page)
    for k, block in enumerate(runnable):
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        assert result.returncode == 0, (f"{relative(page)}:{block.line}: the runnable block exited with "
                                        f"{result.returncode}:\n{block.code}\n--- output ---\n{result.stdout[-4000:]}")
        following = runnable[k + 1].line if k + 1 < len(runnable) else float("inf")
        for line, text in shown:
            if block.line < line < following:
                missing = missing_lines(text, result.stdout)
                assert not missing, (f"{relative(page)}:{line}: the output shown is not what the block above printed; "
                                     "lines not printed:\n" + "\n".join(missing) + f"\n--- printed ---\n{result.stdout[-4000:]}")


# ---------------------------------------------------------------------------------------------
# every command shown is run


@dataclasses.dataclass(frozen=True)
class ReadmeCall:
    """A ``readme_commands(program, document)`` call in a test: which lines of which page it runs."""

    source: str
    program: tuple[str, ...]
    document: str | None  # a page path relative to the repository ('README.md'); None: not resolved

    def runs(self, page: str, command: str) -> bool:
        words = shlex.split(command, comments=True)
        if words[:len(self.program)] != list(self.program):
            return False
        return self.document is None or page == self.document or page.endswith("/" + self.document)


def _path_constants(node: ast.AST) -> str | None:
    """The path a ``ROOT / "docs" / "page.md"``-style expression names, from its string parts."""
    # ast.walk is breadth-first (the rightmost part of a `/` chain first): order the parts by position
    nodes = sorted((n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)),
                   key=lambda n: (n.lineno, n.col_offset))
    parts = [n.value for n in nodes]
    text = "/".join(p.strip("/") for p in parts if p)
    return text if text.endswith(".md") else None


def readme_calls() -> list[ReadmeCall]:
    """Every ``readme_commands(...)`` call in tests/, its program and (where it can be read from
    the source) its document."""
    calls = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assignments = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                       for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            function = getattr(node, "func", None)
            if not (isinstance(node, ast.Call) and getattr(function, "id", getattr(function, "attr", None)) == "readme_commands"):
                continue
            if not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
                continue
            document_node = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "document"), None)
            if document_node is None:
                document: str | None = "README.md"
            else:
                if isinstance(document_node, ast.Name):
                    document_node = assignments.get(document_node.id, document_node)
                document = _path_constants(document_node)
            calls.append(ReadmeCall(relative(path), tuple(shlex.split(node.args[0].value)), document))
    return calls


def ci_commands() -> list[list[str]]:
    """The commands .ci/run executes (its echo lines aside), each ``&&`` part apart, without the
    flags that only quieten them: the install and test commands the README shows are run there."""
    commands = []
    for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "echo ")):
            continue
        for part in line.split("&&"):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            commands.append([w for w in words if w not in ("--quiet", "-q")])
    return commands


def run_by_ci(command: str, ci: list[list[str]]) -> bool:
    """Every ``&&`` part of ``command`` begins a command .ci/run executes."""
    parts = [shlex.split(part, comments=True) for part in command.split("&&")]
    return all(words and any(c[:len(words)] == words for c in ci) for words in parts)


def test_readme_calls_are_found():
    """The scan below finds the tests that run the README's commands (a scan that found none would
    report every command)."""
    calls = readme_calls()
    assert any(c.program[:1] == ("dpfl-audit",) or c.program[-1:] == ("dpfl-audit",) for c in calls)
    assert all(c.program for c in calls)


def _quietless(command: str) -> tuple[str, ...]:
    """A command's words without the flags that only quieten it."""
    return tuple(w for w in shlex.split(command, comments=True) if w not in ("--quiet", "-q"))


def test_every_command_shown_is_run():
    calls, ci = readme_calls(), ci_commands()
    # a command a runnable block runs (on any page, e.g. the tutorial's for the README's quick start)
    run_elsewhere = {_quietless(command) for page in doc_pages() for block in bash_blocks(page) if block.runnable
                     for _, command in command_lines(block)}
    unrun = []
    for page in doc_pages():
        name = relative(page)
        for block in bash_blocks(page):
            if block.runnable:
                continue
            for line, command in command_lines(block):
                if _quietless(command) in run_elsewhere:
                    continue
                if not any(call.runs(name, command) for call in calls) and not run_by_ci(command, ci):
                    unrun.append(f"{name}:{line}: {command}")
    assert not unrun, ("commands shown in a bash block that nothing runs (mark the block `<!-- runnable -->` "
                       "or run it in a test with readme_commands(PROGRAM, PAGE)):\n" + "\n".join(unrun))


# ---------------------------------------------------------------------------------------------
# internal references and stale page names


#: what a reader outside the project cannot follow
INTERNAL = {
    "issue number": re.compile(r"(?i)\bissues? #?\d+\b"),
    "spec number": re.compile(r"(?i)\bspecs? \d{3}\b"),
    "paper number": re.compile(r"(?i)\bpapers? \d{3}\b"),
    "#N reference": re.compile(r"(?<![\w&#/])#\d+\b"),
    "commit hash": re.compile(r"(?<![\w#-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"),
    "../shared path": re.compile(r"\.\./shared"),
}
#: a CSS colour (#555, #1f77b4) where a `#N` reference would be
COLOUR_CONTEXT = re.compile(r"(?i)colou?r|background|border|fill|stroke|shadow|outline|:\s*#[0-9a-f]+\s*[;,)!]")


def internal_references(text: str, name: str) -> list[str]:
    found = []
    for kind, pattern in INTERNAL.items():
        for match in pattern.finditer(text):
            line_start = text.rfind("\n", 0, match.start()) + 1
            line_end = text.find("\n", match.end())
            line = text[line_start:line_end if line_end >= 0 else len(text)]
            if kind == "commit hash" and re.search(rf"https?://\S*{match.group(0)}", line):
                continue  # a link to a commit of another project's repository: a citation the reader can follow
            if kind == "#N reference" and len(match.group(0)) - 1 in (3, 4, 6, 8) and (
                    "css" in name or COLOUR_CONTEXT.search(line)):
                continue
            number = text.count("\n", 0, match.start()) + 1
            found.append(f"{name}:{number}: {kind} {match.group(0)!r}: {line.strip()[:160]}")
    return found


def user_facing_texts() -> dict[str, str]:
    """README, the docs pages, CHANGELOG.md, the examples (a notebook's cell sources, not its
    outputs) and the report templates, by path."""
    paths = [*doc_pages(), ROOT / "CHANGELOG.md", *sorted((ROOT / "reports" / "templates").glob("*")),
             *sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file())]
    texts = {}
    for path in paths:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file (an image)
        if path.suffix == ".ipynb":
            cells = json.loads(text).get("cells", [])
            text = "\n".join("".join(c.get("source", [])) if isinstance(c.get("source"), list) else c.get("source", "")
                             for c in cells)
        texts[relative(path)] = text
    return texts


def test_no_internal_references_in_user_facing_text():
    found = [hit for name, text in user_facing_texts().items() for hit in internal_references(text, name)]
    assert not found, "internal references in user-facing text (cite the paper: authors, year, section):\n" + "\n".join(found)


#: the kinds of reference a test or benchmark may not carry either (its code has colours and hashes)
CODE_KINDS = ("issue number", "spec number", "paper number", "../shared path")
#: the detector's own patterns and examples, and a test that asserts the notebook has none
DETECTOR_FILES = ("tests/test_docs.py", "tests/test_notebook.py")


def test_no_internal_references_in_tests_and_benchmarks():
    """Tests and benchmarks cite papers and behaviours, which outlive the project's issue tracker."""
    files = [p for folder in ("tests", "benchmarks") for p in sorted((ROOT / folder).rglob("*"))
             if p.is_file() and p.suffix in (".py", ".md", ".sh") and "results" not in p.relative_to(ROOT).parts
             and relative(p) not in DETECTOR_FILES]
    found = [hit for path in files for hit in internal_references(path.read_text(encoding="utf-8"), relative(path))
             if hit.split(": ")[1].split(" '")[0] in CODE_KINDS]
    assert not found, "\n".join(found)


def test_no_internal_references_in_the_generated_reference(hook):
    """The generated pages carry the CLI's help, the config fields' help, the schemas' and the
    API's descriptions to the reader: the same rule holds for them."""
    found = [hit for name in hook.GENERATORS for hit in internal_references(hook.generated(name), f"<generated: {name}>")]
    assert not found, "\n".join(found)


def test_the_internal_reference_scan_finds_what_it_looks_for():
    text = ("see issue 14 and spec 002 §4, paper 003, fixed in #123 at 3aff570; ../shared/data\n"
            "colour: #1f77b4; border: 1px solid #555;\n"
            "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855, 1,000,000 runs, decade, 2026\n")
    kinds = sorted(hit.split(": ")[1].split(" '")[0] for hit in internal_references(text, "x.md"))
    assert kinds == sorted(["issue number", "spec number", "paper number", "#N reference", "commit hash", "../shared path"])


#: a docs page named in text: docs/....md
DOC_PATH = re.compile(r"\bdocs/[\w./-]+?\.md\b")


def test_every_docs_page_named_exists(hook):
    """A page moved or renamed leaves no pointer to its old place in the README, the docs, the
    examples, the CLI's help or the packages' docstrings."""
    texts = dict(user_facing_texts())
    texts["<generated: cli>"] = hook.generated("cli")
    for package in ("audit", "defenses", "attacks", "reports"):
        for path in sorted((ROOT / package).rglob("*.py")):
            texts[relative(path)] = path.read_text(encoding="utf-8")
    missing = [f"{name}: {path}" for name, text in texts.items() for path in sorted(set(DOC_PATH.findall(text)))
               if not (ROOT / path).is_file()]
    assert not missing, "docs pages named but not there:\n" + "\n".join(missing)


# ---------------------------------------------------------------------------------------------
# the generated reference


def test_markers_are_replaced_and_unknown_ones_refused(hook):
    page = "# Title\n\ntext\n<!-- generated: performance -->\nmore <!-- generated: cli --> inline stays\n"
    out = hook.expand(page)
    assert out.startswith("# Title\n\ntext\n") and "<!-- generated: performance -->" not in out
    assert "more <!-- generated: cli --> inline stays" in out  # only a marker on a line of its own
    with pytest.raises(KeyError, match="unknown generated section 'nope'"):
        hook.expand("<!-- generated: nope -->\n")


def test_the_docs_markers_name_known_generators(hook):
    for page in doc_pages():
        for name in hook.MARKER.findall(page.read_text(encoding="utf-8")):
            assert name in hook.GENERATORS, f"{relative(page)}: unknown generated section {name!r}"


def test_rest_to_markdown(hook):
    text = "Uses :func:`audit.plan` and ``x = 1``; :class:`~a.B`\\ s.\n\nExample::\n\n    import audit\n    audit.plan(c)\n\nEnd."
    assert hook.rest_to_markdown(text) == ("Uses `audit.plan` and `x = 1`; `a.B`s.\n\nExample:\n\n```python\n"
                                           "import audit\naudit.plan(c)\n```\n\nEnd.")


def _sections(markdown: str, level: str) -> dict[str, str]:
    """The text under each heading of ``level`` ('## ' or '### ') up to the next heading of that
    level or above, by heading (code blocks hold no headings in these pages)."""
    depth = len(level.strip())
    sections: dict[str, str] = {}
    current: str | None = None
    for line in markdown.splitlines(keepends=True):
        heading = re.match(r"^(#{1,6}) (.+)$", line)
        if heading and len(heading.group(1)) <= depth:
            current = heading.group(2).strip() if len(heading.group(1)) == depth else None
            if current is not None:
                sections[current] = ""
            continue
        if current is not None:
            sections[current] += line
    return sections


def _cells(line: str) -> list[str]:
    """A table row's cells, split as Python-Markdown does: at pipes neither escaped nor in a code span."""
    cells, current, i = [], "", 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            current, i = current + line[i:i + 2], i + 2
        elif line[i] == "`":
            fence = re.match(r"`+", line[i:]).group(0)
            end = line.find(fence, i + len(fence))
            end = len(line) if end < 0 else end + len(fence)
            current, i = current + line[i:end], end
        elif line[i] == "|":
            cells.append(current.strip())
            current, i = "", i + 1
        else:
            current, i = current + line[i], i + 1
    return cells[1:]  # the text before the leading pipe


def _table_rows(markdown: str) -> list[list[str]]:
    return [_cells(line.strip()) for line in markdown.splitlines()
            if line.startswith("|") and not re.match(r"^\|(-+\|)+$", line)]


def test_cli_page_has_every_command_and_option(hook):
    parser = hook.cli_parser()
    page = hook.cli_markdown()
    sections = _sections(page, "## ")
    for name, _, sub in hook._subcommands(parser):
        section = sections[f"`dpfl-audit {name}`"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings and action.default is argparse.SUPPRESS:
                assert action.option_strings[-1] in sections["Options of every command"]
                continue
            shown = action.option_strings[0] if action.option_strings else (action.metavar or action.dest)
            assert f"`{shown}" in section, f"dpfl-audit {name}: {shown} missing"
            if action.help:
                help_text = hook.cell(hook._help_text(action, sub.prog))
                assert help_text in section, f"dpfl-audit {name} {shown}: help text missing"
            if action.choices:
                assert all(f"`{choice}`" in section for choice in action.choices)
            if action.default not in (None, False, [], argparse.SUPPRESS) and not isinstance(action.default, bool):
                assert f"`{action.default}`" in section, f"dpfl-audit {name} {shown}: default missing"


def test_cli_page_ranges_are_the_ranges_enforced(hook):
    """Every 'integer in [a, b]' the page shows is what the option accepts: a and b pass, just outside fails."""
    parser = hook.cli_parser()
    checked = 0
    for _, _, sub in hook._subcommands(parser):
        for action in sub._actions:
            allowed = hook._allowed(action)
            match = re.match(r"(integer|number) in ([\[(])([-\d.e+]+), ([-\d.e+]+)\]$", allowed)
            if not match:
                continue
            kind, open_low = match.group(1), match.group(2) == "("
            low, high = (int(match.group(3)), int(match.group(4))) if kind == "integer" else (
                float(match.group(3)), float(match.group(4)))
            step = 1 if kind == "integer" else max(abs(high), 1.0) * 1e-3
            assert action.type(str(high)) == high
            with pytest.raises(argparse.ArgumentTypeError):
                action.type(str(high + step))
            if open_low:
                with pytest.raises(argparse.ArgumentTypeError):
                    action.type(str(low))
            else:
                assert action.type(str(low)) == low
            checked += 1
    assert checked >= 20


def test_configuration_page_has_every_field_and_param(hook):
    import attacks.catalog  # noqa: F401
    import defenses.catalog  # noqa: F401
    from attacks.base import ATTACKS
    from audit.config import AuditConfig
    from audit.core.schema import field_help
    from defenses.base import DEFENSES

    page = hook.configuration_markdown()
    rows = {row[0]: row for row in _table_rows(page)}
    for row in hook.config_rows():
        shown = rows[f"`{row['field']}`"]
        assert shown[3] == hook.code(json.dumps(row["default"], ensure_ascii=False))
        assert shown[2] == hook.cell(row["range"])
    for field in dataclasses.fields(AuditConfig):
        assert f"`{field.name}" in page
    sections = _sections(page, "### ")
    for kind, registry in (("defense", DEFENSES), ("attack", ATTACKS)):
        for name in registry.names():
            section = sections[f"`{name}` {{#{kind}-{name}}}"]
            for param, _, default, _ in field_help(registry.get(name).Params):
                assert f"| `{param}` |" in section and hook.code(json.dumps(default, ensure_ascii=False)) in section


def test_results_schema_page_has_every_definition_and_field(hook):
    from reports.results import COLUMNS

    schema = json.loads(hook.RESULTS_SCHEMA.read_text(encoding="utf-8"))
    page = hook.results_schema_markdown()
    sections = _sections(page, "### ")
    for name, definition in schema["$defs"].items():
        section = sections[f"{name} {{#{hook._anchor(name)}}}"]
        for field, spec in definition.get("properties", {}).items():
            (row,) = [r for r in _table_rows(section) if r[0] == f"`{field}`"]
            assert row[2] == ("yes" if field in definition.get("required", []) else "")
            if spec.get("description"):
                assert row[4] == hook.cell(hook.rest_to_markdown(spec["description"]))
    top = _sections(page, "## ")
    fields = _table_rows(top["results.json {#schema-results-json}"].split("\n### ")[0])[1:]
    assert [row[0] for row in fields] == [f"`{f}`" for f in schema["properties"]]
    assert [r[0] for r in _table_rows(top["results.csv {#schema-results-csv}"])[1:]] == [f"`{c}`" for c in COLUMNS]


def test_scores_schema_page_has_every_column(hook):
    schema = json.loads(hook.SCORES_SCHEMA.read_text(encoding="utf-8"))
    page = hook.scores_schema_markdown()
    for definition in schema["$defs"].values():
        for field in definition.get("properties", {}):
            assert f"| `{field}` |" in page


def test_api_page_has_every_public_name(hook):
    import inspect

    import audit

    page = hook.api_markdown()
    sections = _sections(page, "## ")
    names = [n for n in audit.__all__ if n != "__version__"]
    assert hook.api_names() == names
    for name in names:
        section = sections[f"`audit.{name}` {{#audit-{name.replace('_', '-')}}}"]
        obj = getattr(audit, name)
        for parameter in inspect.signature(obj).parameters:
            assert re.search(rf"\b{parameter}\b", section.split("```")[1]), f"audit.{name}: {parameter} missing"
        doc = inspect.getdoc(obj)
        assert doc and hook.rest_to_markdown(doc) in section
    types = _sections(page, "### ")
    returned = {t for name in names for t in hook.returned_types(getattr(audit, name))}
    assert {"AuditOutcome", "Results", "PrivacyClaim"} <= {t.__name__ for t in returned}
    for kind in returned:
        section = types[f"`{kind.__name__}` {{#type-{kind.__name__.lower()}}}"]
        assert all(f"| `{field.name}` |" in section for field in dataclasses.fields(kind))


# -- performance: the recorded files


def _record(machine: dict, workloads: dict, **extra) -> dict:
    return {"machine": machine, "device": extra.pop("device", "cpu"), "quick": False, "workloads": workloads, **extra}


CPU = {"cpu": "Test CPU", "cores": 4, "memory_gib": 8.0, "python": "3.11", "torch": "2.4", "torch_threads": 4, "gpu": None}


def _workload(batched: float, loop: float, ratio: float, together: float = 10.0) -> dict:
    return {"description": "tiny", "batched_updates_per_second": batched, "loop_updates_per_second": loop,
            "batched_vs_loop": ratio, "membership": {"runs": 64, "together_seconds": together, "one_run_seconds": 1.0,
                                                      "together_vs_one_run": together}}


def test_performance_takes_the_latest_file_per_machine(hook, tmp_path: Path):
    write = lambda name, data: (tmp_path / name).write_text(json.dumps(data), encoding="utf-8")  # noqa: E731
    write("2026-01-01-cpu.json", _record(CPU, {"mlp": _workload(100.0, 10.0, 10.0)}))
    write("2026-02-01-cpu-before.json", _record(CPU, {"mlp": _workload(200.0, 10.0, 20.0)}))
    write("2026-02-01-cpu.json", _record(CPU, {"mlp": _workload(300.0, 10.0, 31.0)}))  # the ratio as recorded
    write("2026-03-01-cpu-quick.json", {**_record(CPU, {"mlp": _workload(1.0, 1.0, 1.0)}), "quick": True})
    write("2026-03-01-old-layout.json", {"machine": CPU, "workload_1": {}})
    write("coverage.json", {"replicates": 200})
    write("2026-01-15-gpu.json", _record({**CPU, "gpu": "Test GPU"}, {"cnn": _workload(5000.0, 50.0, 100.0)}, device="cuda"))
    records = hook.latest_per_machine(hook.benchmark_records(tmp_path))
    assert [r.path.name for r in records] == ["2026-02-01-cpu.json", "2026-01-15-gpu.json"]
    page = hook.performance_markdown(tmp_path)
    tables = _sections(page, "### ")
    mlp = {row[0]: row[1:] for row in _table_rows(tables["Workload `mlp`"])}
    assert mlp["batched engine, client updates/s"] == ["300", "not run"]
    assert mlp["batched ÷ loop"] == ["31.0×", "not run"]
    cnn = {row[0]: row[1:] for row in _table_rows(tables["Workload `cnn`"])}
    assert cnn["batched engine, client updates/s"] == ["not run", "5,000"]
    assert "`benchmarks/results/2026-02-01-cpu.json`" in tables["Machines"]


def test_performance_tables_equal_the_recorded_files(hook):
    """Each figure of the docs' performance page is its file's value (to the digits shown)."""
    records = hook.latest_per_machine(hook.benchmark_records())
    assert records, "no recorded benchmark file"
    tables = _sections(hook.performance_markdown(), "### ")
    machines = {row[0]: row[1:] for row in _table_rows(tables["Machines"])}
    for column, record in enumerate(records):
        assert machines["file"][column] == f"`benchmarks/results/{record.path.name}`"
        assert machines["date"][column].startswith(record.path.name[:10])
        for name, workload in record.data["workloads"].items():
            rows = {row[0]: row[1:] for row in _table_rows(tables[f"Workload `{name}`"])}
            figures = {"batched engine, client updates/s": workload["batched_updates_per_second"],
                       "plain per-client PyTorch loop, client updates/s": workload["loop_updates_per_second"],
                       "batched ÷ loop": workload["batched_vs_loop"],
                       "batched ÷ Flower": workload.get("batched_vs_flower"),
                       "together ÷ one run": workload.get("membership", {}).get("together_vs_one_run"),
                       "64-run membership experiment trained together, s": workload.get("membership", {}).get("together_seconds")}
            for figure, value in figures.items():
                shown = rows[figure][column]
                if value is None:
                    assert shown in ("–",) or shown.startswith("not run")
                    continue
                digits = len(shown.rstrip("×").split(".")[1]) if "." in shown else 0
                number = float(shown.rstrip("×").replace(",", ""))
                assert abs(number - value) <= 0.5 * 10 ** -digits + 1e-12, (figure, shown, value)


def test_inline_figures_are_the_reference_machines_recorded_values(hook):
    record = hook.reference_record()
    assert record.data["device"] == "cpu" and not record.baseline
    assert record.date == max(r.date for r in hook.benchmark_records() if r.data["device"] == "cpu")
    data = record.data
    expected = {
        "default-audit-seconds": (data["memory"]["wall_seconds"], " s"),
        "default-audit-peak-memory": (data["memory"]["peak_mib"], " MiB"),
        "smoke-seconds": (data["resume"]["first_run_seconds"], " s"),
        "smoke-rerun-seconds": (data["resume"]["rerun_median_seconds"], " s"),
        "mlp-batched-vs-loop": (data["workloads"]["mlp"]["batched_vs_loop"], "×"),
        "cnn-batched-vs-loop": (data["workloads"]["cnn"]["batched_vs_loop"], "×"),
    }
    for name, (value, unit) in expected.items():
        shown = hook.figure(name)
        assert shown.endswith(unit), (name, shown)
        number = shown.removesuffix(unit).replace(",", "")
        digits = len(number.split(".")[1]) if "." in number else 0
        assert abs(float(number) - value) <= 0.5 * 10 ** -digits + 1e-12, (name, shown, value)
    assert hook.figure("benchmark-date") == record.date
    line = "The default audit takes <!-- figure: default-audit-seconds --> here."
    assert hook.expand(line) == f"The default audit takes {hook.figure('default-audit-seconds')} here."
    with pytest.raises(KeyError, match="unknown figure"):
        hook.expand("<!-- figure: nope -->")
