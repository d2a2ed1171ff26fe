"""What the attacks see, loaded from the run store: the membership experiment (all runs, their
scores' inputs), the target run as the server holds it, and side runs on other datasets."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from attacks.membership_experiment import MembershipExperiment
from attacks.target_run import SideRun, TargetRun
from audit.config import DatasetConfig, ModelConfig
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import derive_seed
from audit.core.vocabulary import MEMBERSHIP_UNITS, Unit
from audit.planning import Plan, PlannedExperiment
from audit.store import RunStore, side_run_id
from audit.tasks import build_task, record_membership
from audit.training import TrainedRuns
from defenses.blocks.flat import ParamLayout
from defenses.federated.engine import initial_vector
from defenses.federated.training_job import TrainingJob
from reports.soundness import measurement_delta

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def membership_experiment(plan: Plan, trained: TrainedRuns, experiment: PlannedExperiment) -> MembershipExperiment:
    """The membership runs of ``experiment`` as the membership attacks see them."""
    ids, store = trained.run_ids[experiment.key], trained.store
    device = plan.config.device
    model = plan.task.model_factory().to(device)
    layout = ParamLayout.of(model)
    membership = plan.membership
    claim = trained.claim(experiment)

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
        owners=membership.owners if membership.unit == Unit.CLIENT else None,
        relation=membership.relation,
        inclusion=plan.config.membership.inclusion,
        client_keep=membership.client_keep,
        load_round=load_round,
        rounds=experiment.training.rounds,
        deltas={unit: measurement_delta(claim, unit, experiment.delta, membership.relation) for unit in MEMBERSHIP_UNITS},
    )


def target_run(plan: Plan, trained: TrainedRuns, experiment: PlannedExperiment) -> TargetRun:
    """Run 0 of an experiment as the server holds it, for the run attacks."""
    rid, store = trained.run_ids[experiment.key][0], trained.store
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


def side_run(plan: Plan, store: RunStore, experiment: PlannedExperiment, dataset: str, root: str | None) -> SideRun:
    """The experiment's defense trained on ``dataset`` with an MLP — same clients, training and
    target ε — for attacks its own data cannot serve. Stored like every run (resumable)."""
    config = plan.config
    side_config = replace(config, dataset=DatasetConfig(name=dataset, root=root), model=ModelConfig(name="mlp"))
    task = build_task(side_config)
    layout = ParamLayout.of(task.model_factory())
    membership = record_membership(task.pool.labels.numpy(), replace(config.membership, runs=1, unit=Unit.RECORD.value),
                                   config.partition, derive_seed(config.seed, "side-run", dataset))
    rid, fingerprint = side_run_id(plan, experiment, dataset, root, membership.clients[0])
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
