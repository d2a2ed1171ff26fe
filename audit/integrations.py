"""The ways to audit a system dpfl-audit did not train, and which of them the installed
packages allow: ``dpfl-audit list --json`` shows them under ``integrations``.

Each integration names its entry points (Python and command line), the optional extra that
installs what it needs (the packages of the extra EXTRA, :func:`audit.core.extras.install_line`) and the packages it imports. An
integration is *available* when every one of those packages can be imported here; looking does
not import them (:func:`importlib.util.find_spec`), so ``list`` stays fast.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

from audit.core.extras import install_line


@dataclass(frozen=True)
class Integration:
    name: str
    summary: str
    python: str  # the public entry point
    command: str  # the command line ("" when there is none)
    extra: str | None  # the pip extra that installs its packages (None: the base install)
    packages: tuple[tuple[str, str], ...]  # (import name, distribution name) it needs


INTEGRATIONS = (
    Integration("checkpoints", "membership attacks (LiRA, RMIA, ...) on your own models' safetensors checkpoints",
                "audit.score_checkpoints", "", None, (("safetensors", "safetensors"),)),
    Integration("own-training", "your train(features, labels, seed) function driven through membership and canary runs",
                "audit.audit_training", "dpfl-audit audit-training SCRIPT.py:FUNCTION", None, ()),
    Integration("opacus", "record-level DP-SGD trained with Opacus, its accountant's claim audited (examples/opacus_audit.py)",
                "audit.audit_training", "dpfl-audit audit-training examples/opacus_audit.py:train", "opacus",
                (("opacus", "opacus"),)),
    Integration("score-files", "membership or one-run canary scores from any tool (CSV, NPZ; Parquet with pyarrow)",
                "audit.audit_scores", "dpfl-audit scores FILE", None, ()),
    Integration("flower", "a Flower simulation with Flower's DP-FedAvg wrappers: canary clients (a Mod), the server's view "
                "recorded, the claim from our accountant", "audit.audit_flower", "python examples/flower/app.py",
                "flower", (("flwr", "flwr"),)),
)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def importable(module: str) -> bool:
    """Whether ``module`` is installed, found without importing it (``list`` and argument checks stay fast)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or a module set to None in sys.modules
        return False


def integration_status() -> dict[str, dict[str, object]]:
    """Every integration with its entry points, extra, and whether (and with which package
    versions) it is available in this environment."""
    status: dict[str, dict[str, object]] = {}
    for entry in INTEGRATIONS:
        found = {module: importable(module) for module, _ in entry.packages}
        status[entry.name] = {
            "summary": entry.summary, "python": entry.python, "command": entry.command,
            "extra": entry.extra, "install": install_line(entry.extra) if entry.extra else "",
            "available": all(found.values()),
            "packages": {dist: _version(dist) if found[module] else None for module, dist in entry.packages},
        }
    return status
