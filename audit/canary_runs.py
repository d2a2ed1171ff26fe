"""Training a canary audit's own runs: membership run i's clients plus the canaries the audit
inserts (records joined to clients' data, update or Dirac canary clients), with a seed of their
own, into the run store."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from attacks.canaries.canary_audit import CanaryAudit, CanaryInjection
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import derive_seed
from audit.core.vocabulary import Relation
from audit.logs import progress_bar
from audit.planning import Plan, PlannedExperiment, canary_context, canary_relation
from audit.run_training import PendingRun, divergence_reason, joint_run_limit, train_and_store, training_job
from audit.store import RunStore, canary_run_id
from defenses.blocks.dirac_rows import DiracRows
from reports.document import Skipped

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

LOG = logging.getLogger(__name__)


def dirac_rows(injection: CanaryInjection, relation: str, dim: int, device: str) -> DiracRows:
    """The Dirac canary clients of a run: under zero-out every canary takes part and a held-out
    one's raw update is zero; under replace-one every canary takes part and a held-out one's raw
    update is the inserted one's mirrored (−s·U for s·U); under add/remove only the inserted ones
    exist."""
    assert injection.dirac_coords is not None and injection.dirac_values is not None
    everyone = relation in (Relation.ZERO_OUT, Relation.REPLACE_ONE)
    keep = np.ones(len(injection.inserted), dtype=bool) if everyone else injection.inserted.astype(bool)
    held_out = -injection.dirac_values if relation == Relation.REPLACE_ONE else 0.0
    values = np.where(injection.inserted, injection.dirac_values, held_out)[keep]
    return DiracRows(torch.as_tensor(injection.dirac_coords[keep], dtype=torch.long, device=device),
                     torch.as_tensor(values, dtype=torch.float32, device=device), dim)


def train_canary_runs(plan: Plan, store: RunStore, experiment: PlannedExperiment, audit: CanaryAudit,
                      quiet: bool = False) -> tuple[str, ...] | Skipped:
    """An audit's runs: membership run i's clients plus the inserted canaries (records joined to
    clients' data, or canary clients), with a seed of their own. Returns their ids, or why the
    audit has none (it does not apply to the defense, or one of its runs diverged)."""
    reason = audit.not_applicable(experiment.defense) or audit.refused(experiment.defense, experiment.training)
    if reason is not None:
        return Skipped(attack=audit.label, reason=reason)
    context = canary_context(plan, experiment)
    ids = tuple(canary_run_id(plan, experiment, audit, i) for i in range(audit.run_count(context.layout.dim)))
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
        job = training_job(plan, experiment, clients, derive_seed(plan.config.seed, "canary-run", audit.label, i), pool_x,
                           pool_y, directions, record=plan.canary_record(audit), canary_rounds=audit.canary_rounds())
        if injection.dirac_coords is not None:
            job = replace(job, dirac_canaries=dirac_rows(injection, canary_relation(experiment, audit), context.layout.dim,
                                                         plan.config.device))
        if injection.gradient_plan is not None:
            job = replace(job, gradient_canaries=injection.gradient_plan)
        members = np.concatenate([np.asarray(c) for c in base]) if base else np.array([], dtype=np.int64)
        group.append(PendingRun(rid, i, job, np.sort(members),
                                {"canaries": {"audit": audit.label, "kind": audit.name, "index": i,
                                              "count": int(len(injection.inserted)), "inserted": chosen.tolist()}}))
        # runs with canary records have a pool of their own (and cannot share computations): train them now
        if len(group) >= limit or injection.records_x is not None or i == len(ids) - 1:
            first = train_and_store(plan, store, experiment, group)
            bar.update(len(group))
            group = []
            if first is not None:  # the audit has no result; the experiment's other attacks stand
                LOG.warning(f"{experiment.label!r} {audit.label} canary run {first.run} diverged at round {first.round} "
                     f"({first.what}); this audit is skipped")
                bar.close()
                return Skipped(attack=audit.label, reason=divergence_reason(first, "canary run"))
    bar.close()
    return ids
