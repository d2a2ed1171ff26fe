"""Training the runs of a plan into the run store: membership runs (trained together where the
defense allows it), canary-audit runs, and what a diverged run leaves (nothing stored; the
experiment noted as diverged)."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from attacks.canaries.canary_audit import CanaryAudit, CanaryInjection
from audit import provenance
from audit.core.lazy_modules import lazy_module
from audit.core.schema import to_mapping
from audit.core.seeding import derive_seed
from audit.core.vocabulary import Relation
from audit.planning import (
    Plan,
    PlannedExperiment,
    canary_context,
    canary_record,
    canary_relation,
    canary_run_id,
    run_id,
)
from audit.store import RunStore
from defenses.blocks.dirac_rows import DiracRows
from defenses.blocks.flat import ParamLayout
from defenses.federated.engine import chunk_size
from defenses.federated.training_job import RecordSpec, TrainingDiverged, TrainingJob
from defenses.privacy.claims import PrivacyClaim
from defenses.run_batch import train_together

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

LOG = logging.getLogger(__name__)


def progress_bar(total: int, desc: str, quiet: bool) -> tqdm:
    return tqdm(total=total, desc=desc, disable=quiet, file=sys.stderr, leave=True, dynamic_ncols=True,
                mininterval=0.5, bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")


def _manifest(plan: Plan, experiment: PlannedExperiment, rid: str, run_index: int, job: TrainingJob, outcome, seconds: float,
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


def train_and_store(plan: Plan, store: RunStore, experiment: PlannedExperiment, runs: list[PendingRun]
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
    """A warning in the log: on the console (``dpfl-audit: warning: ...``, drawn around the
    progress bars, with --quiet too) and in run.log (:mod:`audit.logs`)."""
    LOG.warning(text)


def _job(plan: Plan, experiment: PlannedExperiment, clients: list[np.ndarray], seed: int, pool_x=None, pool_y=None,
         update_canaries: torch.Tensor | None = None, record: RecordSpec | None = None,
         canary_rounds: tuple[int, int] | None = None) -> TrainingJob:
    task, device = plan.task, plan.config.device
    pool_x = task.pool.features if pool_x is None else pool_x
    pool_y = task.pool.labels if pool_y is None else pool_y
    return TrainingJob(task.model_factory, pool_x.to(device), pool_y.to(device), clients, task.test.features.to(device),
                       task.test.labels.to(device), experiment.training, seed=seed, delta=experiment.delta,
                       accounting=plan.accounting, record=record or plan.record, device=device,
                       update_canaries=None if update_canaries is None else update_canaries.to(device),
                       canary_rounds=canary_rounds)


def membership_pending(plan: Plan, store: RunStore, experiment: PlannedExperiment, r: int) -> PendingRun | None:
    """Membership run ``r`` of ``experiment`` as a run to train, or None when the store has it."""
    rid = run_id(plan, experiment, r)
    if store.is_complete(rid):
        return None
    job = _job(plan, experiment, plan.clients[r], derive_seed(plan.config.seed, "run", r), record=plan.record_for(r))
    return PendingRun(rid, r, job, np.flatnonzero(plan.keep[r]))


def train_membership_runs(plan: Plan, store: RunStore, experiment: PlannedExperiment, runs: list[int]) -> list[str]:
    """Membership runs ``runs`` of ``experiment``, trained together unless the store has them; returns
    the ids of those stored. A run whose training diverges is not stored; the lowest-index one is
    noted in ``plan.diverged``."""
    pending = [p for p in (membership_pending(plan, store, experiment, r) for r in runs) if p is not None]
    first = first_divergence(train_and_store(plan, store, experiment, pending))
    noted = plan.diverged.get(experiment.key)
    if first is not None and (noted is None or first["run"] < noted["run"]):
        plan.diverged[experiment.key] = first
    return [rid for rid in (run_id(plan, experiment, r) for r in runs) if store.is_complete(rid)]


def joint_run_limit(plan: Plan, experiment: PlannedExperiment) -> int:
    """How many runs train together by default: as many as fit the batched computation one
    run's round would use (the engine's chunk of about 2^25 values), at least one."""
    dim = ParamLayout.of(plan.task.model_factory()).dim
    training = experiment.training
    clients = len(plan.clients[0]) if plan.clients else 1
    per_round = max(1.0, training.sampling_rate(clients) * clients)
    return max(1, int(chunk_size(training, dim, experiment.defense.memory_factor(training)) // per_round))


def run_groups(plan: Plan, store: RunStore, experiment: PlannedExperiment, batch_runs: int | None = None,
               parts: int = 1) -> list[list[int]]:
    """The membership runs of ``experiment`` not yet stored, in groups trained together: groups of
    ``batch_runs`` (default :func:`joint_run_limit`), and at least ``parts`` groups when there are
    that many runs (so an executor's workers all get work)."""
    pending = [r for r in range(plan.config.membership.runs) if not store.is_complete(run_id(plan, experiment, r))]
    size = batch_runs or joint_run_limit(plan, experiment)
    size = max(1, min(size, -(-len(pending) // max(1, parts))))
    return [pending[i:i + size] for i in range(0, len(pending), size)]


def trained_claim(plan: Plan, store: RunStore, experiment: PlannedExperiment) -> PrivacyClaim:
    """The claim of the trained runs (some depend on the run's clients, e.g. NbAFL's smallest client)."""
    ids = plan.run_ids.get(experiment.key)
    return PrivacyClaim.from_dict(store.load_manifest(ids[0])["claim"]) if ids else experiment.claim


def dirac_rows(injection: CanaryInjection, relation: str, dim: int, device: str) -> DiracRows:
    """The Dirac canary clients of a run: under zero-out every canary takes part and a held-out
    one's raw update is zero; otherwise only the inserted ones exist."""
    assert injection.dirac_coords is not None and injection.dirac_values is not None
    keep = np.ones(len(injection.inserted), dtype=bool) if relation == Relation.ZERO_OUT else injection.inserted.astype(bool)
    values = np.where(injection.inserted, injection.dirac_values, 0.0)[keep]
    return DiracRows(torch.as_tensor(injection.dirac_coords[keep], dtype=torch.long, device=device),
                     torch.as_tensor(values, dtype=torch.float32, device=device), dim)


def train_canary_runs(plan: Plan, store: RunStore, experiment: PlannedExperiment, audit: CanaryAudit,
                      quiet: bool = False) -> None:
    """An audit's runs: membership run i's clients plus the inserted canaries (records joined to
    clients' data, or canary clients), with a seed of their own."""
    reason = audit.not_applicable(experiment.defense) or audit.refused(experiment.defense, experiment.training)
    if reason is not None:
        plan.skipped.setdefault(experiment.key, []).append({"attack": audit.label, "reason": reason})
        return
    context = canary_context(plan, experiment)
    ids = [canary_run_id(plan, experiment, audit, i) for i in range(audit.run_count(context.layout.dim))]
    plan.canary_ids[(experiment.key, audit.label)] = ids
    bar = progress_bar(len(ids), f"{audit.label} {experiment.label}", quiet)
    limit = joint_run_limit(plan, experiment)
    group: list[PendingRun] = []
    for i, rid in enumerate(ids):
        if store.is_complete(rid):
            bar.update(1)
            continue
        injection = audit.injection(context, i)
        chosen = np.flatnonzero(injection.inserted)
        base = plan.clients[plan.canary_base_run(i)]
        clients = [np.asarray(c).copy() for c in base]
        pool_x, pool_y = plan.task.pool.features, plan.task.pool.labels
        if injection.records_x is not None:
            extra = len(pool_y) + np.arange(len(chosen))
            pool_x = torch.cat([pool_x, injection.records_x[torch.as_tensor(chosen)]])
            pool_y = torch.cat([pool_y, injection.records_y[torch.as_tensor(chosen)]])
            for client, index in zip(injection.record_clients[chosen], extra):
                clients[int(client)] = np.append(clients[int(client)], index)
        directions = None
        if injection.directions is not None and canary_relation(experiment, audit) == Relation.ZERO_OUT:
            # every canary client takes part; a held-out one uploads nothing (zero-out neighbours)
            directions = injection.directions * torch.as_tensor(injection.inserted, dtype=injection.directions.dtype)[:, None]
        elif injection.directions is not None:
            directions = injection.directions[torch.as_tensor(chosen)]
        job = _job(plan, experiment, clients, derive_seed(plan.config.seed, "canary-run", audit.label, i), pool_x, pool_y,
                   directions, record=canary_record(plan, audit), canary_rounds=audit.canary_rounds())
        if injection.dirac_coords is not None:
            job = replace(job, dirac_canaries=dirac_rows(injection, canary_relation(experiment, audit), context.layout.dim,
                                                         plan.config.device))
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
