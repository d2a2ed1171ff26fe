"""The plan of an audit: every check a config needs, before anything is written.

:func:`plan_audit` resolves registry names, hyper-parameters, dataset files, the model,
partitions and noise calibration into a :class:`Plan` — the experiments (one per defense and ε),
the attacks and the membership runs — so bad input fails fast with a one-line error and leaves no
output directory. The plan is a value: the stages that follow (:mod:`audit.training`,
:mod:`audit.attacking`) take it and return records of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import numpy as np

import attacks.catalog  # noqa: F401  (registers the attacks)
import defenses.catalog  # noqa: F401  (registers the defenses)
from attacks.base import ATTACKS, Attack, Setting
from attacks.canaries.canary_audit import CanaryAudit, CanaryContext
from audit.config import AuditConfig, merge
from audit.core.devices import check_device
from audit.core.errors import UserInputError
from audit.core.extensions import is_reference
from audit.core.safe_names import slug
from audit.core.schema import from_mapping, to_mapping
from audit.core.vocabulary import AttackKind, Relation, Unit
from audit.tasks import Membership, Task, build_task, client_membership, record_membership
from defenses.base import DEFENSES, AccountingSettings, Defense, PrivacyClaim
from defenses.blocks.flat import ParamLayout
from defenses.federated.training_job import RecordSpec, TrainingConfig

#: the relations a membership design can follow (the config's ``membership.relation`` once resolved)
DesignRelation = Literal["add-remove", "replace-one", "zero-out"]


@dataclass(frozen=True)
class PlannedExperiment:
    """One defense configuration (one ε of a sweep), trained as N membership runs."""

    key: str
    label: str
    defense: Defense
    training: TrainingConfig
    delta: float
    target_epsilon: float | None
    claim: PrivacyClaim


@dataclass(frozen=True)
class Plan:
    """What an audit will do, decided before anything is written: the experiments, the attacks,
    the membership design and what the runs store. A value all the way down — its experiments'
    defenses, its attacks, its task and membership design are immutable — so nothing assigns to it
    afterwards: training returns :class:`audit.training.TrainedRuns`, the attacks
    :class:`audit.attacking.AttackResults`."""

    config: AuditConfig
    task: Task
    experiments: tuple[PlannedExperiment, ...]
    attacks: tuple[Attack, ...]
    membership: Membership
    accounting: AccountingSettings
    record: RecordSpec
    #: what run 0 stores: ``record`` plus the uploads the run attacks replay (None: as ``record``)
    target_record: RecordSpec | None = None

    def record_for(self, run_index: int) -> RecordSpec:
        return self.target_record if run_index == 0 and self.target_record is not None else self.record

    def canary_record(self, audit: CanaryAudit) -> RecordSpec:
        """What a canary audit's runs store: the plan's record, and every round's global model where
        the audit reads all iterates."""
        return replace(self.record, global_rounds="all") if audit.needs_iterates() else self.record

    @property
    def keep(self) -> np.ndarray:
        return self.membership.keep

    @property
    def clients(self) -> tuple[tuple[np.ndarray, ...], ...]:
        return self.membership.clients

    def canary_base_run(self, index: int) -> int:
        """The membership run whose clients' data canary run ``index`` trains on (cycling over the
        runs). Runs in which no client holds data — possible in a zero-out design with few clients,
        where every coin can come up off — are passed over: FedAvg weights uploads by data size,
        so canary clients beside only empty ones would weigh nothing and the audit would see none."""
        runs = [r for r, clients in enumerate(self.clients) if any(len(c) for c in clients)] or list(range(len(self.clients)))
        return runs[index % len(runs)]

    @property
    def membership_attacks(self) -> list[Attack]:
        return [a for a in self.attacks if a.kind == AttackKind.MEMBERSHIP]

    @property
    def canary_audits(self) -> list[CanaryAudit]:
        return [a for a in self.attacks if isinstance(a, CanaryAudit)]


def _format_epsilon(value: float) -> str:
    return f"{value:g}"


def _defense_class(name: str, field_path: str) -> type[Defense]:
    return DEFENSES.get(name, field_path)  # a reference that is not a Defense is refused there


def _union_rounds(first: str | tuple[int, ...], second: str | tuple[int, ...]) -> str | tuple[int, ...]:
    """Rounds stored for either request ("final" adds nothing: the final model is always stored)."""
    if "all" in (first, second):
        return "all"
    listed = sorted({int(r) for rounds in (first, second) if isinstance(rounds, tuple) for r in rounds})
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


def resolve_entries(config: AuditConfig) -> tuple[list[tuple], list[Attack]]:
    """Check every defense and attack entry (names, hyper-parameters, training overrides) without data."""
    check_device(config.device)
    defense_specs = []
    for i, entry in enumerate(config.defenses):
        cls = _defense_class(entry.name, f"defenses[{i}].name")
        params: Any = from_mapping(cls.Params, entry.params, f"defenses[{i}].params")
        training = from_mapping(TrainingConfig, merge(to_mapping(config.training), entry.training), f"defenses[{i}].training")
        if entry.epsilons and not cls.private:
            raise UserInputError(f"defenses[{i}].epsilons: '{entry.name}' is not a DP defense; remove 'epsilons'")
        defense_specs.append((i, entry, cls, params, training))
    attack_list: list[Attack] = []
    for i, attack_entry in enumerate(config.attacks):
        attack_cls = ATTACKS.get(attack_entry.name, f"attacks[{i}].name")
        if attack_cls.kind == AttackKind.MEMBERSHIP and config.membership.runs < attack_cls.min_runs:
            raise UserInputError(f"membership.runs: attack '{attack_entry.name}' needs at least {attack_cls.min_runs} "
                                 f"runs, got {config.membership.runs}")
        attack = attack_cls(from_mapping(attack_cls.Params, attack_entry.params, f"attacks[{i}].params"), attack_entry.label)
        if attack.label in {a.label for a in attack_list}:
            raise UserInputError(f"attacks[{i}].label: two attacks are named '{attack.label}'; give one a different label")
        attack_list.append(attack)
    if not config.defenses:
        raise UserInputError("defenses: the list is empty; name at least one defense")
    _check_clients(config, defense_specs)
    return defense_specs, attack_list


def plan_audit(config: AuditConfig) -> Plan:
    """Validate and resolve a config into a plan; writes nothing."""
    accounting = AccountingSettings(config.accounting.accountant, config.accounting.conversion)
    defense_specs, attack_list = resolve_entries(config)

    task = build_task(config)
    num_clients = config.partition.clients
    layout = ParamLayout.of(task.model_factory())

    experiments: list[PlannedExperiment] = []
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
            label = entry.label or _own_name(entry.name, cls)
            if target is not None:
                label = f"{label} (ε={_format_epsilon(target)})"
            claim = defense.privacy_claim(training, num_clients, training.rounds, entry.delta, accounting)
            experiments.append(PlannedExperiment(key, label, defense, training, entry.delta, target, claim))
    unit: str = config.membership.unit
    if unit == "auto":  # audit whole clients when a defense protects whole clients
        unit = Unit.CLIENT if any(e.claim.unit == Unit.CLIENT for e in experiments) else Unit.RECORD
    _check_attack_targets(attack_list, unit, experiments, config, task)
    build = client_membership if unit == Unit.CLIENT else record_membership
    design = replace(config.membership, relation=design_relation(config.membership.relation, unit, experiments))
    membership = build(task.pool.labels.numpy(), design, config.partition, config.seed)
    return Plan(config, task, tuple(experiments), tuple(attack_list), membership, accounting, _record_spec(config, attack_list),
                target_record=_record_spec(config, attack_list, target=True))


def _own_name(name: str, cls: type) -> str:
    """What a defense is called when its entry has no label: a registered name as written; a
    ``module:Class`` or ``file.py:Class`` reference by the class's own ``name`` (declared on the
    class itself, not inherited from the defense it extends) or else its Python name — not by the
    path, which two classes of one file share."""
    if not is_reference(name):
        return name
    return cls.__dict__.get("name") or cls.__name__


def design_relation(relation: str, unit: str, experiments: list[PlannedExperiment]) -> DesignRelation:
    """``membership.relation`` resolved: "auto" takes the neighbouring relation of the client-level
    claims when they all agree (so the design measures what they promise), else add/remove. The
    config keeps plain strings (it is written back as YAML), so the value is returned."""
    designs = (Relation.ADD_REMOVE, Relation.REPLACE_ONE, Relation.ZERO_OUT)
    if relation != "auto":
        return cast(DesignRelation, Relation(relation).value)
    claimed = {Relation(e.claim.relation) for e in experiments
               if e.claim.is_private and e.claim.unit == Unit.CLIENT and e.claim.relation in designs}
    return cast(DesignRelation, claimed.pop().value if unit == Unit.CLIENT and len(claimed) == 1 else Relation.ADD_REMOVE.value)


def canary_relation(experiment: PlannedExperiment, audit: CanaryAudit) -> str:
    """The neighbouring relation of a canary audit's design. Canary clients follow a zero-out claim
    (every canary takes part, a held-out one uploads nothing) and a replace-one claim where the
    audit mirrors its held-out canaries
    (:attr:`~attacks.canaries.canary_audit.CanaryAudit.mirrored_under_replace_one`: a held-out
    canary uploads −u where an inserted one uploads +u, one client replaced by another);
    otherwise a canary is added or not (a canary record changes its client's data: add/remove
    per record)."""
    relation = experiment.claim.relation
    if audit.unit != Unit.CLIENT:
        return Relation.ADD_REMOVE
    if relation == Relation.ZERO_OUT:
        return Relation.ZERO_OUT
    if relation == Relation.REPLACE_ONE and audit.mirrored_under_replace_one:
        return Relation.REPLACE_ONE
    return Relation.ADD_REMOVE


def _check_attack_targets(attacks: list[Attack], unit: str, experiments: list[PlannedExperiment], config: AuditConfig,
                          task: Task) -> None:
    """Each attack's parameters against every experiment it will run on (rounds, clients, runs, the
    dataset's classes and attributes), so that none is found unfit only after training."""
    for i, attack in enumerate(attacks):
        if getattr(attack.params, "unit", None) == Unit.CLIENT and unit != Unit.CLIENT:
            raise UserInputError(f"attacks[{i}].params.unit: 'client' needs runs that include whole clients; "
                                 "set membership.unit: client")
        for experiment in experiments:
            attack.check(f"attacks[{i}]", Setting(experiment.training.rounds, config.partition.clients,
                                                  config.membership.runs, task.dataset))
        rounds = getattr(attack.params, "rounds", "final")
        if isinstance(rounds, list):
            for experiment in experiments:
                if max(rounds) > experiment.training.rounds:
                    raise UserInputError(f"attacks[{i}].params.rounds: round {max(rounds)} exceeds the "
                                         f"{experiment.training.rounds} rounds of '{experiment.label}'")


def _check_clients(config: AuditConfig, defense_specs: list[tuple]) -> None:
    """Client counts and indices that must name clients the runs have: a round of 6 clients out of 5
    would quietly shrink to 5, and uploads of client 999 would quietly never be stored."""
    clients = config.partition.clients
    for i, entry, _, _, training in defense_specs:
        asked = training.clients_per_round
        if asked is not None and asked > clients:
            where = "training" if entry.training.get("clients_per_round") is None else f"defenses[{i}].training"
            raise UserInputError(f"{where}.clients_per_round: {asked} clients per round of the {clients} clients; "
                                 f"allowed: 1 to {clients} (partition.clients)")
    chosen = config.record.upload_clients
    if isinstance(chosen, list):
        for client in chosen:
            if client >= clients:
                raise UserInputError(f"record.upload_clients: client {client} of {clients} clients (numbered from 0); "
                                     f"allowed: 0 to {clients - 1}")


def canary_context(plan: Plan, experiment: PlannedExperiment, delta: float | None = None) -> CanaryContext:
    task = plan.task
    return CanaryContext(experiment.key, experiment.defense, experiment.training, task.pool.features, task.pool.labels,
                         task.test.features, task.test.labels, task.dataset.num_classes, ParamLayout.of(task.model_factory()),
                         plan.config.seed, experiment.delta if delta is None else delta, plan.config.partition.clients)
