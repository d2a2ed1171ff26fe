"""The audit pipeline: plan → train runs → attack → results → report.

:func:`plan_audit` checks everything a config asks for — registry names, hyper-parameters,
dataset files, the model, partitions, noise calibration — before anything is written, so bad
input fails fast with a one-line error and leaves no output directory. :func:`run_audit`
then trains every run (skipping runs already in the store), runs the attacks and writes
``results.csv``, ``results.json``, ``report.html`` and ``manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import attacks.catalog  # noqa: F401  (registers the attacks)
import defenses.catalog  # noqa: F401  (registers the defenses)
from attacks.base import ATTACKS, AttackResult, MembershipAttack, MembershipExperiment
from audit import __version__, provenance
from audit.atomic import write_json, write_text
from audit.config import AuditConfig, config_to_yaml, merge
from audit.errors import UserInputError
from audit.schema import from_mapping, to_mapping
from audit.seeding import derive_seed, numpy_rng
from audit.store import RunStore
from audit.tasks import Task, build_task, keep_matrix, run_clients
from defenses.base import DEFENSES, AccountingSettings, Defense, PrivacyClaim
from defenses.engine import RecordSpec, TrainingConfig, TrainingJob
from defenses.flat import ParamLayout

STORE_FORMAT = 1  # bump when a change makes stored runs incompatible


@dataclass
class Experiment:
    """One defense configuration (one ε of a sweep), trained as N membership runs."""

    key: str
    label: str
    defense: Defense
    training: TrainingConfig
    delta: float
    target_epsilon: float | None
    claim: PrivacyClaim


@dataclass
class Plan:
    config: AuditConfig
    task: Task
    experiments: list[Experiment]
    attacks: list[MembershipAttack]
    keep: np.ndarray
    clients: list[list[np.ndarray]]
    accounting: AccountingSettings
    record: RecordSpec
    run_ids: dict[str, list[str]] = field(default_factory=dict)


def _format_epsilon(value: float) -> str:
    return f"{value:g}"


def _defense_class(name: str, field_path: str) -> type[Defense]:
    entry = DEFENSES.get(name, field_path)
    if not (isinstance(entry, type) and issubclass(entry, Defense)):
        raise UserInputError(f"{field_path}: '{name}' is not a subclass of defenses.base.Defense")
    return entry


def _record_spec(config: AuditConfig) -> RecordSpec:
    def norm(value):
        return tuple(value) if isinstance(value, list) else value

    return RecordSpec(norm(config.record.global_rounds), norm(config.record.upload_rounds), norm(config.record.upload_clients))


def check_device(device: str) -> None:
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UserInputError(f"device: '{device}' is not a torch device; allowed: cpu, cuda, cuda:N, mps") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"device: '{device}' requested but no CUDA device is available; use cpu")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise UserInputError(f"device: '{device}' requested but MPS is not available; use cpu")


def resolve_entries(config: AuditConfig) -> tuple[list[tuple], list[MembershipAttack]]:
    """Check every defense and attack entry (names, hyper-parameters, training overrides) without data."""
    check_device(config.device)
    defense_specs = []
    for i, entry in enumerate(config.defenses):
        cls = _defense_class(entry.name, f"defenses[{i}].name")
        params = from_mapping(cls.Params, entry.params, f"defenses[{i}].params")
        training = from_mapping(TrainingConfig, merge(to_mapping(config.training), entry.training), f"defenses[{i}].training")
        if entry.epsilons and not cls.private:
            raise UserInputError(f"defenses[{i}].epsilons: '{entry.name}' is not a DP defense; remove 'epsilons'")
        defense_specs.append((i, entry, cls, params, training))
    attack_list = []
    for i, entry in enumerate(config.attacks):
        cls = ATTACKS.get(entry.name, f"attacks[{i}].name")
        if config.membership.runs < cls.min_runs:
            raise UserInputError(f"membership.runs: attack '{entry.name}' needs at least {cls.min_runs} runs, got {config.membership.runs}")
        attack_list.append(cls(from_mapping(cls.Params, entry.params, f"attacks[{i}].params")))
    if not config.defenses:
        raise UserInputError("defenses: the list is empty; name at least one defense")
    return defense_specs, attack_list


def plan_audit(config: AuditConfig) -> Plan:
    """Validate and resolve a config into a plan; writes nothing."""
    accounting = AccountingSettings(config.accounting.accountant, config.accounting.conversion)
    defense_specs, attack_list = resolve_entries(config)

    task = build_task(config)
    keep = keep_matrix(len(task.pool), config.membership, config.seed)
    pool_labels = task.pool.labels.numpy()
    clients = [run_clients(pool_labels, keep[r], config.partition, config.seed, r) for r in range(config.membership.runs)]
    num_clients = config.partition.clients
    layout = ParamLayout.of(task.model_factory())

    experiments: list[Experiment] = []
    used_keys: set[str] = set()
    for i, entry, cls, params, training in defense_specs:
        base = cls(params, layout)
        base.validate(training, num_clients)
        targets = entry.epsilons or [None]
        for target in targets:
            defense = base if target is None else base.calibrate(target, entry.delta, training, num_clients, accounting)
            key = entry.name if target is None else f"{entry.name}-eps{_format_epsilon(target)}"
            key = key.replace(":", "_").replace("/", "_")
            if key in used_keys:
                key = f"{key}-{i}"
            used_keys.add(key)
            label = entry.label or entry.name
            if target is not None:
                label = f"{label} (ε={_format_epsilon(target)})"
            claim = defense.privacy_claim(training, num_clients, training.rounds, entry.delta, accounting)
            experiments.append(Experiment(key, label, defense, training, entry.delta, target, claim))
    return Plan(config, task, experiments, attack_list, keep, clients, accounting, _record_spec(config))


def run_id(plan: Plan, experiment: Experiment, run_index: int) -> str:
    """A stable id: the experiment key, the run index and a hash of everything that determines the run."""
    config = plan.config
    fingerprint = {
        "format": STORE_FORMAT,
        "seed": config.seed,
        "dataset": to_mapping(config.dataset),
        "model": to_mapping(config.model),
        "partition": to_mapping(config.partition),
        "membership": to_mapping(config.membership),
        "training": to_mapping(experiment.training),
        "defense": experiment.defense.name or type(experiment.defense).__name__,
        "params": to_mapping(asdict(experiment.defense.params)),
        "delta": experiment.delta,
        "accounting": asdict(plan.accounting),
        "record": to_mapping(config.record),
        "run": run_index,
        "keep": hashlib.sha256(np.packbits(plan.keep[run_index]).tobytes()).hexdigest(),
        "device": config.device,
    }
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{experiment.key}-r{run_index:03d}-{digest}"


def _bar(total: int, desc: str, quiet: bool) -> tqdm:
    return tqdm(total=total, desc=desc, disable=quiet, file=sys.stderr, leave=True, dynamic_ncols=True,
                mininterval=0.5, bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")


def train_runs(plan: Plan, store: RunStore, quiet: bool = False) -> dict[str, float]:
    """Train every run of every experiment not yet in the store; returns seconds per experiment."""
    config, task = plan.config, plan.task
    device = config.device
    pool_x, pool_y = task.pool.features.to(device), task.pool.labels.to(device)
    test_x, test_y = task.test.features.to(device), task.test.labels.to(device)
    timings: dict[str, float] = {}
    for experiment in plan.experiments:
        ids = [run_id(plan, experiment, r) for r in range(config.membership.runs)]
        plan.run_ids[experiment.key] = ids
        started = time.perf_counter()
        bar = _bar(len(ids), f"train {experiment.label}", quiet)
        for r, rid in enumerate(ids):
            if store.is_complete(rid):
                bar.set_postfix_str("resumed", refresh=False)
                bar.update(1)
                continue
            job = TrainingJob(task.model_factory, pool_x, pool_y, plan.clients[r], test_x, test_y, experiment.training,
                              seed=derive_seed(config.seed, "run", r), delta=experiment.delta,
                              accounting=plan.accounting, record=plan.record, device=device)
            run_started = time.perf_counter()
            outcome = experiment.defense.train(job)
            seconds = time.perf_counter() - run_started
            last = outcome.metrics[-1] if outcome.metrics else {}
            manifest = {
                "run_id": rid,
                "experiment": experiment.key,
                "label": experiment.label,
                "run_index": r,
                "config_seed": config.seed,
                "run_seed": job.seed,
                "dataset": config.dataset.name,
                "model": config.model.name,
                "defense": {"name": experiment.defense.name, "params": to_mapping(asdict(experiment.defense.params))},
                "training": to_mapping(experiment.training),
                "target_epsilon": experiment.target_epsilon,
                "claim": outcome.claim.as_dict(),
                "members": int(plan.keep[r].sum()),
                "client_sizes": [int(len(c)) for c in plan.clients[r]],
                "utility": {"test_accuracy": last.get("test_accuracy"), "test_loss": last.get("test_loss")},
                "layout": {"names": list(outcome.layout.names), "shapes": [list(s) for s in outcome.layout.shapes]},
                "server_view": {"observes": experiment.defense.observes},
                "timings": {"train_seconds": seconds},
                "versions": provenance.versions(),
            }
            store.save_run(rid, manifest, outcome.final_params, np.flatnonzero(plan.keep[r]), outcome.metrics,
                           outcome.server_view, outcome.global_models)
            accuracy = last.get("test_accuracy")
            bar.set_postfix_str(f"acc {accuracy:.3f}" if isinstance(accuracy, float) else "", refresh=False)
            bar.update(1)
        bar.close()
        timings[experiment.key] = time.perf_counter() - started
    return timings


def membership_experiment(plan: Plan, store: RunStore, experiment: Experiment) -> MembershipExperiment:
    ids = plan.run_ids[experiment.key]
    device = plan.config.device
    return MembershipExperiment(
        key=experiment.key,
        keep=plan.keep,
        features=plan.task.pool.features,
        labels=plan.task.pool.labels,
        kind=plan.task.kind,
        model=plan.task.model_factory().to(device),
        load_params=lambda r: store.load_params(ids[r], device=device),
        seed=derive_seed(plan.config.seed, "attack", experiment.key),
        device=device,
    )


def attack_runs(plan: Plan, store: RunStore, out: Path, quiet: bool = False) -> tuple[dict[str, list[AttackResult]], dict[str, float]]:
    """Run every attack on every experiment; scores are saved under ``<out>/attacks/<experiment>/``."""
    results: dict[str, list[AttackResult]] = {}
    timings: dict[str, float] = {}
    for experiment in plan.experiments:
        target = membership_experiment(plan, store, experiment)
        results[experiment.key] = []
        for attack in plan.attacks:
            started = time.perf_counter()
            bar = _bar(target.runs, f"{attack.name} {experiment.label}", quiet)

            def progress(done: int, total: int, bar: tqdm = bar) -> None:
                bar.n = done
                bar.refresh()

            produced = attack.run(target, progress)
            bar.close()
            for result in produced:
                folder = out / "attacks" / experiment.key
                folder.mkdir(parents=True, exist_ok=True)
                temporary = folder / f".{result.name}.tmp.npz"
                np.savez_compressed(temporary, scores=result.scores, truth=result.truth)
                temporary.replace(folder / f"{result.name}.npz")
            results[experiment.key].extend(produced)
            timings[f"{experiment.key}/{attack.name}"] = time.perf_counter() - started
    return results, timings


def diagnose_runs(plan: Plan, store: RunStore, out: Path, quiet: bool = False) -> dict[str, list[dict]]:
    """Sharpness and weight-perturbation robustness of every run's final model, from the store.

    Written to ``<out>/diagnostics/<experiment>.json`` (one entry per run), recomputed on every
    call: they are cheap next to training and depend on the diagnostics settings, not the run.
    """
    from defenses.diagnostics import perturbation_robustness, sharpness

    settings = plan.config.diagnostics
    results: dict[str, list[dict]] = {}
    if not settings.enabled:
        return results
    device = plan.config.device
    model = plan.task.model_factory().to(device)
    test_x, test_y = plan.task.test.features.to(device), plan.task.test.labels.to(device)
    keep_test = torch.as_tensor(numpy_rng(plan.config.seed, "diagnostics", "test").permutation(len(test_y))[:settings.max_records],
                                device=device)
    for experiment in plan.experiments:
        bar = _bar(len(plan.run_ids[experiment.key]), f"diagnose {experiment.label}", quiet)
        entries = []
        for r, rid in enumerate(plan.run_ids[experiment.key]):
            params = store.load_params(rid, device=device)
            members = np.concatenate(plan.clients[r])
            chosen = numpy_rng(plan.config.seed, "diagnostics", "train", r).permutation(members)[:settings.max_records]
            train_x = plan.task.pool.features[torch.as_tensor(chosen)].to(device)
            train_y = plan.task.pool.labels[torch.as_tensor(chosen)].to(device)
            seed = derive_seed(plan.config.seed, "diagnostics", experiment.key, r)
            entries.append({
                "run_id": rid,
                "sharpness": sharpness(model, params, train_x, train_y, settings.sharpness_radii,
                                       settings.sharpness_directions, seed),
                "robustness": perturbation_robustness(model, params, test_x[keep_test], test_y[keep_test],
                                                      settings.perturbation_stds, settings.perturbation_repeats, seed),
            })
            bar.update(1)
        bar.close()
        results[experiment.key] = entries
        write_json(out / "diagnostics" / f"{experiment.key}.json", entries)
    return results


def run_audit(config: AuditConfig, out: str | Path, *, attack: bool = True, quiet: bool = False,
              plan: Plan | None = None) -> dict[str, Any]:
    """Plan (unless given), train, attack and report. Returns paths and the results summary."""
    from audit.summary import build_results
    from reports.html import write_report
    from reports.results import write_results

    started = time.perf_counter()
    plan = plan or plan_audit(config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = RunStore(out)
    store.clean_staging()
    write_text(out / "config.yaml", config_to_yaml(config))
    train_seconds = train_runs(plan, store, quiet)
    attack_results, attack_seconds = attack_runs(plan, store, out, quiet) if attack else ({}, {})
    diagnostics = diagnose_runs(plan, store, out, quiet) if attack else {}
    paths: dict[str, Any] = {"out": str(out), "runs": str(store.runs)}
    summary = None
    if attack:
        summary = build_results(plan, store, attack_results, diagnostics)
        paths.update(write_results(summary, out))
        paths["report"] = str(write_report(summary, out / "report.html", manifest_extra={
            "versions": provenance.versions(), "machine": provenance.machine()}))
    write_json(out / "manifest.json", {
        "tool": {"name": "dpfl-audit", "version": __version__},
        "command": " ".join(sys.argv),
        "config_seed": config.seed,
        "experiments": {e.key: plan.run_ids.get(e.key, []) for e in plan.experiments},
        "timings": {"train_seconds": train_seconds, "attack_seconds": attack_seconds,
                    "total_seconds": time.perf_counter() - started},
        "versions": provenance.versions(),
        "machine": provenance.machine(),
    })
    paths["manifest"] = str(out / "manifest.json")
    return {"paths": paths, "summary": summary}
