"""Simulations that validate the verdict statistics.

Three designs, each replicated with fresh seeds (``benchmarks/coverage.py`` runs them at full
size and ``tests/attacks/test_coverage.py`` small):

(a) :func:`pipeline_null` — the real training, attack and report code (``dpfl-audit run``) on a
    configuration where membership cannot leak: client-level DP-FedAvg at ε = 0.05, so the
    model is at chance. True values: AUC 0.5, TPR = the attainable FPR at each operating point
    (:func:`attainable_fpr`), ε = 0.
(b) :func:`pipeline_leaky` — the same pipeline on a leaky configuration (non-private FedAvg
    whose clients overfit): coverage of the design's expected AUC and TPRs, estimated by the
    mean over the replicates; and :func:`known_effect` — membership scores of a crossed runs ×
    units design with a run effect, a unit effect and a Gaussian shift μ for members, through
    the same metric code as the attacks (:func:`attacks.membership_metrics.membership_metrics`), where the
    truth is known exactly: with total score variance s² = σ²_run + σ²_unit + σ²_cell the pooled
    AUC is Φ(μ/(s√2)) and TPR at FPR x is 1 − Φ(Φ⁻¹(1 − x) − μ/s).
(c) :func:`tight_claim` — canary coins scored by the optimal attack on a mechanism exactly as
    private as the claim (the μ-GDP pair meeting (ε, δ), or ε-randomised response for δ = 0),
    several correlated ε figures per experiment — each attack's Steinke and f-DP bounds — decided
    by the report's verdict code (Holm over the family): the rate of experiments with a VIOLATION
    must stay ≤ 5 %.
(d) :func:`gate_false_alarms` — ``check --baseline`` between honest audits of the smoke preset
    at different seeds (the rate of failing checks must stay ≤ 5 %, the regressions' family-wise
    level), and against an audit whose DP-FedAvg lost its noise (it must fail).
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attacks.membership_metrics import OPERATING_POINTS, membership_metrics, one_run_bounds
from audit.attacking import attack_runs
from audit.config import load_config
from audit.core.audit_power import tight_scores
from audit.core.empirical_epsilon import gaussian_fit_epsilon
from audit.core.fdp_one_run import gdp_epsilon
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import AttackKind, EpsilonKind, Relation, Unit, VerdictStatus
from audit.logs import progress_bar
from audit.pipeline import train
from audit.planning import plan_audit
from audit.summary import build_results
from defenses.privacy.claims import PrivacyClaim
from reports.document import Estimate
from reports.gate import FAIL, evaluate_policy
from reports.policy import parse_policy
from reports.soundness import attack_verdicts, family_verdicts

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic (audit.core.lazy_modules)
    stats = lazy_module("scipy.stats")

NULL_CONFIG = """
seed: {seed}
dataset: {{name: digits, max_pool: 400, max_test: 100}}
model: {{name: mlp, options: {{hidden: [32]}}}}
partition: {{name: iid, clients: 10}}
membership: {{runs: 16, unit: client}}
training: {{rounds: 2, local_steps: 1, batch_size: 10, lr: 0.1}}
diagnostics: {{enabled: false}}
attacks: [{{name: lira}}, {{name: shokri}}, {{name: loss-threshold}}]
defenses:
  - name: dp-fedavg
    epsilons: [0.05]
"""


LEAKY_CONFIG = """
seed: {seed}
dataset: {{name: digits, max_pool: 400, max_test: 100}}
model: {{name: mlp, options: {{hidden: [32]}}}}
partition: {{name: iid, clients: 10}}
membership: {{runs: 16, unit: client}}
training: {{rounds: 4, local_steps: 5, batch_size: 10, lr: 0.1}}
diagnostics: {{enabled: false}}
attacks: [{{name: lira}}, {{name: shokri}}, {{name: loss-threshold}}]
defenses:
  - name: fedavg
"""


@dataclass
class Tally:
    """Hits of an interval over replicates."""

    hits: int = 0
    total: int = 0

    def add(self, low: float | None, high: float | None, truth: float) -> None:
        if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
            return
        self.count(low - 1e-12 <= truth <= high + 1e-12)

    def count(self, hit: bool) -> None:
        self.total += 1
        self.hits += int(hit)

    @property
    def rate(self) -> float:
        return self.hits / self.total if self.total else math.nan


@dataclass
class Replicates:
    """One figure's 95 % intervals over the replicates of a pipeline design."""

    values: list[float] = field(default_factory=list)
    lows: list[float] = field(default_factory=list)
    highs: list[float] = field(default_factory=list)
    #: per replicate, the largest FPR ≤ the operating point that a threshold can give (TPR figures)
    attainable: list[float] = field(default_factory=list)

    def add(self, estimate: Estimate, attainable: float = math.nan) -> None:
        if None in (estimate.value, estimate.ci_low, estimate.ci_high):
            return
        self.values.append(float(estimate.value))
        self.lows.append(float(estimate.ci_low))
        self.highs.append(float(estimate.ci_high))
        self.attainable.append(attainable)

    def coverage(self, truth: float | None = None) -> Tally:
        """Coverage of ``truth``, or of each replicate's attainable FPR (a TPR's value under a null)."""
        tally = Tally()
        for low, high, attainable in zip(self.lows, self.highs, self.attainable):
            tally.add(low, high, attainable if truth is None else truth)
        return tally

    def spread(self) -> tuple[float, float]:
        """(SD of the point values across replicates, the mean SE its intervals imply: half-width / 1.96)."""
        values = np.asarray(self.values)
        implied = (np.asarray(self.highs) - np.asarray(self.lows)) / (2 * 1.96)
        return float(values.std(ddof=1)) if len(values) > 1 else math.nan, float(implied.mean()) if len(values) else math.nan


def pipeline_replicates(template: str, replicates: int, start_seed: int = 0, progress: str | None = None
                        ) -> tuple[dict[str, Replicates], dict[str, Tally]]:
    """The real pipeline — training, attacks, metrics and verdicts as ``dpfl-audit run`` computes
    them (:func:`audit.pipeline.train`, :func:`audit.attacking.attack_runs`,
    :func:`audit.summary.build_results`), without the HTML —
    on ``template`` (a config with a ``{seed}`` field) at seeds ``start_seed`` onwards.

    Returns every membership figure's intervals ("<attack> auc", "<attack> tpr_at_fpr_1%", …) and
    the tallies of events: ε_LB = 0 per attack, and experiments without a VIOLATION."""
    figures: dict[str, Replicates] = {}
    events: dict[str, Tally] = {}
    with tempfile.TemporaryDirectory() as folder:
        config_file = Path(folder) / "design.yaml"
        bar = progress_bar(replicates, progress or "replicates", quiet=not progress)
        for i in range(replicates):
            seed = start_seed + i
            config_file.write_text(template.format(seed=seed), encoding="utf-8")
            plan = plan_audit(load_config(config_file))
            out = Path(folder) / f"out-{seed}"
            trained = train(plan, out, quiet=True)
            attacked = attack_runs(plan, trained, out, quiet=True)
            results = build_results(plan, trained, attacked)
            experiment = results.experiments[0]
            scores_of = {result.name: result.scores for result in attacked.results[experiment.key]}
            for record in experiment.attacks:
                if record.kind != AttackKind.MEMBERSHIP:
                    continue
                scores = scores_of[record.attack]
                figures.setdefault(f"{record.attack} auc", Replicates()).add(record.metrics["auc"])
                for name, fpr in OPERATING_POINTS:
                    figures.setdefault(f"{record.attack} {name}", Replicates()).add(record.metrics[name],
                                                                                    attainable_fpr(scores, fpr))
                bound = record.metrics.get("epsilon_one_run")
                if bound is not None and bound.value is not None:
                    events.setdefault(f"{record.attack} ε_LB = 0", Tally()).count(bound.value <= 0.0)
            statuses = {v.status for record in experiment.attacks for v in record.verdicts}
            events.setdefault("experiment without a VIOLATION", Tally()).count(VerdictStatus.VIOLATION not in statuses)
            shutil.rmtree(out, ignore_errors=True)
            bar.update(1)
    bar.close()
    return figures, events


def attainable_fpr(scores: np.ndarray, fpr: float) -> float:
    """The largest share of all scores at or above a threshold that does not exceed ``fpr``.

    Under a null members and non-members score alike, so a threshold's TPR equals its FPR and the
    true "TPR at FPR ≤ x" (read without interpolation, as the report reads it) is this share: x
    for continuous scores, less where scores tie in large groups (a model at chance whose loss
    depends only on the label: every tie group holds a tenth of the scores, and the truth at 1 %
    is 0)."""
    flat = np.sort(np.asarray(scores, dtype=np.float64).ravel())[::-1]
    at_or_above = np.searchsorted(-flat, -flat, side="right") / flat.size  # share with score ≥ each value
    allowed = at_or_above[at_or_above <= fpr + 1e-12]
    return float(allowed.max()) if allowed.size else 0.0


def pipeline_null(replicates: int, start_seed: int = 0, progress: bool = True, unit: str = "client") -> dict[str, Tally]:
    """(a): the real pipeline under a null (:data:`NULL_CONFIG`), whole clients or records in and
    out (``unit``; records give each member thousands of non-member scores, so TPR at 0.1 % FPR is
    estimable): coverage of AUC 0.5 and of TPR = FPR at each operating point, the rate of ε_LB = 0
    and of experiments without a VIOLATION."""
    template = NULL_CONFIG.replace("unit: client", f"unit: {unit}")
    figures, events = pipeline_replicates(template, replicates, start_seed, f"pipeline null ({unit})" if progress else None)
    tallies = {name: figure.coverage(0.5 if name.endswith(" auc") else None) for name, figure in figures.items()}
    return {**tallies, **events}


def pipeline_leaky(replicates: int, start_seed: int = 10**6, progress: bool = True
                   ) -> dict[str, tuple[Tally, float, float, float]]:
    """(b): the real pipeline on a leaky design (:data:`LEAKY_CONFIG`: non-private FedAvg whose
    clients overfit). Its true AUC and TPRs have no closed form; the estimand of a fixed design is
    the expectation of the figure over training randomness and the unit population, estimated by
    the mean over the replicates (its standard error is the SD / √replicates, small beside an
    interval's half-width). Per figure: (coverage of that mean, the mean, the SD across
    replicates, the mean SE the intervals imply)."""
    figures, _ = pipeline_replicates(LEAKY_CONFIG, replicates, start_seed, "pipeline leaky" if progress else None)
    out = {}
    for name, figure in figures.items():
        truth = float(np.mean(figure.values)) if figure.values else math.nan
        sd, implied = figure.spread()
        out[name] = (figure.coverage(truth), truth, sd, implied)
    return out


def crossed_scores(rng: np.random.Generator, runs: int, units: int, mu: float,
                   run_sd: float = 0.5, unit_sd: float = 1.0) -> tuple[np.ndarray, np.ndarray, float]:
    """(b): scores [runs, units] with run and unit effects and a member shift μ; returns the total sd."""
    truth = rng.random((runs, units)) < 0.5
    scores = (rng.normal(0, run_sd, (runs, 1)) + rng.normal(0, unit_sd, (1, units)) + rng.normal(0, 1, (runs, units))
              + mu * truth)
    return scores, truth, math.sqrt(run_sd ** 2 + unit_sd ** 2 + 1.0)


def known_effect(replicates: int, mu: float = 1.0, runs: int = 16, units: int = 160, seed: int = 1,
                 bootstrap: int = 1000) -> dict[str, Tally]:
    """(b): coverage of the true AUC and TPRs for a known shift (μ = 0 is the metric-level null)."""
    rng = np.random.default_rng(seed)
    tallies = {name: Tally() for name in ("auc", *(n for n, _ in OPERATING_POINTS))}
    for i in range(replicates):
        scores, truth, sd = crossed_scores(rng, runs, units, mu)
        metrics, _, _ = membership_metrics(scores, truth, seed=seed * 100003 + i, bootstrap=bootstrap)
        tallies["auc"].add(metrics["auc"].low, metrics["auc"].high, float(stats.norm.cdf(mu / (sd * math.sqrt(2)))))
        for name, fpr in OPERATING_POINTS:
            true_tpr = float(1 - stats.norm.cdf(stats.norm.ppf(1 - fpr) - mu / sd))
            tallies[name].add(metrics[name].low, metrics[name].high, true_tpr)
    return tallies


def accuracy_coverage(replicates: int, mu: float = 0.0, runs: int = 16, units: int = 200, seed: int = 3,
                      bootstrap: int = 300) -> tuple[Tally, float, float, float]:
    """(b): the membership ``accuracy`` (each target run at the threshold fitted on the other runs)
    on the crossed design — run effect sd 0.5, unit effect sd 1, cell sd 1, member shift μ.
    Under the null (μ = 0) the truth is independent of the scores, so the accuracy is ½ in
    expectation whatever the thresholds; with μ > 0 the design's expected accuracy is estimated by
    the mean over the replicates. Returns the tally of 95 % intervals covering it, that truth,
    the SD of the accuracy over the replicates and the mean SE its intervals imply."""
    rng = np.random.default_rng([seed, int(round(mu * 1000))])
    figures = Replicates()
    for i in range(replicates):
        scores, truth, _ = crossed_scores(rng, runs, units, mu)
        accuracy = membership_metrics(scores, truth, seed=seed * 100003 + i, bootstrap=bootstrap)[0]["accuracy"]
        figures.add(Estimate(accuracy.value, accuracy.low, accuracy.high))
    expected = 0.5 if mu == 0 else float(np.mean(figures.values))
    return (figures.coverage(expected), expected, *figures.spread())


def gaussian_fit_coverage(replicates: int, canaries: int, mu: float, delta: float = 1e-5, seed: int = 4) -> Tally:
    """(e): coverage of the Gaussian-fit ε interval (Andrew et al. 2024) when the canary statistics
    are exactly the μ-GDP pair N(μ, 1) vs N(0, 1): each canary inserted by a fair coin, as in an
    audit; the truth is the pair's ε at δ."""
    rng = np.random.default_rng([seed, canaries, int(round(mu * 1000))])
    truth = gdp_epsilon(mu, delta)
    tally = Tally()
    for _ in range(replicates):
        inserted = rng.random(canaries) < 0.5
        if inserted.sum() < 2 or (~inserted).sum() < 2:
            continue
        statistics = mu * inserted + rng.standard_normal(canaries)
        fit = gaussian_fit_epsilon(statistics[inserted], statistics[~inserted], delta)
        tally.add(fit.low, fit.high, truth)
    return tally


def tight_claim(replicates: int, epsilon: float, delta: float, runs: int = 16, units: int = 40, figures: int = 4,
                seed: int = 2) -> tuple[float, int]:
    """(c): the rate of experiments with a VIOLATION when the mechanism is exactly as private as
    claimed; ``figures`` correlated attacks per experiment (the same coins, different noise), each
    with its two one-run bounds (Steinke et al.'s and the f-DP analysis of the same counts)."""
    rng = np.random.default_rng(seed)
    claim = PrivacyClaim(epsilon, delta, Unit.CLIENT, "simulated", relation=Relation.ADD_REMOVE)
    violations = 0
    for _ in range(replicates):
        inserted = rng.random(runs * units) < 0.5
        base = tight_scores(rng, inserted, epsilon, delta)
        family = []
        for f in range(figures):  # correlated figures: a shared optimal statistic plus attack-specific noise
            scores = base + (0.3 * f) * rng.standard_normal(base.shape)
            audits = one_run_bounds(scores, inserted, delta)
            family += attack_verdicts(claim, Unit.CLIENT, {k: Estimate(a.epsilon, a.epsilon, None) for k, a in audits.items()},
                                      dict.fromkeys(audits, EpsilonKind.LOWER_BOUND), Relation.ADD_REMOVE, audits)
        violations += any(v.status == VerdictStatus.VIOLATION for v in family_verdicts(family))
    return violations / replicates, replicates




#: the no-regression rules of ``examples/policy.yaml``: leakage of the private defense, utility of all
GATE_RULES = [{"kind": "no-regression", "name": "no leakage regression vs baseline", "defense": "dp-fedavg",
               "exclude_attacks": ["dirac-canaries-each-upload"]},
              {"kind": "no-regression", "name": "no utility regression vs baseline", "attack": "none",
               "metric": "test_accuracy"}]


@dataclass
class GateRates:
    """How often ``check --baseline`` fails between honest audits of the same code (false alarms)
    and when the private defense has lost its noise (detections)."""

    false_alarms: Tally = field(default_factory=Tally)  # independent pairs: seeds (0, 1), (2, 3), ...
    false_alarms_all_pairs: Tally = field(default_factory=Tally)  # every ordered pair (correlated)
    comparisons: int = 0  # interval comparisons per check
    detections: Tally = field(default_factory=Tally)  # independent pairs, the new audit's DP-FedAvg without noise


def smoke_results(seed: int, folder: Path, attacks: list[dict] | None = None):
    """The smoke preset's results at ``seed`` (``attacks`` replaces its attack list)."""
    overrides: dict = {"seed": seed}
    if attacks is not None:
        overrides["attacks"] = attacks
    plan = plan_audit(load_config(preset_name="smoke", overrides=overrides))
    out = folder / f"seed-{seed}"
    trained = train(plan, out, quiet=True)
    results = build_results(plan, trained, attack_runs(plan, trained, out, quiet=True))
    shutil.rmtree(out, ignore_errors=True)
    return results


def without_noise(results):
    """``results`` as if its DP-FedAvg had lost its noise: the private experiment's utility and
    leakage replaced by those of the non-private FedAvg of the same audit (key and label kept)."""
    plain = next(e for e in results.experiments if e.defense == "fedavg")
    swapped = [replace(plain, key=e.key, label=e.label, defense=e.defense) if e.defense == "dp-fedavg" else e
               for e in results.experiments]
    return replace(results, experiments=swapped)


def gate_false_alarms(seeds: int, start_seed: int = 0, attacks: list[dict] | None = None,
                      progress: bool = True) -> GateRates:
    """(d): the smoke preset at ``seeds`` seeds, and :data:`GATE_RULES` checked between them —
    baseline one seed, new another — through :func:`reports.gate.evaluate_policy`."""
    policy = parse_policy({"rules": GATE_RULES})
    rates = GateRates()
    with tempfile.TemporaryDirectory() as folder:
        audits = []
        bar = progress_bar(seeds, "smoke audits", quiet=not progress)
        for i in range(seeds):
            audits.append(smoke_results(start_seed + i, Path(folder), attacks))
            bar.update(1)
        bar.close()

    def fails(new, old) -> bool:
        outcomes = evaluate_policy(policy, new, old)
        rates.comparisons = sum(o.p_value is not None for o in outcomes)
        return any(o.verdict == FAIL for o in outcomes)

    for a, b in itertools.permutations(range(seeds), 2):
        rates.false_alarms_all_pairs.count(fails(audits[b], audits[a]))
    for a in range(0, seeds - 1, 2):
        rates.false_alarms.count(fails(audits[a + 1], audits[a]))
        rates.detections.count(fails(without_noise(audits[a + 1]), audits[a]))
    return rates
