"""Light commands load lightly: ``--help``, ``--version``, ``list``, ``config``, ``check``, ``epsilon``
and ``scores`` (without ``--out``) import neither torch, matplotlib nor scikit-learn
(``audit.core.lazy_modules``), and those that compute no ε or statistic (``--help`` and each
command's ``--help``, ``--version``, ``list`` without ``--json``, ``config``, ``check``) neither
scipy.stats, scipy.optimize, scipy.signal nor dp-accounting: registering or listing a component's
name loads none of them, so a heavy import put back at a module's top fails here.

Each command runs in a fresh interpreter, which then names the heavy modules it holds: an
import, not a timing, so the test does not depend on the machine's load (the latency itself is
measured with ``python -X importtime -m audit.cli list``). A command that draws figures
(``scores --out``) must show matplotlib, so the inspection is seen to find what is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: heavy packages (each with its submodules) and heavy parts of scipy: seconds of imports together
HEAVY = ("torch", "torchvision", "matplotlib", "sklearn", "dp_accounting",
         "scipy.stats", "scipy.optimize", "scipy.signal")

#: runs ``audit.cli.main`` on the arguments (JSON in argv[1]), then prints the exit code and the
#: heavy modules loaded as the last line of stdout
_INSPECT = f"""
import json, sys
from audit.cli import main
code = main(json.loads(sys.argv[1]))
heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {HEAVY!r}))
print(json.dumps({{"exit": code, "heavy": heavy}}))
"""


def run_inspected(*args: str) -> tuple[int, list[str]]:
    """(exit code, heavy modules loaded) of ``dpfl-audit ARGS`` in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", _INSPECT, json.dumps(list(args))], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    return report["exit"], report["heavy"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """A membership score file (2 runs × 10 records), the results folder ``scores --out`` writes
    from it, and a policy for ``check``."""
    folder = tmp_path_factory.mktemp("light")
    rows = ["run,unit,score,member"]
    rows += [f"r{run},u{unit},{(unit * 7 + run * 3) % 10 / 10 + 0.3 * (unit % 2):.2f},{unit % 2}"
             for run in range(2) for unit in range(10)]
    scores = folder / "scores.csv"
    scores.write_text("\n".join(rows) + "\n", encoding="utf-8")
    policy = folder / "policy.yaml"
    policy.write_text("rules:\n  - kind: no-violation\n", encoding="utf-8")
    paths = {"scores": str(scores), "policy": str(policy), "results": str(folder / "results")}
    code, heavy = run_inspected("scores", paths["scores"], "--out", paths["results"])
    assert code == 0 and (folder / "results" / "results.json").is_file()
    paths["heavy_with_out"] = json.dumps(heavy)
    return paths


#: what computing an ε with dp-accounting loads: its package imports its PLD (scipy.signal, which
#: imports scipy.stats) and its calibration (scipy.optimize)
ACCOUNTANT = ("dp_accounting", "scipy.stats", "scipy.signal", "scipy.optimize")
#: what the membership metrics of a score file load: their intervals and ε bounds (no accountant)
STATISTICS = ("scipy.stats", "scipy.optimize")

#: each light command and the heavy modules it may load: none where it only names things or prints
#: help; what it computes with otherwise (``list --json`` states each defense's claim at the
#: default settings, ``epsilon`` an ε, ``scores`` the membership metrics)
LIGHT: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("--help",), ()),
    (("--version",), ()),
    (("list",), ()),
    (("list", "--json"), ACCOUNTANT),
    (("config",), ()),
    (("config", "--reference"), ()),
    (("check", "--help"), ()),
    (("check", "{results}", "--policy", "{policy}"), ()),
    (("epsilon", "--help"), ()),
    (("epsilon", "--noise", "1", "--rate", "0.01", "--steps", "100", "--delta", "1e-5"), ACCOUNTANT),
    (("scores", "--help"), ()),
    (("scores", "{scores}"), STATISTICS),
    (("scores", "{scores}", "--json"), STATISTICS),
]


@pytest.mark.parametrize("args, allowed", LIGHT, ids=[" ".join(a).replace("{", "").replace("}", "") for a, _ in LIGHT])
def test_a_light_command_imports_only_what_it_computes_with(args, allowed, inputs):
    code, heavy = run_inspected(*(arg.format(**inputs) for arg in args))
    assert code == 0
    assert [m for m in heavy if not any(m == a or m.startswith(a + ".") for a in allowed)] == []


def test_the_inspection_sees_matplotlib_where_figures_are_drawn(inputs):
    """``scores --out`` writes report.html and figures/: matplotlib is loaded, and the inspection
    says so (a check that could never fail would prove nothing)."""
    heavy = json.loads(inputs["heavy_with_out"])
    assert "matplotlib" in heavy and "matplotlib.pyplot" in heavy


def test_list_states_the_claims_at_the_layout_of_the_built_default_model():
    """``list`` computes the default model's parameter layout without building it (no torch):
    it must be the layout of the model the default audit builds."""
    from audit.commands.catalog import default_layout
    from audit.config import AuditConfig
    from audit.core.models import build_model
    from defenses.blocks.flat import ParamLayout

    config = AuditConfig()
    built = build_model(config.model.name, (1, 8, 8), 10, dict(config.model.options))
    assert default_layout(config) == ParamLayout.of(built)


@pytest.mark.parametrize("hidden", [(), (5,), (9, 3, 2)])
def test_the_mlp_parameter_shapes_are_the_built_mlps(hidden):
    from audit.core.models import build_model, mlp_parameter_shapes

    model = build_model("mlp", (3, 4, 5), 7, {"hidden": list(hidden)})
    assert mlp_parameter_shapes((3, 4, 5), 7, hidden) == {n: tuple(p.shape) for n, p in model.named_parameters()}


def test_a_lazy_module_is_imported_when_first_used_not_before():
    code = ("import sys\n"
            "from audit.core.lazy_modules import lazy_module\n"
            "colorsys = lazy_module('colorsys')\n"
            "print('colorsys' in sys.modules)\n"
            "print(colorsys.rgb_to_hsv(1.0, 0.0, 0.0), 'colorsys' in sys.modules, colorsys.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.splitlines()
    assert out == ["False", "(0.0, 1.0, 1.0) True colorsys"]
