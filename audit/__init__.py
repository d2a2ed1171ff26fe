"""dpfl-audit: train DPFL defenses, attack them, and report claimed vs measured privacy.

The public API, importable without the CLI (each name is loaded on first use, so ``import audit``
stays light and the foundation in :mod:`audit.core` imports nothing above it)::

    import audit
    config = audit.load_config("my.yaml")            # or None: the default audit; preset="smoke"
    plan = audit.plan(config)                        # every check, nothing written
    trained = audit.train(plan, "out")               # TrainedRuns: the runs, into out/runs (resumable)
    attacked = audit.attack(plan, "out")             # AttackResults: .results[experiment] = [AttackResult, ...]
    outcome = audit.audit(config, "out")             # AuditOutcome: all of it, results.csv/json, report.html
    table = outcome.frame                            # the results table as a pandas DataFrame
    table = audit.results_frame("out")               # the same, from a folder, results.json or results.csv
    audit.write_report(outcome.results, "out/report.html")
    outcomes = audit.check("out", "examples/policy.yaml")   # the CI gate's outcomes

    # systems trained elsewhere, judged against the claim their owner states (docs/how-to/own-system.md)
    claim = audit.stated_claim(epsilon, delta, "record")            # or "client"; relation, adversary
    scored = audit.score_checkpoints(factory, ["m0.safetensors", ...], keep, x, y)  # your checkpoints
    results = audit.audit_training(train, x, y, claim, out="out")  # your train(features, labels, seed)
    results = audit.audit_scores("scores.csv", epsilon, delta, out="out")  # scores another tool wrote
    results = audit.audit_flower(recorder, canaries, out="out")     # a Flower simulation (extra: flower)
    audit.audit_external(system, claim, attack_results, out="out")  # any AttackResults of your own

Packages, lowest layer first: :mod:`audit.core` (foundation) → :mod:`defenses` → :mod:`attacks`
→ :mod:`reports` → the rest of :mod:`audit` (plan, training, targets, attacking, pipeline, CLI).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"  # the one place it is written: pyproject.toml reads it (CHANGELOG.md, CITATION.cff agree)

#: public name → (module, attribute)
_API = {
    "load_config": ("audit.config", "load_config"),
    "plan": ("audit.planning", "plan_audit"),
    "train": ("audit.pipeline", "train"),
    "attack": ("audit.pipeline", "attack"),
    "audit": ("audit.pipeline", "run_audit"),
    "results_frame": ("reports.results", "results_frame"),
    "write_report": ("reports.html", "write_report"),
    "check": ("reports.gate", "check"),
    "score_checkpoints": ("audit.checkpoints", "score_checkpoints"),
    "audit_training": ("audit.own_training", "audit_training"),
    "audit_scores": ("audit.score_files", "audit_scores"),
    "audit_flower": ("audit.flower_audit", "audit_flower"),
    "stated_claim": ("audit.external", "stated_claim"),
    "audit_external": ("audit.external", "audit_external"),
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        module, attribute = _API[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'audit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
