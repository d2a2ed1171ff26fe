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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import attacks.catalog  # noqa: F401  (registers the attacks)
import defenses.catalog  # noqa: F401  (registers the defenses)
from attacks.base import (
    ATTACKS,
    Attack,
    AttackResult,
    MembershipExperiment,
    RunAttack,
    SideRun,
    TargetRun,
)
from attacks.canary_audit import CanaryAudit, CanaryContext, CanaryRun
from audit import __version__, provenance
from audit.config import AuditConfig, DatasetConfig, ModelConfig, config_to_yaml, merge
from audit.core.atomic import write_json, write_text
from audit.core.errors import UserInputError
from audit.core.safe_names import inside, slug
from audit.core.schema import from_mapping, to_mapping
from audit.core.seeding import derive_seed, numpy_rng
from audit.store import RunStore
from audit.tasks import Membership, Task, build_task, client_membership, record_membership
from defenses.base import DEFENSES, AccountingSettings, Defense, PrivacyClaim
from defenses.engine import (
    RecordSpec,
    TrainingConfig,
    TrainingDiverged,
    TrainingJob,
    chunk_size,
    initial_vector,
)
from defenses.flat import ParamLayout
from defenses.run_batch import train_together
from reports.soundness import measurement_delta

STORE_FORMAT = 4  # bump when a change makes stored runs incompatible (or trains them differently: 3 = Philox batch streams, 4 = fully keyed noise streams, claims per observer)


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
    attacks: list[Attack]
    membership: Membership
    accounting: AccountingSettings
    record: RecordSpec
    run_ids: dict[str, list[str]] = field(default_factory=dict)
    #: (experiment key, audit label) → the audit's own runs
    canary_ids: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: experiment key → [{"attack", "reason"}] for audits that cannot run on that defense
    skipped: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    #: experiment key → {"run", "run_id", "round", "what"}: the lowest-index membership run whose
    #: training diverged (the experiment is a diverged result: nothing of it is attacked)
    diverged: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: what run 0 stores: ``record`` plus the uploads the run attacks replay (None: as ``record``)
    target_record: RecordSpec | None = None

    def record_for(self, run_index: int) -> RecordSpec:
        return self.target_record if run_index == 0 and self.target_record is not None else self.record

    @property
    def keep(self) -> np.ndarray:
        return self.membership.keep

    @property
    def clients(self) -> list[list[np.ndarray]]:
        return self.membership.clients

    @property
    def membership_attacks(self) -> list[Attack]:
        return [a for a in self.attacks if a.kind == "membership"]

    @property
    def canary_audits(self) -> list[CanaryAudit]:
        return [a for a in self.attacks if isinstance(a, CanaryAudit)]


def _format_epsilon(value: float) -> str:
    return f"{value:g}"


def _defense_class(name: str, field_path: str) -> type[Defense]:
    entry = DEFENSES.get(name, field_path)
    if not (isinstance(entry, type) and issubclass(entry, Defense)):
        raise UserInputError(f"{field_path}: '{name}' is not a subclass of defenses.base.Defense")
    return entry


def _union_rounds(first: str | tuple[int, ...], second: str | tuple[int, ...]) -> str | tuple[int, ...]:
    """Rounds stored for either request ("final" adds nothing: the final model is always stored)."""
    if "all" in (first, second):
        return "all"
    listed = sorted({int(r) for r in (first, second) if isinstance(r, tuple) for r in r})
    if listed:
        return tuple(listed)
    return "final" if "final" in (first, second) else "none"


def _record_spec(config: AuditConfig, attacks: list[Attack], target: bool = False) -> RecordSpec:
    """What the runs store: the config's ``record`` plus the global models the attacks score; the
    ``target`` run (run 0, which the run attacks read) also the uploads they replay."""
    def norm(value):
        return tuple(value) if isinstance(value, list) else value

    global_rounds, upload_rounds = norm(config.record.global_rounds), norm(config.record.upload_rounds)
    for attack in attacks:
        global_rounds = _union_rounds(global_rounds, attack.rounds_needed(config.training.rounds))
        if target:
            upload_rounds = _union_rounds(upload_rounds, attack.uploads_needed(config.training.rounds))
    return RecordSpec(global_rounds, upload_rounds, norm(config.record.upload_clients))


def check_device(device: str) -> None:
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UserInputError(f"device: '{device}' is not a torch device; allowed: cpu, cuda, cuda:N, mps") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"device: '{device}' requested but no CUDA device is available; use cpu")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise UserInputError(f"device: '{device}' requested but MPS is not available; use cpu")


def resolve_entries(config: AuditConfig) -> tuple[list[tuple], list[Attack]]:
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
    attack_list: list[Attack] = []
    for i, entry in enumerate(config.attacks):
        cls = ATTACKS.get(entry.name, f"attacks[{i}].name")
        if cls.kind == "membership" and config.membership.runs < cls.min_runs:
            raise UserInputError(f"membership.runs: attack '{entry.name}' needs at least {cls.min_runs} runs, got {config.membership.runs}")
        attack = cls(from_mapping(cls.Params, entry.params, f"attacks[{i}].params"), entry.label)
        if attack.label in {a.label for a in attack_list}:
            raise UserInputError(f"attacks[{i}].label: two attacks are named '{attack.label}'; give one a different label")
        attack_list.append(attack)
    if not config.defenses:
        raise UserInputError("defenses: the list is empty; name at least one defense")
    return defense_specs, attack_list


def plan_audit(config: AuditConfig) -> Plan:
    """Validate and resolve a config into a plan; writes nothing."""
    accounting = AccountingSettings(config.accounting.accountant, config.accounting.conversion)
    defense_specs, attack_list = resolve_entries(config)

    task = build_task(config)
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
            key = slug(key.replace(":", "_").replace("/", "_"))  # names folders and run ids
            if key in used_keys:
                key = f"{key}-{i}"
            used_keys.add(key)
            label = entry.label or entry.name
            if target is not None:
                label = f"{label} (ε={_format_epsilon(target)})"
            claim = defense.privacy_claim(training, num_clients, training.rounds, entry.delta, accounting)
            experiments.append(Experiment(key, label, defense, training, entry.delta, target, claim))
    unit = config.membership.unit
    if unit == "auto":  # audit whole clients when a defense protects whole clients
        unit = "client" if any(e.claim.unit == "client" for e in experiments) else "record"
    _check_attack_targets(attack_list, unit, experiments)
    build = client_membership if unit == "client" else record_membership
    membership = build(task.pool.labels.numpy(), config.membership, config.partition, config.seed)
    return Plan(config, task, experiments, attack_list, membership, accounting, _record_spec(config, attack_list),
                target_record=_record_spec(config, attack_list, target=True))


def _check_attack_targets(attacks: list[Attack], unit: str, experiments: list[Experiment]) -> None:
    for i, attack in enumerate(attacks):
        if getattr(attack.params, "unit", None) == "client" and unit != "client":
            raise UserInputError(f"attacks[{i}].params.unit: 'client' needs runs that include whole clients; "
                                 "set membership.unit: client")
        rounds = getattr(attack.params, "rounds", "final")
        if isinstance(rounds, list):
            for experiment in experiments:
                if max(rounds) > experiment.training.rounds:
                    raise UserInputError(f"attacks[{i}].params.rounds: round {max(rounds)} exceeds the "
                                         f"{experiment.training.rounds} rounds of '{experiment.label}'")


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
        "record": asdict(plan.record_for(run_index)),
        "run": run_index,
        "keep": hashlib.sha256(np.packbits(plan.keep[run_index]).tobytes()).hexdigest(),
        "clients": _clients_digest(plan.clients[run_index]),
        "device": config.device,
    }
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{experiment.key}-r{run_index:03d}-{digest}"


def _clients_digest(clients: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for part in clients:
        digest.update(np.asarray(part, dtype=np.int64).tobytes() + b"|")
    return digest.hexdigest()


def canary_run_id(plan: Plan, experiment: Experiment, audit: CanaryAudit, index: int) -> str:
    base = run_id(plan, experiment, index % plan.config.membership.runs)
    fingerprint = {"base": base, "audit": audit.name, "label": audit.label, "params": to_mapping(asdict(audit.params)),
                   "index": index}
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{experiment.key}-{slug(audit.label)}-c{index:03d}-{digest}"


def _bar(total: int, desc: str, quiet: bool) -> tqdm:
    return tqdm(total=total, desc=desc, disable=quiet, file=sys.stderr, leave=True, dynamic_ncols=True,
                mininterval=0.5, bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")


def _manifest(plan: Plan, experiment: Experiment, rid: str, run_index: int, job: TrainingJob, outcome, seconds: float,
              members: np.ndarray) -> dict[str, Any]:
    last = outcome.metrics[-1] if outcome.metrics else {}
    return {
        "run_id": rid,
        "experiment": experiment.key,
        "label": experiment.label,
        "run_index": run_index,
        "config_seed": plan.config.seed,
        "run_seed": job.seed,
        "dataset": plan.config.dataset.name,
        "model": plan.config.model.name,
        "defense": {"name": experiment.defense.name, "params": to_mapping(asdict(experiment.defense.params))},
        "training": to_mapping(experiment.training),
        "target_epsilon": experiment.target_epsilon,
        "claim": outcome.claim.as_dict(),
        "membership_unit": plan.membership.unit,
        "members": int(len(members)),
        "client_sizes": [int(len(c)) for c in job.clients],
        "utility": {"test_accuracy": last.get("test_accuracy"), "test_loss": last.get("test_loss")},
        "layout": {"names": list(outcome.layout.names), "shapes": [list(s) for s in outcome.layout.shapes]},
        "server_view": {"observes": experiment.defense.observes},
        "timings": {"train_seconds": seconds},
        "versions": provenance.versions(),
    }


@dataclass
class PendingRun:
    """A run to train and store: its id and index, its job, its members, extra manifest fields."""

    rid: str
    index: int
    job: TrainingJob
    members: np.ndarray
    extra: dict[str, Any] | None = None


def train_and_store(plan: Plan, store: RunStore, experiment: Experiment, runs: list[PendingRun]
                    ) -> list[tuple[PendingRun, TrainingDiverged]]:
    """Train runs of one experiment together (:func:`defenses.run_batch.train_together`: one
    batched computation where the defense allows it) and store each that finished; returns the
    runs whose training diverged. Those are not stored (nothing half-trained looks finished): a
    rerun trains them again, and they diverge at the same round. A run's result does not depend
    on the runs it is trained with."""
    if not runs:
        return []
    started = time.perf_counter()
    outcomes = train_together(experiment.defense, [run.job for run in runs])
    seconds = (time.perf_counter() - started) / len(runs)  # shared computation: the mean per run
    diverged = []
    for run, outcome in zip(runs, outcomes):
        if isinstance(outcome, TrainingDiverged):
            diverged.append((run, outcome))
            continue
        manifest = _manifest(plan, experiment, run.rid, run.index, run.job, outcome, seconds, run.members)
        manifest["timings"]["trained_together"] = len(runs)
        manifest.update(run.extra or {})
        store.save_run(run.rid, manifest, outcome.final_params, run.members, outcome.metrics, outcome.server_view,
                       outcome.global_models)
    return diverged


def first_divergence(diverged: list[tuple[PendingRun, TrainingDiverged]]) -> dict[str, Any] | None:
    """The diverged run of lowest index, as results.json records it (None when none diverged)."""
    if not diverged:
        return None
    run, failure = min(diverged, key=lambda item: item[0].index)
    return {"run": run.index, "run_id": run.rid, "round": failure.round, "what": failure.what}


def divergence_reason(diverged: dict[str, Any], kind: str = "run") -> str:
    """Why the attacks of a diverged experiment (or one canary audit) are skipped."""
    return f"training diverged: {kind} {diverged['run']} at round {diverged['round']} ({diverged['what']})"


def warn(text: str) -> None:
    """One line on stderr that leaves the progress bars intact (shown with --quiet too)."""
    tqdm.write(f"dpfl-audit: warning: {text}", file=sys.stderr)


def _job(plan: Plan, experiment: Experiment, clients: list[np.ndarray], seed: int, pool_x=None, pool_y=None,
         update_canaries: torch.Tensor | None = None, record: RecordSpec | None = None) -> TrainingJob:
    task, device = plan.task, plan.config.device
    pool_x = task.pool.features if pool_x is None else pool_x
    pool_y = task.pool.labels if pool_y is None else pool_y
    return TrainingJob(task.model_factory, pool_x.to(device), pool_y.to(device), clients, task.test.features.to(device),
                       task.test.labels.to(device), experiment.training, seed=seed, delta=experiment.delta,
                       accounting=plan.accounting, record=record or plan.record, device=device,
                       update_canaries=None if update_canaries is None else update_canaries.to(device))


def membership_pending(plan: Plan, store: RunStore, experiment: Experiment, r: int) -> PendingRun | None:
    """Membership run ``r`` of ``experiment`` as a run to train, or None when the store has it."""
    rid = run_id(plan, experiment, r)
    if store.is_complete(rid):
        return None
    job = _job(plan, experiment, plan.clients[r], derive_seed(plan.config.seed, "run", r), record=plan.record_for(r))
    return PendingRun(rid, r, job, np.flatnonzero(plan.keep[r]))


def train_membership_runs(plan: Plan, store: RunStore, experiment: Experiment, runs: list[int]) -> list[str]:
    """Membership runs ``runs`` of ``experiment``, trained together unless the store has them; returns
    the ids of those stored. A run whose training diverges is not stored; the lowest-index one is
    noted in ``plan.diverged``."""
    pending = [p for p in (membership_pending(plan, store, experiment, r) for r in runs) if p is not None]
    first = first_divergence(train_and_store(plan, store, experiment, pending))
    noted = plan.diverged.get(experiment.key)
    if first is not None and (noted is None or first["run"] < noted["run"]):
        plan.diverged[experiment.key] = first
    return [rid for rid in (run_id(plan, experiment, r) for r in runs) if store.is_complete(rid)]


def joint_run_limit(plan: Plan, experiment: Experiment) -> int:
    """How many runs train together by default: as many as fit the batched computation one
    run's round would use (the engine's chunk of about 2^25 values), at least one."""
    dim = ParamLayout.of(plan.task.model_factory()).dim
    training = experiment.training
    clients = len(plan.clients[0]) if plan.clients else 1
    per_round = max(1.0, training.sampling_rate(clients) * clients)
    return max(1, int(chunk_size(training, dim, experiment.defense.memory_factor(training)) // per_round))


def run_groups(plan: Plan, store: RunStore, experiment: Experiment, batch_runs: int | None = None,
               parts: int = 1) -> list[list[int]]:
    """The membership runs of ``experiment`` not yet stored, in groups trained together: groups of
    ``batch_runs`` (default :func:`joint_run_limit`), and at least ``parts`` groups when there are
    that many runs (so an executor's workers all get work)."""
    pending = [r for r in range(plan.config.membership.runs) if not store.is_complete(run_id(plan, experiment, r))]
    size = batch_runs or joint_run_limit(plan, experiment)
    size = max(1, min(size, -(-len(pending) // max(1, parts))))
    return [pending[i:i + size] for i in range(0, len(pending), size)]


def train_runs(plan: Plan, store: RunStore, quiet: bool = False, executor: str = "local",
               workers: int | None = None, batch_runs: int | None = None,
               ray_address: str | None = None) -> dict[str, float]:
    """Train every run of every experiment not yet in the store — the membership runs (here, in
    groups trained together, or in worker processes: :mod:`audit.executors`), then each canary
    audit's own runs; returns seconds per experiment."""
    config = plan.config
    timings: dict[str, float] = {}
    if executor == "process":
        from audit.executors import train_in_processes

        train_in_processes(plan, store, workers, quiet, batch_runs)
    elif executor == "ray":
        from audit.executors import train_in_ray

        train_in_ray(plan, store, workers, quiet, ray_address, batch_runs)
    for experiment in plan.experiments:
        ids = plan.run_ids[experiment.key] = [run_id(plan, experiment, r) for r in range(config.membership.runs)]
        started = time.perf_counter()
        bar = _bar(config.membership.runs, f"train {experiment.label}", quiet)
        groups = run_groups(plan, store, experiment, batch_runs)
        bar.update(config.membership.runs - sum(len(g) for g in groups))  # resumed from the store
        # groups go in run order, so the first group with a diverged run holds the lowest-index one
        # (every earlier run is stored and finite): a rerun records the same run and round
        for group in groups:
            bar.set_postfix_str(f"{len(group)} together", refresh=False)
            train_membership_runs(plan, store, experiment, group)
            bar.update(len(group))
            if experiment.key in plan.diverged:
                break  # the experiment is a diverged result: its remaining runs need not train
        bar.close()
        diverged = plan.diverged.get(experiment.key)
        if diverged is not None:
            plan.run_ids[experiment.key] = ids[:diverged["run"]]  # the runs that finished before it
            warn(f"{experiment.label!r} run {diverged['run']} diverged at round {diverged['round']} "
                 f"({diverged['what']}); its attacks are skipped")
        else:
            for audit in plan.canary_audits:
                train_canary_runs(plan, store, experiment, audit, quiet)
        timings[experiment.key] = time.perf_counter() - started
    return timings


def trained_claim(plan: Plan, store: RunStore, experiment: Experiment) -> dict[str, Any]:
    """The claim of the trained runs (some depend on the run's clients, e.g. NbAFL's smallest client)."""
    ids = plan.run_ids.get(experiment.key)
    return store.load_manifest(ids[0])["claim"] if ids else experiment.claim.as_dict()


def canary_context(plan: Plan, experiment: Experiment, delta: float | None = None) -> CanaryContext:
    task = plan.task
    return CanaryContext(experiment.key, experiment.defense, experiment.training, task.pool.features, task.pool.labels,
                         task.test.features, task.test.labels, task.dataset.num_classes, ParamLayout.of(task.model_factory()),
                         plan.config.seed, experiment.delta if delta is None else delta, plan.config.partition.clients)


def train_canary_runs(plan: Plan, store: RunStore, experiment: Experiment, audit: CanaryAudit, quiet: bool = False) -> None:
    """An audit's runs: membership run i's clients plus the inserted canaries (records joined to
    clients' data, or canary clients), with a seed of their own."""
    reason = audit.not_applicable(experiment.defense)
    if reason is not None:
        plan.skipped.setdefault(experiment.key, []).append({"attack": audit.label, "reason": reason})
        return
    context = canary_context(plan, experiment)
    ids = [canary_run_id(plan, experiment, audit, i) for i in range(audit.params.runs)]
    plan.canary_ids[(experiment.key, audit.label)] = ids
    bar = _bar(len(ids), f"{audit.label} {experiment.label}", quiet)
    limit = joint_run_limit(plan, experiment)
    group: list[PendingRun] = []
    for i, rid in enumerate(ids):
        if store.is_complete(rid):
            bar.update(1)
            continue
        injection = audit.injection(context, i)
        chosen = np.flatnonzero(injection.inserted)
        base = plan.clients[i % plan.config.membership.runs]
        clients = [np.asarray(c).copy() for c in base]
        pool_x, pool_y = plan.task.pool.features, plan.task.pool.labels
        if injection.records_x is not None:
            extra = len(pool_y) + np.arange(len(chosen))
            pool_x = torch.cat([pool_x, injection.records_x[torch.as_tensor(chosen)]])
            pool_y = torch.cat([pool_y, injection.records_y[torch.as_tensor(chosen)]])
            for client, index in zip(injection.record_clients[chosen], extra):
                clients[int(client)] = np.append(clients[int(client)], index)
        directions = None if injection.directions is None else injection.directions[torch.as_tensor(chosen)]
        job = _job(plan, experiment, clients, derive_seed(plan.config.seed, "canary-run", audit.label, i), pool_x, pool_y,
                   directions)
        members = np.concatenate([np.asarray(c) for c in base]) if base else np.array([], dtype=np.int64)
        group.append(PendingRun(rid, i, job, np.sort(members),
                                {"canaries": {"audit": audit.label, "kind": audit.name, "index": i,
                                              "count": int(len(injection.inserted)), "inserted": chosen.tolist()}}))
        # runs with canary records have a pool of their own (and cannot share computations): train them now
        if len(group) >= limit or injection.records_x is not None or i == len(ids) - 1:
            first = first_divergence(train_and_store(plan, store, experiment, group))
            bar.update(len(group))
            group = []
            if first is not None:  # the audit has no result; the experiment's other attacks stand
                del plan.canary_ids[(experiment.key, audit.label)]
                plan.skipped.setdefault(experiment.key, []).append(
                    {"attack": audit.label, "reason": divergence_reason(first, "canary run")})
                warn(f"{experiment.label!r} {audit.label} canary run {first['run']} diverged at round {first['round']} "
                     f"({first['what']}); this audit is skipped")
                break
    bar.close()


def evaluate_canaries(plan: Plan, store: RunStore, experiment: Experiment, audit: CanaryAudit) -> AttackResult | None:
    ids = plan.canary_ids.get((experiment.key, audit.label))
    if not ids:
        return None
    device = plan.config.device
    delta = measurement_delta(trained_claim(plan, store, experiment), audit.unit, experiment.delta)
    context = canary_context(plan, experiment, delta)
    model = plan.task.model_factory().to(device)
    runs = []
    for i, rid in enumerate(ids):
        params = store.load_params(rid, device=device)
        _, layout, initial = initial_vector(plan.task.model_factory, derive_seed(plan.config.seed, "canary-run", audit.label, i))
        runs.append(CanaryRun(audit.injection(context, i), layout.flatten(params).cpu(), initial, params))
    return audit.evaluate(context, runs, model)


def membership_experiment(plan: Plan, store: RunStore, experiment: Experiment) -> MembershipExperiment:
    ids = plan.run_ids[experiment.key]
    device = plan.config.device
    model = plan.task.model_factory().to(device)
    layout = ParamLayout.of(model)
    membership = plan.membership
    claim = trained_claim(plan, store, experiment)

    def load_round(r: int, round_number: int) -> dict[str, torch.Tensor]:
        return layout.unflatten(store.load_tensor(ids[r], "global_models", f"round_{round_number:04d}", device))

    return MembershipExperiment(
        key=experiment.key,
        keep=membership.keep,
        features=plan.task.pool.features,
        labels=plan.task.pool.labels,
        kind=plan.task.kind,
        model=model,
        load_params=lambda r: store.load_params(ids[r], device=device),
        seed=derive_seed(plan.config.seed, "attack", experiment.key),
        device=device,
        unit=membership.unit,
        owners=membership.owners,
        client_keep=membership.client_keep,
        load_round=load_round,
        rounds=experiment.training.rounds,
        deltas={unit: measurement_delta(claim, unit, experiment.delta) for unit in ("record", "client")},
    )


def target_run(plan: Plan, store: RunStore, experiment: Experiment) -> TargetRun:
    """Run 0 of an experiment as the server holds it, for the run attacks."""
    rid = plan.run_ids[experiment.key][0]
    device, task = plan.config.device, plan.task
    model, layout, initial = initial_vector(task.model_factory, derive_seed(plan.config.seed, "run", 0))
    stored = plan.record_for(0)

    def load_global(round_number: int) -> dict[str, torch.Tensor] | None:
        if not stored.wants_global(round_number, experiment.training.rounds):
            return None
        return layout.unflatten(store.load_tensor(rid, "global_models", f"round_{round_number:04d}", device))

    def train_side(dataset: str, root: str | None) -> SideRun:
        return side_run(plan, store, experiment, dataset, root)

    return TargetRun(
        key=experiment.key, defense=experiment.defense, training=experiment.training, model=model.to(device),
        params=store.load_params(rid, device=device), initial=layout.unflatten(initial.to(device)), load_global=load_global,
        server_view=store.load_tensors(rid, "server_view"), pool_x=task.pool.features, pool_y=task.pool.labels,
        clients=plan.clients[0], test_x=task.test.features, test_y=task.test.labels, dataset=task.dataset, kind=task.kind,
        seed=derive_seed(plan.config.seed, "run-attack", experiment.key), device=device,
        members=np.flatnonzero(plan.keep[0]), pool_attributes=task.pool.attributes, train_side=train_side)


def side_run(plan: Plan, store: RunStore, experiment: Experiment, dataset: str, root: str | None) -> SideRun:
    """The experiment's defense trained on ``dataset`` with an MLP — same clients, training and
    target ε — for attacks its own data cannot serve. Stored like every run (resumable)."""
    config = plan.config
    side_config = replace(config, dataset=DatasetConfig(name=dataset, root=root), model=ModelConfig(name="mlp"))
    task = build_task(side_config)
    layout = ParamLayout.of(task.model_factory())
    membership = record_membership(task.pool.labels.numpy(), replace(config.membership, runs=1, unit="record"),
                                   config.partition, derive_seed(config.seed, "side-run", dataset))
    fingerprint = {"base": run_id(plan, experiment, 0), "dataset": dataset, "root": root,
                   "clients": _clients_digest(membership.clients[0])}
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
    rid = f"{experiment.key}-side-{dataset}-{digest}"
    if not store.is_complete(rid):
        defense = type(experiment.defense)(experiment.defense.params, layout)
        if experiment.target_epsilon is not None:
            defense = defense.calibrate(experiment.target_epsilon, experiment.delta, experiment.training,
                                        config.partition.clients, plan.accounting)
        job = TrainingJob(task.model_factory, task.pool.features.to(config.device), task.pool.labels.to(config.device),
                          membership.clients[0], task.test.features.to(config.device), task.test.labels.to(config.device),
                          experiment.training, seed=derive_seed(config.seed, "side-run", experiment.key, dataset),
                          delta=experiment.delta, accounting=plan.accounting, device=config.device)
        outcome = defense.train(job)
        last = next((row for row in reversed(outcome.metrics) if "test_accuracy" in row), {})
        store.save_run(rid, {"run_id": rid, "side_run": fingerprint, "claim": outcome.claim.as_dict(),
                             "utility": {"test_accuracy": last.get("test_accuracy")}},
                       outcome.final_params, np.flatnonzero(membership.keep[0]), outcome.metrics)
    manifest = store.load_manifest(rid)
    return SideRun(task.dataset, task.pool, store.load_membership(rid), task.model_factory().to(config.device),
                   store.load_params(rid, device=config.device), manifest["utility"]["test_accuracy"])


def _save_scores(out: Path, experiment: Experiment, result: AttackResult) -> None:
    if result.scores is None or not np.size(result.scores):
        return  # run attacks have metrics, not scores per unit
    folder = inside(out, out / "attacks" / experiment.key)
    name = slug(result.name)  # the attack's label is user text: never a path
    folder.mkdir(parents=True, exist_ok=True)
    temporary = inside(out, folder / f".{name}.tmp.npz")
    np.savez_compressed(temporary, scores=result.scores, truth=result.truth)
    temporary.replace(inside(out, folder / f"{name}.npz"))


def attack_runs(plan: Plan, store: RunStore, out: Path, quiet: bool = False) -> tuple[dict[str, list[AttackResult]], dict[str, float]]:
    """Run every attack on every experiment; scores are saved under ``<out>/attacks/<experiment>/``."""
    results: dict[str, list[AttackResult]] = {}
    timings: dict[str, float] = {}
    for experiment in plan.experiments:
        results[experiment.key] = []
        if experiment.key in plan.diverged:  # no finished model to attack
            reason = divergence_reason(plan.diverged[experiment.key])
            plan.skipped.setdefault(experiment.key, []).extend({"attack": a.label, "reason": reason} for a in plan.attacks)
            continue
        target = membership_experiment(plan, store, experiment)
        run_target: TargetRun | None = None  # run 0 as the server holds it, loaded once for all run attacks
        for attack in plan.attacks:
            started = time.perf_counter()
            if isinstance(attack, CanaryAudit):
                result = evaluate_canaries(plan, store, experiment, attack)
                produced = [] if result is None else [result]
            elif isinstance(attack, RunAttack):
                reason = attack.not_applicable(experiment.defense, plan.task.dataset)
                if reason is not None:
                    plan.skipped.setdefault(experiment.key, []).append({"attack": attack.label, "reason": reason})
                    produced = []
                else:
                    run_target = run_target or target_run(plan, store, experiment)
                    try:
                        produced = attack.evaluate(run_target)
                    except TrainingDiverged as failure:  # a side run (another dataset) diverged
                        reason = f"training diverged: its side run at round {failure.round} ({failure.what})"
                        plan.skipped.setdefault(experiment.key, []).append({"attack": attack.label, "reason": reason})
                        warn(f"{experiment.label!r} {attack.label}: side run diverged at round {failure.round} "
                             f"({failure.what}); this attack is skipped")
                        produced = []
            else:
                bar = _bar(target.runs, f"{attack.label} {experiment.label}", quiet)

                def progress(done: int, total: int, bar: tqdm = bar) -> None:
                    bar.total = total
                    bar.n = done
                    bar.refresh()

                produced = attack.run(target, progress)
                bar.close()
            for result in produced:
                _save_scores(out, experiment, result)
            results[experiment.key].extend(produced)
            timings[f"{experiment.key}/{attack.label}"] = time.perf_counter() - started
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
        if experiment.key in plan.diverged:
            continue  # nothing finished to diagnose
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
        write_json(inside(out, out / "diagnostics" / f"{experiment.key}.json"), entries)
    return results


def run_audit(config: AuditConfig, out: str | Path, *, attack: bool = True, quiet: bool = False,
              plan: Plan | None = None, executor: str = "local", workers: int | None = None,
              batch_runs: int | None = None, ray_address: str | None = None) -> dict[str, Any]:
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
    train_seconds = train_runs(plan, store, quiet, executor, workers, batch_runs, ray_address)
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
