"""The commands that describe rather than run: ``list`` (what is registered: datasets, models,
defenses, with ``--json`` their claims at their defaults, attacks, presets, studies, and the
integrations the installed extras allow), ``epsilon`` (what a
(subsampled) Gaussian mechanism costs, or the noise for a target ε) and ``config`` (what a config
resolves to, or every field's reference).

The registries and the accountants are imported inside each command, never at module level (see
``audit.commands``); they load no torch (``audit.core.lazy_modules``), and ``list`` states the
claims at the default model's parameter layout without building the model.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from audit.commands import EXIT_OK

if TYPE_CHECKING:
    from audit.config import AuditConfig
    from defenses.blocks.flat import ParamLayout


def command_list(args: argparse.Namespace) -> int:
    import attacks.catalog  # noqa: F401
    import defenses.catalog  # noqa: F401
    from attacks.base import ATTACKS
    from audit.config import preset_names
    from audit.core.datasets import DATASETS
    from audit.core.models import MODELS
    from audit.core.schema import field_help
    from defenses.base import DEFENSES

    def doc(entry) -> str:
        return (entry.__doc__ or "").strip().split("\n")[0]

    details = {
        "datasets": {n: {"summary": doc(DATASETS.get(n))} for n in DATASETS.names()},
        "models": {n: {"summary": doc(MODELS.get(n))} for n in MODELS.names()},
        "defenses": {n: {"summary": DEFENSES.get(n).summary, "reference": DEFENSES.get(n).reference,
                         "private": DEFENSES.get(n).private,
                         "params": {f: {"type": t, "default": d, "help": h} for f, t, d, h in field_help(DEFENSES.get(n).Params)}}
                     for n in DEFENSES.names()},
        "attacks": {n: {"summary": ATTACKS.get(n).summary, "reference": ATTACKS.get(n).reference,
                        "params": {f: {"type": t, "default": d, "help": h} for f, t, d, h in field_help(ATTACKS.get(n).Params)}}
                    for n in ATTACKS.names()},
    }
    if args.json:  # only the JSON shows the claims: the text listing needs no accountant (dp-accounting, scipy)
        for name, claim in _claims_at_defaults(DEFENSES).items():
            details["defenses"][name]["claim_at_defaults"] = claim
    listing = {kind: sorted(entries) for kind, entries in details.items()}
    listing["presets"] = preset_names()
    from audit.reproduce import study_names

    listing["studies"] = study_names()
    from audit.integrations import integration_status

    details["integrations"] = integration_status()
    listing["integrations"] = sorted(name for name, entry in details["integrations"].items() if entry["available"])
    if args.json:
        print(json.dumps({**listing, "details": details}, indent=2, ensure_ascii=False))
        return EXIT_OK
    for kind in ("datasets", "models", "defenses", "attacks"):
        print(f"{kind}:")
        for name in listing[kind]:
            print(f"  {name:<16} {details[kind][name]['summary']}")
            for field_name, spec in details[kind][name].get("params", {}).items():
                print(f"      {field_name} = {spec['default']!r}  ({spec['type']}) {spec['help']}")
    print("presets: " + ", ".join(listing["presets"]))
    print("reproduction studies: " + ", ".join(listing["studies"]))
    print("integrations (audit your own system):")
    for name, entry in details["integrations"].items():
        state = "available" if entry["available"] else f"not installed: {entry['install']}"
        print(f"  {name:<16} {entry['summary']} ({state})")
    return EXIT_OK


def _claims_at_defaults(registry) -> dict[str, dict[str, Any]]:
    """Every defense's claim per observer with its default hyper-parameters at the default audit's
    settings (digits, the default model, 20 clients, every client every round, 30 rounds, δ = 1e-5)."""
    from audit.config import AuditConfig
    from defenses.base import AccountingSettings
    from defenses.federated.engine import TrainingConfig

    config = AuditConfig()
    layout = default_layout(config)
    training, clients = TrainingConfig(), config.partition.clients
    out = {}
    for name in registry.names():
        claim = registry.get(name)(None, layout).privacy_claim(training, clients, training.rounds, 1e-5, AccountingSettings())
        out[name] = {"settings": f"defaults; {clients} clients, every client every round, {training.rounds} rounds, δ = 1e-5",
                     "unit": claim.unit, "headline": claim.adversary if claim.is_private else None,
                     "mechanism": claim.mechanism,
                     "adversaries": {a.adversary: {"epsilon": a.epsilon if a.covered else None, "relation": a.relation,
                                                   "observes": a.observes, "amplification": a.amplification,
                                                   "notes": a.notes} for a in claim.adversaries}}
    return out


def default_layout(config: AuditConfig) -> ParamLayout:
    """The parameter layout of the default audit's model on digits (1×8×8, 10 classes), computed
    without building the model (``list`` imports no torch): the default model is the MLP
    (tests/audit/test_light_commands.py checks this against the built model)."""
    from audit.core.models import mlp_parameter_shapes
    from defenses.blocks.flat import ParamLayout

    if config.model.name != "mlp":
        raise ValueError(f"the default model is '{config.model.name}', not the MLP default_layout computes")
    shapes = mlp_parameter_shapes((1, 8, 8), 10, **config.model.options)
    return ParamLayout(tuple(shapes), tuple(shapes.values()))


def command_epsilon(args: argparse.Namespace) -> int:
    from defenses.privacy.accounting import GaussianSchedule, calibrate_noise, compute_epsilon

    schedule = GaussianSchedule(args.noise if args.noise is not None else 1.0, args.rate, args.steps,
                                args.sampling, args.population)
    calibrated = args.target_epsilon is not None
    if calibrated:
        sigma = calibrate_noise(args.target_epsilon, schedule, args.delta, args.accountant, args.conversion)
        schedule = schedule.with_noise(sigma)
    report = compute_epsilon(schedule, args.delta, args.accountant, args.conversion)
    out = {**report.as_dict(), "noise": schedule.noise_multiplier, "rate": schedule.sampling_rate,
           "steps": schedule.steps, "sampling": schedule.sampling, "mechanism": schedule.describe()}
    if calibrated:
        out["target_epsilon"] = args.target_epsilon
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return EXIT_OK
    if calibrated:
        print(f"noise multiplier σ = {schedule.noise_multiplier:.6g} for target ε = {args.target_epsilon:g}")
    order = f", optimal order {report.optimal_order:g}" if report.optimal_order is not None else ""
    print(f"ε = {report.epsilon:.6g} at δ = {args.delta:g}  [{report.label}{order}]")
    print(f"mechanism: {schedule.describe()}")
    return EXIT_OK


def command_config(args: argparse.Namespace) -> int:
    from audit.config import AuditConfig, config_to_yaml, load_config
    from audit.core.schema import MAX_FLOAT, MAX_INT, field_reference

    if args.reference:
        print(f"{'field':<34} {'type':<40} {'range':<26} default")
        for row in field_reference(AuditConfig):
            default = json.dumps(row["default"], ensure_ascii=False)
            print(f"{row['field']:<34} {row['type'][:40]:<40} {row['range']:<26} {default[:40]}")
        print(f"Numbers must be finite; an integer without its own bound is at most {MAX_INT}, a number at most "
              f"{MAX_FLOAT:g} in magnitude; lists hold at most "
              "10000 values. A defense's or attack's params: `dpfl-audit list` (same rules).")
        return EXIT_OK
    print(config_to_yaml(load_config(args.config, args.preset, sets=args.sets)), end="")
    return EXIT_OK
