"""The attack stage: every attack and canary audit on every experiment's trained runs, returned as
:class:`AttackResults`; raw scores saved under ``<out>/attacks/<experiment>/`` (file names are
slugs of the attacks' labels). An attack whose code, data, config, parameters and runs are those
of its entry in ``<out>/cache`` is read back instead of run (:mod:`audit.stage_cache`)."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from attacks.attack_result import AttackResult
from attacks.base import Attack, RunAttack
from attacks.canaries.canary_audit import CanaryAudit, CanaryRun
from attacks.membership_experiment import MembershipExperiment
from attacks.target_run import TargetRun
from audit.core import exact_json, vocabulary
from audit.core.lazy_modules import lazy_module
from audit.core.safe_names import inside, slug
from audit.core.seeding import derive_seed
from audit.logs import progress_bar
from audit.planning import Plan, PlannedExperiment, canary_context, canary_relation
from audit.run_training import divergence_reason
from audit.stage_cache import StageCache, config_without, key_of
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


def _save_scores(out: Path, experiment: PlannedExperiment, result: AttackResult) -> Path | None:
    """Write the result's scores and truth to ``<out>/attacks/<experiment>/<slug of its name>.npz``
    (none for a result without per-unit scores); returns the file."""
    if result.scores is None or not np.size(result.scores):
        return None  # run attacks have metrics, not scores per unit
    folder = inside(out, out / "attacks" / experiment.key)
    name = slug(result.name)  # the attack's label is user text: never a path
    folder.mkdir(parents=True, exist_ok=True)
    # unique per process (pid + random): writers never share a temp file; a killed one's is
    # removed when a command next claims the folder (audit.core.output_folder)
    temporary = inside(out, folder / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp.npz")
    np.savez_compressed(temporary, scores=result.scores, truth=result.truth)
    return temporary.replace(inside(out, folder / f"{name}.npz"))


#: what a cached attack entry may hold (audit.core.exact_json): results, skips and their vocabulary
_ALLOWED = exact_json.allowed_types([AttackResult, Skipped, *exact_json.enums_in(vocabulary)])


def attack_key(plan: Plan, trained: TrainedRuns, experiment: PlannedExperiment, attack: Attack,
               cache: StageCache) -> str | None:
    """The key of one attack on one experiment (:mod:`audit.stage_cache`): the code, the data, the
    config without the other attacks, the attack's own parameters and the runs it reads (the
    experiment's membership runs, and a canary audit's own runs); None where the cache is off or
    the parameters have no exact JSON."""
    if not cache.enabled:
        return None
    store = trained.store
    runs = list(trained.run_ids.get(experiment.key, ()))
    if isinstance(attack, CanaryAudit):
        runs += trained.canary_ids.get(experiment.key, {}).get(attack.label, ())
    try:
        return key_of({"stage": "attack", "code": cache.code, "data": cache.data_digest(plan.task),
                       "config": config_without(plan.config, "name", "attacks", "diagnostics"), "experiment": experiment.key,
                       "attack": {"class": f"{type(attack).__module__}.{type(attack).__qualname__}", "label": attack.label,
                                  "params": attack.params},
                       "runs": cache.runs_digest(store.path(rid) for rid in runs)})
    except exact_json.NotExact:
        return None


def _side_runs(trained: TrainedRuns, experiment: PlannedExperiment, attack: Attack) -> list[Path]:
    """The side runs (other datasets) a run attack may have read: every one of the experiment's in
    the store once it ran — more than it read, perhaps, never fewer."""
    if not isinstance(attack, RunAttack) or not trained.store.runs.is_dir():
        return []
    return sorted(p for p in trained.store.runs.glob(f"{experiment.key}-side-*") if (p / "manifest.json").is_file())


def _kept(out: Path, produced: list[AttackResult], skipped: list[Skipped], files: list[Path | None]) -> dict:
    """An attack's outcome as its cache entry holds it: the results without the scores saved to
    ``files`` (read back from there), and the skips."""
    results = [result if file is None else replace(result, scores=np.zeros(0), truth=np.zeros(0, dtype=bool))
               for result, file in zip(produced, files)]
    return {"results": results, "scores": [None if f is None else f.relative_to(out).as_posix() for f in files],
            "skipped": skipped}


def _restored(out: Path, kept: dict) -> tuple[list[AttackResult], list[Skipped]]:
    """The outcome :func:`_kept` stored, with the scores read back from their files (their digests
    were checked by the cache)."""
    results = []
    for result, file in zip(kept["results"], kept["scores"]):
        if file is not None:
            with np.load(inside(out, out / file), allow_pickle=False) as saved:
                result = replace(result, scores=saved["scores"], truth=saved["truth"])
        results.append(result)
    return results, list(kept["skipped"])


def _attack(plan: Plan, trained: TrainedRuns, experiment: PlannedExperiment, attack: Attack, target: MembershipExperiment,
            run_target: list[TargetRun], quiet: bool) -> tuple[list[AttackResult], list[Skipped]]:
    """Run one attack on one experiment: its results, and its skip where it cannot run.
    ``run_target``: run 0 as the server holds it, loaded by the first run attack that needs it."""
    if isinstance(attack, CanaryAudit):
        return evaluate_canaries(plan, trained, experiment, attack), []
    if isinstance(attack, RunAttack):
        reason = attack.not_applicable(experiment.defense, plan.task.dataset)
        if reason is not None:
            return [], [Skipped(attack=attack.label, reason=reason)]
        if not run_target:
            run_target.append(target_run(plan, trained, experiment))
        try:
            return attack.evaluate(run_target[0]), []
        except TrainingDiverged as failure:  # a side run (another dataset) diverged
            LOG.warning(f"{experiment.label!r} {attack.label}: side run diverged at round {failure.round} "
                        f"({failure.what}); this attack is skipped")
            return [], [Skipped(attack=attack.label, reason=f"training diverged: its side run at round {failure.round} "
                                                           f"({failure.what})")]
    bar = progress_bar(target.runs, f"{attack.label} {experiment.label}", quiet)

    def progress(done: int, total: int, bar: tqdm = bar) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    produced = attack.run(target, progress)  # type: ignore[attr-defined]  # a MembershipAttack
    bar.close()
    return produced, []


def attack_runs(plan: Plan, trained: TrainedRuns, out: Path, quiet: bool = False,
                cache: StageCache | None = None) -> AttackResults:
    """Run every attack on every experiment's trained runs; scores are saved under ``<out>/attacks/<experiment>/``.

    With ``cache`` (:mod:`audit.stage_cache`), an attack whose inputs are those of its entry is not
    run again: its results are read back, and its score files left as they are."""
    cache = cache or StageCache(out, enabled=False)
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
        run_target: list[TargetRun] = []  # run 0 as the server holds it, loaded once for all run attacks
        for attack in plan.attacks:
            started = time.perf_counter()
            slot, key = f"attacks/{experiment.key}/{attack.label}", attack_key(plan, trained, experiment, attack, cache)
            cached = cache.lookup(slot, key, _ALLOWED, trained.store.runs) if key is not None else None
            if cached is not None:
                produced, skipped_now = _restored(out, cached)
            else:
                produced, skipped_now = _attack(plan, trained, experiment, attack, target, run_target, quiet)
                files = [_save_scores(out, experiment, result) for result in produced]
                if key is not None:
                    kept = _kept(out, produced, skipped_now, files)
                    written = [f for f in files if f is not None]
                    cache.store(slot, key, kept, written, _ALLOWED, _side_runs(trained, experiment, attack))
            skipped_here.extend(skipped_now)
            produced_here.extend(produced)
            timings[f"{experiment.key}/{attack.label}"] = time.perf_counter() - started
            for result in produced:
                auc = result.metrics.get("auc")
                LOG.info("%s on %s: %s%s (%.1f s%s)", result.name, experiment.label,
                         f"AUC {auc.value:.3f}" if auc is not None and auc.value is not None else "done",
                         "".join(f", {m} {result.metrics[m].value:.3g}" for m in ("epsilon_one_run", "epsilon_one_run_fdp")
                                 if m in result.metrics and result.metrics[m].value is not None),
                         timings[f"{experiment.key}/{attack.label}"], ", cached" if cached is not None else "")
        results[experiment.key], skipped[experiment.key] = tuple(produced_here), tuple(skipped_here)
    return AttackResults(results, skipped, timings)
