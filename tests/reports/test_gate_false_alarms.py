"""``check --baseline`` tolerates honest randomness and still catches a lost defense: the small
version of ``benchmarks/gate_false_alarms.py``.

Two audits of the same code with different seeds are two independent draws of every figure, and
the gate's regression comparisons are one family decided by Holm at 5 %: a check between them
fails with probability at most 5 % when the intervals are honest. Over n independent seed pairs
the number of failing checks is then at most Binomial(n, 0.05); we accept up to the count that a
correct gate exceeds with probability < 1 %. The same pairs with the new audit's DP-FedAvg
stripped of its noise (its figures replaced by FedAvg's: LiRA's AUC ≈ 0.95 instead of ≈ 0.6) must
fail in at least half of the pairs: the smoke preset's 5 clients give intervals ±0.2 wide, so even
a lost defense is not certain to stand out (measured with these two attacks: 18 of 20 pairs, and
20 of 20 with every attack in the benchmark). At a detection rate of 0.85 a correct gate has fewer
than 6 of 12 with probability 0.0006; a gate that never fails, or one that ignores the leakage rule
(which then fails only at its false-alarm rate, ≈ 5 %: 6 of 12 with probability 1e-5), fails this
test. The benchmark runs 40 seeds; 12 pairs are enough to tell these apart.
"""

from __future__ import annotations

from pathlib import Path

from scipy.stats import binom

from audit.validation import GATE_RULES, gate_false_alarms
from reports.policy import load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]
#: the membership attacks of the smoke preset (its canary audits and run attacks are left out to
#: keep the suite fast; the benchmark runs them all)
ATTACKS = [{"name": "lira"}, {"name": "loss-threshold"}]
SEEDS = 24  # 12 independent pairs


def test_the_gate_rules_measured_are_those_of_the_example_policy():
    example = [rule for rule in load_policy(ROOT / "examples" / "policy.yaml").rules if rule.kind == "no-regression"]
    assert list(parse_policy({"rules": GATE_RULES}).rules) == example


def test_honest_seed_pairs_rarely_fail_the_gate_and_a_lost_defense_mostly_does():
    rates = gate_false_alarms(SEEDS, start_seed=1000, attacks=ATTACKS, progress=False)
    pairs = rates.false_alarms.total
    assert pairs == SEEDS // 2 and rates.comparisons >= 5
    allowed = int(binom.ppf(0.99, pairs, 0.05))  # 3 of 12
    assert rates.false_alarms.hits <= allowed, (rates.false_alarms.hits, pairs, rates.false_alarms_all_pairs.rate)
    assert binom.cdf(5, pairs, 0.85) < 1e-3 and binom.sf(5, pairs, 0.05) < 1e-4  # the threshold below, as stated
    assert rates.detections.total == pairs and rates.detections.hits >= pairs / 2, rates.detections
