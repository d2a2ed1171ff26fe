"""The attack stage: every attack and canary audit on every experiment's trained runs, returned as
:class:`AttackResults`; raw scores saved under ``<out>/attacks/<experiment>/`` (file names are
slugs of the attacks' labels)."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from attacks.attack_result import AttackResult
from attacks.base import RunAttack
from attacks.canaries.canary_audit import CanaryAudit, CanaryRun
from attacks.target_run import TargetRun
from audit.core.lazy_modules import lazy_module
from audit.core.safe_names import inside, slug
from audit.core.seeding import derive_seed
from audit.logs import progress_bar
from audit.planning import Plan, PlannedExperiment, canary_context, canary_relation
from audit.run_training import divergence_reason
from audit.targets import membership_experiment, target_run
from audit.training import TrainedRuns
from defenses.federated.engine import initial_vector
from defenses.federated.training_job import TrainingDiverged
from defenses.privacy.claims import PrivacyClaim
from reports.document import Skipped
from reports.soundness import measurement_delta

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttackResults:
    """What the attack stage measured on a plan's trained runs.

    ``results``: experiment key → the attacks' results, in the plan's order of attacks (an attack
    may give several, or none); ``skipped``: experiment key → the attacks that could not run on it
    and why (a diverged experiment: all of them); ``seconds``: ``"<experiment>/<attack label>"`` →
    the attack's time."""

    results: Mapping[str, tuple[AttackResult, ...]]
    skipped: Mapping[str, tuple[Skipped, ...]]
    seconds: Mapping[str, float]


def evaluate_canaries(plan: Plan, trained: TrainedRuns, experiment: PlannedExperiment, audit: CanaryAudit) -> list[AttackResult]:
    """The audit's results on its canary runs (none where it did not run)."""
    ids = trained.canary_ids.get(experiment.key, {}).get(audit.label)
    if not ids:
        return []
    store = trained.store
    device = plan.config.device
    relation = canary_relation(experiment, audit)
    delta = measurement_delta(trained.claim(experiment), audit.unit, experiment.delta, relation)
    context = canary_context(plan, experiment, delta)
    model = plan.task.model_factory().to(device)
    runs = []
    for i, rid in enumerate(ids):
        params = store.load_params(rid, device=device)
        _, layout, initial = initial_vector(plan.task.model_factory, derive_seed(plan.config.seed, "canary-run", audit.label, i))
        iterates = None
        if audit.needs_iterates():  # every round's global model, in round order
            models = store.load_tensors(rid, "global_models")
            iterates = torch.stack([models[f"round_{t:04d}"].cpu() for t in range(1, experiment.training.rounds + 1)])
        run = CanaryRun(audit.injection(context, i), layout.flatten(params).cpu(), initial, params, iterates)
        if audit.needs_records():
            run.server_view = store.load_tensors(rid, "server_view")
            run.metrics = store.load_metrics(rid)
            run.claim = PrivacyClaim.from_dict(store.load_manifest(rid)["claim"])
        runs.append(run)
    results = audit.evaluate(context, runs, model)
    for result in results:
        result.relation = relation
    return results


def _save_scores(out: Path, experiment: PlannedExperiment, result: AttackResult) -> None:
    if result.scores is None or not np.size(result.scores):
        return  # run attacks have metrics, not scores per unit
    folder = inside(out, out / "attacks" / experiment.key)
    name = slug(result.name)  # the attack's label is user text: never a path
    folder.mkdir(parents=True, exist_ok=True)
    # unique per process (pid + random): writers never share a temp file; a killed one's is
    # removed when a command next claims the folder (audit.core.output_folder)
    temporary = inside(out, folder / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp.npz")
    np.savez_compressed(temporary, scores=result.scores, truth=result.truth)
    temporary.replace(inside(out, folder / f"{name}.npz"))


def attack_runs(plan: Plan, trained: TrainedRuns, out: Path, quiet: bool = False) -> AttackResults:
    """Run every attack on every experiment's trained runs; scores are saved under ``<out>/attacks/<experiment>/``."""
    results: dict[str, tuple[AttackResult, ...]] = {}
    skipped: dict[str, tuple[Skipped, ...]] = {}
    timings: dict[str, float] = {}
    for experiment in plan.experiments:
        produced_here: list[AttackResult] = []
        skipped_here: list[Skipped] = []
        results[experiment.key], skipped[experiment.key] = (), ()
        diverged = trained.diverged.get(experiment.key)
        if diverged is not None:  # no finished model to attack
            reason = divergence_reason(diverged)
            skipped[experiment.key] = tuple(Skipped(attack=a.label, reason=reason) for a in plan.attacks)
            continue
        target = membership_experiment(plan, trained, experiment)
        run_target: TargetRun | None = None  # run 0 as the server holds it, loaded once for all run attacks
        for attack in plan.attacks:
            started = time.perf_counter()
            if isinstance(attack, CanaryAudit):
                produced = evaluate_canaries(plan, trained, experiment, attack)
            elif isinstance(attack, RunAttack):
                reason = attack.not_applicable(experiment.defense, plan.task.dataset)
                if reason is not None:
                    skipped_here.append(Skipped(attack=attack.label, reason=reason))
                    produced = []
                else:
                    run_target = run_target or target_run(plan, trained, experiment)
                    try:
                        produced = attack.evaluate(run_target)
                    except TrainingDiverged as failure:  # a side run (another dataset) diverged
                        reason = f"training diverged: its side run at round {failure.round} ({failure.what})"
                        skipped_here.append(Skipped(attack=attack.label, reason=reason))
                        LOG.warning(f"{experiment.label!r} {attack.label}: side run diverged at round {failure.round} "
                             f"({failure.what}); this attack is skipped")
                        produced = []
            else:
                bar = progress_bar(target.runs, f"{attack.label} {experiment.label}", quiet)

                def progress(done: int, total: int, bar: tqdm = bar) -> None:
                    bar.total = total
                    bar.n = done
                    bar.refresh()

                produced = attack.run(target, progress)
                bar.close()
            for result in produced:
                _save_scores(out, experiment, result)
            produced_here.extend(produced)
            timings[f"{experiment.key}/{attack.label}"] = time.perf_counter() - started
            for result in produced:
                auc = result.metrics.get("auc")
                LOG.info("%s on %s: %s%s (%.1f s)", result.name, experiment.label,
                         f"AUC {auc.value:.3f}" if auc is not None and auc.value is not None else "done",
                         "".join(f", {m} {result.metrics[m].value:.3g}" for m in ("epsilon_one_run", "epsilon_one_run_fdp")
                                 if m in result.metrics and result.metrics[m].value is not None),
                         timings[f"{experiment.key}/{attack.label}"])
        results[experiment.key], skipped[experiment.key] = tuple(produced_here), tuple(skipped_here)
    return AttackResults(results, skipped, timings)
