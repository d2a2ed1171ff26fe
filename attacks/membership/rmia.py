"""RMIA: the Robust Membership Inference Attack (Zarifzadeh, Liu, Shokri, "Low-Cost High-Power
Membership Inference Attacks", ICML 2024; arXiv:2312.03262).

RMIA tests membership against a finer null hypothesis than LiRA's: "the target model θ was
trained on some population record z instead of x". For one pair (x, z) the likelihood ratio of
the two hypotheses, by Bayes' rule, is the paper's pairwise likelihood ratio

    LR_θ(x, z) = Pr(θ | x) / Pr(θ | z) = [Pr(x | θ) / Pr(x)] / [Pr(z | θ) / Pr(z)],

and the score of x is the fraction of population records that x dominates by a factor γ:

    Score(x; θ) = Pr_{z ~ π}[ LR_θ(x, z) ≥ γ ]            (estimated over a sample Z of π).

* Pr(x | θ): the probability the model gives the record's true label (softmax of the logits,
  float64). RMIA's ratio is a ratio of likelihoods, so it uses the probability itself and not
  LiRA's logit-scaled confidence.
* Pr(x) = Σ_θ' Pr(x | θ') Pr(θ'): the marginal over models trained like the target, estimated by
  averaging Pr(x | θ') over reference models θ'.

  - **online**: every reference run, those that trained on x and those that did not: their mean
    estimates the marginal over the design's inclusion coin directly.
  - **offline**: only reference runs that did *not* train on x (OUT). Writing the marginal as
    Pr(x) = ½ (Pr_OUT(x) + Pr_IN(x)) and approximating the unseen Pr_IN(x) ≈ a·Pr_OUT(x) + (1 − a)
    — a line through (1, 1): a record that OUT models already fit perfectly cannot gain by being
    trained on — gives the paper's offline estimate

        Pr(x) = ½ ((1 + a) · Pr_OUT(x) + (1 − a)),   0 ≤ a ≤ 1,

    with ``a`` a parameter (the authors' default ≈ 0.3; a = 1 means "IN equals OUT", i.e.
    Pr(x) = Pr_OUT(x)). The ½ is the paper's: the design's inclusion coin is ½ by default.
* Pr(z) is estimated exactly like Pr(x): online from every reference run, offline from the OUT
  references of z through the same approximation. This follows the authors' code
  (privacytrustlab/ml_privacy_meter, ``research/2024_rmia``, whose ``offline_a`` "is used to
  compute p(x) and p(z) from p_OUT(x) and p_OUT(z)"): the two ratios in LR_θ(x, z) must be
  estimated alike, or the offline score is biased by the estimator rather than by membership.
* Population: for target run t, Z is a sample of up to ``population`` records that t did **not**
  train on (the paper's z are population data outside the target's training set), drawn with a
  seeded generator (``audit.core.seeding``). A unit never serves as its own z — for x's score the
  records of x's own unit (x itself; its client's records at the client unit) are left out of Z,
  as the authors' code does for a population record: otherwise a non-member's score would read
  its own truth through the composition of Z.
* γ: the paper's threshold on LR (default 1: "x is more likely than z to have been trained on").

The ratios are computed in log space, log LR = log Pr(x|θ) − log Pr(x) − log Pr(z|θ) + log Pr(z),
so saturated outputs (probabilities that underflow) give no 0/0. A record that every reference
run trained on has no OUT reference: its Pr_OUT falls back to the mean over all its references
(rare: probability 2^−(N−1) per record and target at inclusion ½). With several rounds' global models (``rounds``) each round
is tested separately and the per-round scores are averaged, as LiRA here averages per view.

Leave-one-out evaluation, as LiRA's: every run is the target once and the other runs are its
references. Those scores read other runs' membership (offline references, and the target's own
membership through the choice of Z), so they feed the AUC and TPR metrics but not the one-run ε.
For the ε bound the second half of the runs is scored against the first half as references and
with a population drawn without looking at the target's membership (a sample of all candidate
records, the unit itself left out): those scores read no coin of the counted runs, which
Steinke et al.'s count requires (``attacks.membership_metrics.membership_metrics``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from attacks import signals
from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, MembershipAttack
from attacks.membership_experiment import MembershipExperiment, TargetParams, rounds_note
from audit.core.seeding import numpy_rng
from audit.core.vocabulary import Unit

VARIANTS = ("online", "offline")


@dataclass(frozen=True)
class RMIAParams(TargetParams):
    variants: list[str] = field(default_factory=lambda: ["online", "offline"], metadata={
        "choices": VARIANTS, "min_length": 1,
        "help": "online (Pr(x) over every reference run) and/or offline (OUT references only, through a)"})
    a: float = field(default=0.3, metadata={
        "min": 0.0, "max": 1.0,
        "help": "offline: Pr_IN(x) ≈ a·Pr_OUT(x) + 1 − a, so Pr(x) = ½((1 + a)·Pr_OUT(x) + 1 − a); "
                "the paper's ≈ 0.3, 1 = IN like OUT"})
    gamma: float = field(default=1.0, metadata={
        "min": 0.0, "min_exclusive": True, "help": "score = fraction of population z with LR(x, z) ≥ gamma"})
    population: int = field(default=10_000, metadata={
        "min": 1, "help": "population records z per target run (a sample of its non-members); the score's "
                          "resolution is 1/population, so keep it above 1,000 for TPR at 0.1 % FPR"})


def _log_mean(log_p: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """log of the mean of exp(log_p) over the runs where ``mask`` holds, per record
    (log_p, mask: [runs, records]); NaN where no run qualifies."""
    masked = np.where(mask, log_p, -np.inf)
    top = masked.max(0)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return shift + np.log(np.exp(masked - shift).sum(0)) - np.log(mask.sum(0))


def _fraction_dominated(log_ratio: np.ndarray, population: np.ndarray, log_gamma: float, units: np.ndarray) -> np.ndarray:
    """For every record x: the fraction of z ∈ Z outside x's unit with LR(x, z) ≥ γ, i.e. with
    log_ratio[z] ≤ log_ratio[x] − log γ (log_ratio = log Pr(·|θ) − log Pr(·)); ``units``: the
    unit (a non-negative integer) of each record."""
    threshold = log_ratio - log_gamma
    values = log_ratio[population]
    count = np.searchsorted(np.sort(values), threshold, side="right")
    # The same count within x's own unit, to subtract: dense ranks of every value compared (equal
    # values share a rank, so "≤" is decided exactly as above), keyed by unit and searched at once.
    _, ranks = np.unique(np.concatenate([values, threshold]), return_inverse=True)
    span = len(values) + len(threshold) + 1
    keys = np.sort(units[population].astype(np.int64) * span + ranks[:len(values)])
    base = units.astype(np.int64) * span
    own_hits = np.searchsorted(keys, base + ranks[len(values):], side="right") - np.searchsorted(keys, base, side="left")
    size = len(population) - np.bincount(units[population], minlength=int(units.max()) + 1)[units]
    # no z left to compare with: the uninformative ½
    return np.where(size > 0, (count - own_hits) / np.maximum(size, 1), 0.5)


@ATTACKS.register
class RMIA(MembershipAttack):
    name = "rmia"
    summary = "Robust Membership Inference Attack: pairwise likelihood ratios against population records, online and offline"
    reference = "Zarifzadeh, Liu, Shokri 2024, Low-Cost High-Power Membership Inference Attacks"
    Params = RMIAParams
    min_runs = 2  # one reference run suffices (the paper's low-cost setting)

    def signals(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """log Pr(x | θ_r) of every (run, record, round): float64 [runs, records, rounds]."""
        labels = experiment.labels.numpy()
        rounds = experiment.round_list(self.params.rounds)
        columns = []
        for i, round_number in enumerate(rounds):
            columns.append(-signals.loss(experiment.logits(round_number)[:, 0], labels))  # [runs, records]
            if progress is not None:
                progress(i + 1, len(rounds))
        return np.stack(columns, axis=2)

    def log_marginals(self, log_p: np.ndarray, keep: np.ndarray, references: np.ndarray) -> dict[str, np.ndarray]:
        """log Pr(x) per variant from the reference runs (bool [runs]); log_p: [runs, records]."""
        everyone = np.broadcast_to(references[:, None], log_p.shape)
        online = _log_mean(log_p, everyone)
        out = {}
        if "online" in self.params.variants:
            out["online"] = online
        if "offline" in self.params.variants:
            a = self.params.a
            mean_out = _log_mean(log_p, everyone & ~keep)
            mean_out = np.where(np.isnan(mean_out), online, mean_out)  # no OUT reference: the marginal over all
            with np.errstate(divide="ignore"):  # a = 1: log(1 − a) = −∞, and Pr(x) = Pr_OUT(x)
                out["offline"] = np.log(0.5) + np.logaddexp(np.log1p(a) + mean_out, np.log(1.0 - a))
        return out

    def scores(self, log_p: np.ndarray, keep: np.ndarray, populations: dict[int, np.ndarray],
               groups: np.ndarray | None = None, references: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """RMIA scores [targets, records] per variant, one row per target run in ``populations``
        (target → its population records Z).

        log_p: log Pr(x | θ_r), [runs, records, rounds]. Each target's references are the runs in
        ``references`` (bool [runs]; default all) other than the target itself. ``groups``: the
        unit of each record (default: each record its own), whose records never serve as its z.
        """
        keep = keep.astype(bool)
        runs, records, views = log_p.shape
        references = np.ones(runs, dtype=bool) if references is None else references.astype(bool)
        units = np.arange(records) if groups is None else np.asarray(groups)
        log_gamma = float(np.log(self.params.gamma))
        targets = list(populations)
        result = {variant: np.zeros((len(targets), records)) for variant in self.params.variants}
        for row, target in enumerate(targets):
            others = references & (np.arange(runs) != target)
            for view in range(views):
                marginals = self.log_marginals(log_p[:, :, view], keep, others)
                for variant, log_marginal in marginals.items():
                    log_ratio = log_p[target, :, view] - log_marginal  # log Pr(·|θ)/Pr(·), for x and z alike
                    result[variant][row] += _fraction_dominated(log_ratio, populations[target], log_gamma, units) / views
        return result

    def population(self, seed: int, target: int, candidates: np.ndarray, kind: str) -> np.ndarray:
        """A seeded sample of up to ``population`` records of ``candidates`` for one target run."""
        size = min(self.params.population, len(candidates))
        return np.sort(numpy_rng(seed, "rmia", kind, target).choice(candidates, size, replace=False))

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        unit = experiment.resolve_unit(self.params.unit)
        log_p = self.signals(experiment, progress)
        keep = experiment.keep.astype(bool)
        runs, records = keep.shape
        groups = experiment.owners if unit == Unit.CLIENT else None
        # leave-one-out: each target against all other runs, Z = a sample of the target's non-members
        populations = {t: self.population(experiment.seed, t, np.flatnonzero(~keep[t]), "non-members") for t in range(runs)}
        loo = self.scores(log_p, keep, populations, groups)
        # one-run ε: the second half against the first half's references, Z drawn blind to the
        # target's membership, so no counted coin is read (module docstring)
        references = np.arange(runs) < runs // 2
        targets = np.flatnonzero(~references)
        blind = {int(t): self.population(experiment.seed, int(t), np.arange(records), "blind") for t in targets}
        split = self.scores(log_p, keep, blind, groups, references)
        sizes = sorted({len(z) for z in populations.values()})
        notes = (f"{runs - 1} reference runs per target, population of {sizes[0]}"
                 + (f"–{sizes[-1]}" if len(sizes) > 1 else "") + " non-members of the target, "
                 f"γ = {self.params.gamma:g}, offline a = {self.params.a:g}, {rounds_note(experiment, self.params.rounds)}; "
                 f"ε from runs {targets[0]}–{targets[-1]} against runs 0–{targets[0] - 1} with a membership-blind population")
        return [self.result(variant, experiment, scores, notes, independent=(targets, split[variant]))
                for variant, scores in loo.items()]
