"""The public API: light to import, every name resolves, and the example the docs show runs as shown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import audit
from tests.helpers import DOCS, readme_commands

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "api_minimal.py"
PAGE = DOCS / "tutorial" / "notebook.md"  # "From Python": the page that shows the example


def test_import_audit_is_light_and_lists_the_api():
    code = "import sys, audit; print(audit.__all__); print('torch' in sys.modules, 'defenses' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    names, heavy = out.splitlines()
    assert names == str(["__version__", "load_config", "plan", "train", "attack", "audit", "results_frame", "write_report",
                          "check",
                          "score_checkpoints", "audit_training", "audit_scores", "audit_flower", "stated_claim",
                          "audit_external"])
    assert heavy == "False False"


def test_every_api_name_is_a_callable_with_a_docstring():
    for name in audit.__all__[1:]:
        value = getattr(audit, name)
        assert callable(value) and value.__doc__, name


def test_the_docs_show_the_tested_example_verbatim():
    page = PAGE.read_text(encoding="utf-8")
    code = EXAMPLE.read_text(encoding="utf-8")
    assert f"```python\n{code}```" in page and len(code.splitlines()) < 30


def test_the_example_trains_attacks_and_prints_the_table(tmp_path):
    (arguments,) = readme_commands("python examples/api_minimal.py", PAGE)  # the command the page shows
    assert arguments == ["api-out"]
    result = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert len(rows) == 6  # 2 configurations × (LiRA online, offline, loss threshold)
    aucs = {(row[0], row[-4]): float(row[-3]) for row in rows}
    assert all(0.0 <= auc <= 1.0 for auc in aucs.values())
    assert aucs[("fedavg", "lira-online")] >= 0.55  # the smoke preset's FedAvg overfits: LiRA sees it
    assert (tmp_path / "out" / "runs").is_dir() and (tmp_path / "out" / "attacks").is_dir()


def test_the_command_line_loads_torch_only_for_commands_that_need_it():
    """`dpfl-audit --help` and argument errors must not pay for torch (seconds on a small machine)."""
    code = "import sys, audit.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "False"
