"""Light commands load lightly: ``--help``, ``list``, ``config``, ``check``, ``epsilon`` and ``scores``
(without ``--out``) import neither torch nor matplotlib (``audit.core.lazy_modules``), and those
that compute no ε or statistic (``--help``, ``config``, ``check``) neither scipy.stats nor
dp-accounting: registering a component's name loads none of them.

Each command runs in a fresh interpreter, which then names the torch, torchvision and matplotlib
modules it holds: an import, not a timing, so the test does not depend on the machine's load. A
command that draws figures (``scores --out``) must show matplotlib, so the inspection is seen to
find what is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "matplotlib", "scipy", "dp_accounting")

#: runs ``audit.cli.main`` on the arguments (JSON in argv[1]), then prints the exit code and the
#: heavy modules loaded as the last line of stdout
_INSPECT = f"""
import json, sys
from audit.cli import main
code = main(json.loads(sys.argv[1]))
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r}
               and (not m.startswith('scipy') or m.startswith('scipy.stats')))
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


LIGHT = [
    ("--help",),
    ("list",),
    ("list", "--json"),
    ("config",),
    ("config", "--reference"),
    ("check", "{results}", "--policy", "{policy}"),
    ("epsilon", "--noise", "1", "--rate", "0.01", "--steps", "100", "--delta", "1e-5"),
    ("scores", "{scores}"),
    ("scores", "{scores}", "--json"),
]


#: the commands that compute an ε (``list`` states each defense's claim at the default settings)
#: or a statistic need dp-accounting or scipy.stats; the others name things without them
COMPUTES = {"list", "epsilon", "scores"}


@pytest.mark.parametrize("args", LIGHT, ids=[" ".join(a).replace("{", "").replace("}", "") for a in LIGHT])
def test_a_light_command_imports_neither_torch_nor_matplotlib(args, inputs):
    code, heavy = run_inspected(*(arg.format(**inputs) for arg in args))
    assert code == 0
    allowed = ("scipy.stats", "dp_accounting") if args[0] in COMPUTES else ()
    assert [m for m in heavy if not m.startswith(allowed)] == []


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
