"""Assemble an audit's :class:`reports.document.Results` (written as ``results.json``) from the
plan, the run store and the attacks.

Everything the CSV, the HTML report and the CI gate show derives from these types, so they hold
no timings (those live in ``manifest.json``): the same seed on the same machine gives the same
document byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from attacks.attack_result import AttackResult
from attacks.membership_metrics import MEMBERSHIP_METRICS
from audit import __version__, provenance
from audit.attacking import AttackResults
from audit.core import exact_json, vocabulary
from audit.core.metrics import mean_estimate
from audit.core.schema import to_mapping
from audit.core.vocabulary import Unit
from audit.planning import Plan
from audit.stage_cache import StageCache, key_of
from audit.training import TrainedRuns
from defenses.privacy.accounting import dp_accounting_version
from defenses.privacy.claims import PrivacyClaim
from reports.document import (
    SCHEMA_VERSION,
    AttackRecord,
    AuditInfo,
    Diagnostics,
    Estimate,
    Experiment,
    Figure,
    MeanOverRuns,
    Results,
    Robustness,
    Roc,
    Sharpness,
    Tool,
    Utility,
)
from reports.mechanism_verdicts import conformance_verdict, parametric_verdict
from reports.results import rows_from_results
from reports.soundness import attack_verdicts, experiment_sentence, experiment_verdict, family_verdicts

ROUND_METRICS = ("test_accuracy", "test_loss", "train_accuracy", "update_norm_median", "update_norm_q25",
                 "update_norm_q75", "clip_fraction", "epsilon")


def mean_interval(values: list[float], confidence: float = 0.95) -> MeanOverRuns:
    """Mean over runs with a Student-t interval (:func:`audit.core.metrics.mean_estimate`): null
    bounds below two finite values, the per-run values above."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return MeanOverRuns(None, None, None, runs=len(values))
    estimate = mean_estimate(finite, confidence)
    if len(finite) < 2:
        return MeanOverRuns(estimate.value, None, None, runs=len(values))
    return MeanOverRuns(estimate.value, estimate.low, estimate.high, runs=len(values), per_run=finite)


def _round_curves(metrics_per_run: list[list[dict[str, Any]]]) -> list[dict[str, float | None]]:
    rounds = max((len(m) for m in metrics_per_run), default=0)
    curves = []
    for t in range(rounds):
        row: dict[str, Any] = {"round": t + 1}
        for name in ROUND_METRICS:
            values = [m[t][name] for m in metrics_per_run if t < len(m) and m[t].get(name) is not None]
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                row[name] = float(np.mean(finite))
        curves.append(row)
    return curves


def _finite(value: float) -> float | None:
    """A number as results.json holds it: None where there is none (NaN: not estimable; ±inf: no bound)."""
    return float(value) if value is not None and math.isfinite(value) else None


def attack_records(results: list[AttackResult], claim: PrivacyClaim) -> list[AttackRecord]:
    """The experiment's attacks as results.json records them, with their verdicts: every ε
    lower bound of the experiment is one family, decided together (reports.soundness)."""
    raw = []
    for result in results:
        metrics = {name: Estimate(*(_finite(x) for x in (e.value, e.low, e.high))) for name, e in result.metrics.items()}
        epsilon_kind = dict(result.epsilon_kind)
        # a result that speaks of one observer is held to that observer's figure
        pairs: list = attack_verdicts(result.claim or claim, result.unit, metrics, epsilon_kind,  # type: ignore[arg-type]
                                      result.relation, result.evidence)
        if result.conformance is not None:  # the uploads against the claimed mechanism: one more test of the family
            pairs.append((conformance_verdict(result.claim or claim, result.conformance), result.conformance))
        if result.parametric is not None:  # the claimed μ against the canaries' Gaussian scores: one more
            pairs.append((parametric_verdict(result.claim or claim, result.parametric), result.parametric))
        raw.append((result, metrics, epsilon_kind, pairs))
    decided = iter(family_verdicts([pair for *_, pairs in raw for pair in pairs]))
    return [AttackRecord(
        attack=result.name, unit=result.unit, notes=result.notes, metrics=metrics,
        epsilon_kind=epsilon_kind,  # type: ignore[arg-type]  # "lower_bound" or "estimate" (attacks.base)
        roc=Roc(list(result.roc[0]), list(result.roc[1])), kind=result.kind,  # type: ignore[arg-type]
        figures=[Figure(**f) for f in result.figures],
        verdicts=[next(decided) for _ in pairs],
        observation=result.observation, adversary=result.adversary,  # type: ignore[arg-type]
        statistic=result.statistic) for result, metrics, epsilon_kind, pairs in raw]


#: what a cached list of attack records may hold (audit.core.exact_json)
_RECORDS = exact_json.allowed_types([AttackRecord, *exact_json.enums_in(vocabulary)])


def cached_attack_records(results: list[AttackResult], claim: PrivacyClaim, experiment: str,
                          cache: StageCache | None) -> list[AttackRecord]:
    """:func:`attack_records`, read back from ``cache`` (:mod:`audit.stage_cache`) where the code,
    the claim and everything of the results the records read (all but the per-unit scores) are
    those of its entry: the verdicts' power simulations are the costly part of the document."""
    if cache is None or not cache.enabled:
        return attack_records(results, claim)
    slot = f"records/{experiment}"
    try:
        key = key_of({"stage": "records", "code": cache.code, "claim": claim,
                      "results": [replace(r, scores=None, truth=None) for r in results]})
    except exact_json.NotExact:
        return attack_records(results, claim)
    records = cache.lookup(slot, key, _RECORDS)
    if records is None:
        records = attack_records(results, claim)
        cache.store(slot, key, records, allowed=_RECORDS)
    return records


def _mean_curves(entries: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, list[float]]:
    """Element-wise means over runs of list-valued fields (e.g. sharpness per radius)."""
    return {k: np.mean([e[k] for e in entries], axis=0).tolist() for k in keys}


def diagnostics_summary(manifests: list[dict], metrics: list[list[dict]], landscape: list[dict]) -> Diagnostics:
    """Per-experiment diagnostics (Shi et al. 2023, §6.3 and Table IV): train/test gap, clipping, update norms, flatness."""
    gaps, clip_fractions, first_norms, last_norms, train_accuracies = [], [], [], [], []
    bits: dict[str, list[float]] = {"up": [], "down": []}
    for manifest, rows in zip(manifests, metrics):
        final = next((r for r in reversed(rows) if "train_accuracy" in r), {})
        if final.get("train_accuracy") is not None and manifest["utility"]["test_accuracy"] is not None:
            train_accuracies.append(final["train_accuracy"])
            gaps.append(final["train_accuracy"] - manifest["utility"]["test_accuracy"])
        fractions = [r["clip_fraction"] for r in rows if "clip_fraction" in r]
        if fractions:
            clip_fractions.append(float(np.mean(fractions)))
        norms = [r["update_norm_median"] for r in rows if "update_norm_median" in r]
        if norms:
            first_norms.append(norms[0])
            last_norms.append(norms[-1])
        for direction in ("up", "down"):  # bandwidth (Kerkouche et al. 2021): exact bits a client sends / receives
            per_round = [r[f"bits_{direction}_per_client"] for r in rows if f"bits_{direction}_per_client" in r]
            if per_round:
                bits[direction].append(float(np.mean(per_round)))
    sharpness = robustness = None
    if landscape:
        rise = _mean_curves([e["sharpness"] for e in landscape], ("mean_rise", "max_rise"))
        sharpness = Sharpness(landscape[0]["sharpness"]["radii"], rise["mean_rise"], rise["max_rise"])
        accuracy = _mean_curves([e["robustness"] for e in landscape], ("accuracy", "accuracy_drop"))
        robustness = Robustness(landscape[0]["robustness"]["stds"], accuracy["accuracy"], accuracy["accuracy_drop"])
    return Diagnostics(
        train_accuracy=mean_interval(train_accuracies),
        generalization_gap=mean_interval(gaps),
        clip_fraction=mean_interval(clip_fractions),
        update_norm_median_first_round=mean_interval(first_norms),
        update_norm_median_last_round=mean_interval(last_norms),
        bits_up_per_client_round=mean_interval(bits["up"]) if bits["up"] else None,
        bits_down_per_client_round=mean_interval(bits["down"]) if bits["up"] else None,
        sharpness=sharpness, robustness=robustness)


def build_results(plan: Plan, trained: TrainedRuns, attacked: AttackResults,
                  landscape: dict[str, list[dict]] | None = None, cache: StageCache | None = None) -> Results:
    """The results document of an audit: the plan's experiments, what training stored of them, what
    the attacks measured and (optionally) the loss-landscape diagnostics; ``cache``: where the
    attacks' records may be read back (:func:`cached_attack_records`)."""
    config, task, store = plan.config, plan.task, trained.store
    experiments = []
    for experiment in plan.experiments:
        ids = list(trained.run_ids[experiment.key])
        diverged = trained.diverged.get(experiment.key)
        # a diverged experiment is a result without a model: no utility, curves or diagnostics
        # (its finished runs alone would misstate it), its attacks listed as skipped
        manifests = [] if diverged else [store.load_manifest(rid) for rid in ids]
        metrics = [] if diverged else [store.load_metrics(rid) for rid in ids]
        claim = trained.claim(experiment)
        attacks = cached_attack_records(list(attacked.results.get(experiment.key, ())), claim, experiment.key, cache)
        verdicts = [v for a in attacks for v in a.verdicts]
        soundness = experiment_verdict(verdicts)
        soundness_text = experiment_sentence(verdicts, [a.attack for a in attacks for _ in a.verdicts])
        if diverged:
            soundness_text = f"training diverged at round {diverged.round}: nothing was measured"
        experiments.append(Experiment(
            key=experiment.key,
            label=experiment.label,
            defense=experiment.defense.name,
            reference=experiment.defense.reference,
            params=to_mapping(asdict(experiment.defense.params)),
            training=to_mapping(experiment.training),
            target_epsilon=experiment.target_epsilon,
            claim=claim,
            server_view=experiment.defense.observes,
            utility=Utility(
                test_accuracy=mean_interval([m["utility"]["test_accuracy"] for m in manifests]),
                test_loss=mean_interval([m["utility"]["test_loss"] for m in manifests]),
            ),
            rounds=_round_curves(metrics),
            diagnostics=diagnostics_summary(manifests, metrics, (landscape or {}).get(experiment.key, [])),
            attacks=attacks,
            soundness=soundness,
            soundness_text=soundness_text,
            # the canary audits training could not run, then the attacks the attack stage could not
            skipped_attacks=[*trained.skipped.get(experiment.key, ()), *attacked.skipped.get(experiment.key, ())],
            runs=ids,
            canary_runs={label: list(runs) for label, runs in trained.canary_ids.get(experiment.key, {}).items()},
            status="diverged" if diverged else "completed",
            diverged=diverged,
        ))
    model = task.model_factory()
    audit = AuditInfo(
        name=config.name,
        seed=config.seed,
        dataset=config.dataset.name,
        dataset_source=task.dataset.source,
        kind=task.kind,  # type: ignore[arg-type]  # "image" or "tabular" (audit.core.datasets)
        pool_size=len(task.pool),
        test_size=len(task.test),
        clients=config.partition.clients,
        partition=config.partition.name,
        model=config.model.name,
        model_parameters=sum(p.numel() for p in model.parameters()),
        membership_runs=config.membership.runs,
        membership_unit=Unit(plan.membership.unit),
        accounting=asdict(plan.accounting),
        metric_definitions=MEMBERSHIP_METRICS,
    )
    return Results(
        schema_version=SCHEMA_VERSION,
        tool=Tool(name="dpfl-audit", version=__version__, dp_accounting=dp_accounting_version()),
        audit=audit,
        config=to_mapping(config),
        versions=provenance.versions(),
        experiments=experiments,
        rows=rows_from_results(audit, experiments),
    )
