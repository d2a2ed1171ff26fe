"""LiRA: the Likelihood Ratio Attack (Carlini, Chien, Nasr, Song, Terzis, Tramèr 2022,
"Membership Inference Attacks From First Principles", §IV–VI).

For a target model f and a record (x, y), observe φ = logit-scaled confidence of f on y
(:mod:`attacks.signals`). Reference runs that trained on the record ("in") and did not ("out")
give two samples of φ, modelled as Gaussians N(μ_in, σ_in²) and N(μ_out, σ_out²):

* **online** (Alg. 1): Λ = log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²);
* **offline** (§VI-C): a one-sided test against the out distribution only,
  Λ = (φ − μ_out)/σ_out, monotone in the paper's 1 − Pr[Z > φ], Z ~ N(μ_out, σ_out²).

With several query views (mirror/shift augmentations, §VI-B; or the global models of several
rounds, which the federated server holds) each view has its own Gaussians and the per-view
scores are averaged. Variance is either estimated per example or shared
across records ("global", the paper's fixed-variance variant, recommended below 64 reference
runs): the pooled within-record variance of all records.

Leave-one-out evaluation: every run is the target once and the other N−1 runs are its
references, so each record gets N scores (one per target run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, MembershipAttack
from attacks.membership_experiment import MembershipExperiment, TargetParams, rounds_note
from attacks.signals import AUGMENTATIONS, augmentation_views, logit_scaled_confidence
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic (audit.core.lazy_modules)
    stats = lazy_module("scipy.stats")

VARIANTS = ("online", "offline")
_VARIANCE_FLOOR = 1e-8


@dataclass(frozen=True)
class LiRAParams(TargetParams):
    variants: list[str] = field(default_factory=lambda: ["online", "offline"],
                                metadata={"choices": VARIANTS, "help": "online (in and out Gaussians) and/or offline (out only)"})
    variance: str = field(default="global", metadata={"choices": ("global", "per-example"),
                                                      "help": "σ per record or pooled over records (fixed variance)"})
    augment: str = field(default="none", metadata={"choices": AUGMENTATIONS, "help": "query views for image data"})


def _moments(signals: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (record, view): count, sum and sum of squares over runs with weight 1."""
    w = weights[:, :, None].astype(np.float64)
    return weights.sum(0).astype(np.float64), (w * signals).sum(0), (w * signals ** 2).sum(0)


def _gaussians(count: np.ndarray, total: np.ndarray, squares: np.ndarray,
               per_example: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means, variances and a usable-mask per (record, view) from moments (count broadcast over views)."""
    n = count[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n
        scatter = np.maximum(squares - n * mean ** 2, 0.0)  # Σ (φ − μ)² per record
    usable = count > 0
    pooled_dof = np.maximum(n - 1, 0).sum(0)
    pooled = np.where(pooled_dof > 0, np.nansum(np.where(n > 1, scatter, 0.0), 0) / np.maximum(pooled_dof, 1), 1.0)
    pooled = np.maximum(pooled, _VARIANCE_FLOOR)
    if per_example:
        with np.errstate(invalid="ignore", divide="ignore"):
            variance = np.where(n > 1, scatter / np.maximum(n - 1, 1), pooled[None, :])
        variance = np.maximum(variance, _VARIANCE_FLOOR)
    else:
        variance = np.broadcast_to(pooled, mean.shape).copy()
    return mean, variance, usable


@ATTACKS.register
class LiRA(MembershipAttack):
    name = "lira"
    summary = "Likelihood Ratio Attack, online and offline, leave-one-out over the membership runs"
    reference = "Carlini et al. 2022, Membership Inference Attacks From First Principles"
    Params = LiRAParams
    min_runs = 4  # a target needs references both with and without each record

    def signals(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """φ for every (run, record, view): float64 [runs, records, views]; views = rounds × queries."""
        labels = experiment.labels.numpy()
        views = augmentation_views(experiment.kind, self.params.augment)
        rounds = experiment.round_list(self.params.rounds)
        columns = []
        for i, round_number in enumerate(rounds):
            logits = experiment.logits(round_number, views)  # [runs, views, records, classes]
            columns.append(logit_scaled_confidence(logits, labels).transpose(0, 2, 1))
            if progress is not None:
                progress(i + 1, len(rounds))
        return np.concatenate(columns, axis=2)

    def scores(self, signals: np.ndarray, keep: np.ndarray, references: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """LiRA scores [targets, records] for each variant, from signals [runs, records, views].

        Each target's references are the runs in ``references`` (bool [runs]; default all) other
        than the target itself (leave-one-out)."""
        keep = keep.astype(bool)
        runs = keep.shape[0]
        references = np.ones(runs, dtype=bool) if references is None else references
        per_example = self.params.variance == "per-example"
        totals_in = _moments(signals, keep & references[:, None])
        totals_out = _moments(signals, ~keep & references[:, None])
        result = {variant: np.empty(keep.shape, dtype=np.float64) for variant in self.params.variants}
        for target in range(runs):
            own = signals[target]
            own_in, own_out = keep[target] & references[target], ~keep[target] & references[target]
            # moments of the references = totals minus the target's own contribution
            moments_in = tuple(t - c for t, c in zip(totals_in, (own_in.astype(np.float64), own_in[:, None] * own,
                                                                 own_in[:, None] * own ** 2)))
            moments_out = tuple(t - c for t, c in zip(totals_out, (own_out.astype(np.float64), own_out[:, None] * own,
                                                                   own_out[:, None] * own ** 2)))
            mean_out, var_out, usable_out = _gaussians(*moments_out, per_example)
            mean_in, var_in, usable_in = _gaussians(*moments_in, per_example)
            # A record no reference excluded (or included) borrows the average in/out shift.
            both = usable_in & usable_out
            shift = np.nanmean(mean_in[both] - mean_out[both], axis=0) if both.any() else np.zeros(own.shape[1])
            mean_out = np.where(usable_out[:, None], mean_out, mean_in - shift)
            mean_in = np.where(usable_in[:, None], mean_in, mean_out + shift)
            if "online" in result:
                log_ratio = (stats.norm.logpdf(own, mean_in, np.sqrt(var_in))
                             - stats.norm.logpdf(own, mean_out, np.sqrt(var_out)))
                result["online"][target] = log_ratio.mean(1)
            if "offline" in result:
                result["offline"][target] = ((own - mean_out) / np.sqrt(var_out)).mean(1)
        return result

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        signals = self.signals(experiment, progress)
        notes = (f"{experiment.runs - 1} reference runs per target, {self.params.variance} variance, "
                 f"queries: {self.params.augment}, {rounds_note(experiment, self.params.rounds)}")
        keep = experiment.keep.astype(bool)
        # The one-run ε needs targets scored without each other's membership: the second half of
        # the runs, each against the first half as its only references.
        references = np.arange(experiment.runs) < experiment.runs // 2
        targets = np.flatnonzero(~references)
        split = self.scores(signals, keep, references)
        return [self.result(variant, experiment, scores, notes, independent=(targets, split[variant][targets]))
                for variant, scores in self.scores(signals, keep).items()]
