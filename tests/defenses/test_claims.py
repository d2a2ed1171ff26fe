"""Claims name their observer and neighbouring relation, and each figure follows from the noise that
reaches that observer (issue 14, item 1; ``../shared/specs/auditing.md`` §1)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from scipy import optimize, stats

from defenses.base import AccountingSettings
from defenses.claims import (
    AdversaryClaim,
    PrivacyClaim,
    known_participation_epsilon,
    participation_bound,
)
from defenses.dp_fedsam import DPFedSAMTopK, DPFedSAMTopKParams
from defenses.fed_smp import FedSMPParams, FedSMPRandK, FedSMPTopK
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.training_job import TrainingConfig

ACCOUNTING = AccountingSettings()


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of the μ-GDP pair N(0,1) vs N(μ,1) at δ, exactly (Balle & Wang 2018, Thm. 8):
    δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    def gap(eps: float) -> float:
        return (stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2))) - delta

    if gap(0.0) <= 0:
        return 0.0
    high = 1.0
    while gap(high) > 0:
        high *= 2.0
    return optimize.brentq(gap, 0.0, high)


def test_participation_bound_against_exact_binomial_tails():
    """The smallest k with P(K > k) ≤ β, K ~ Binomial(T, q), from exact rational arithmetic."""
    for rounds, rate, beta in ((50, 0.1, 5e-6), (200, 1 / 60, 5e-6), (30, 0.5, 1e-3), (10, 0.9, 0.5)):
        q = Fraction(rate)
        pmf = [math.comb(rounds, j) * q ** j * (1 - q) ** (rounds - j) for j in range(rounds + 1)]
        tail = [sum(pmf[j + 1:]) for j in range(rounds + 1)]  # P(K > k)
        expected = next(k for k in range(rounds + 1) if tail[k] <= beta)
        assert participation_bound(rounds, rate, beta) == expected
    assert participation_bound(30, 1.0, 1e-9) == 30


def test_known_participation_is_no_better_than_the_exact_gaussian():
    """Every round counted, no sampling: T Gaussian rounds with σ are μ-GDP with μ = √T/σ. The RDP figure
    must lie above the exact ε (sound) and not far above it (tight enough to be useful)."""
    for sigma, rounds in ((1.0, 30), (4.0, 10), (0.7, 100)):
        epsilon, counted = known_participation_epsilon(sigma, rounds, 1.0, 1e-5, "rdp", "improved")
        exact = exact_gaussian_epsilon(math.sqrt(rounds) / sigma, 1e-5)
        assert counted == rounds and exact <= epsilon <= 1.25 * exact + 0.1


def test_participation_bound_pays_from_delta():
    """With q < 1 the figure is ε of k rounds at δ/2 (k the β = δ/2 bound), if smaller than all T rounds at δ."""
    sigma, rounds, rate, delta = 1.5406, 200, 1 / 60, 1e-5
    epsilon, counted = known_participation_epsilon(sigma, rounds, rate, delta, "rdp", "improved")
    k = participation_bound(rounds, rate, delta / 2)
    assert counted == k < rounds
    assert epsilon >= exact_gaussian_epsilon(math.sqrt(k) / sigma, delta / 2)
    assert epsilon < known_participation_epsilon(sigma, rounds, 1.0, delta, "rdp", "improved")[0]


def _claim(defense, rate=0.2, clients=20, rounds=30, sampling="poisson"):
    training = TrainingConfig(rounds=rounds, client_rate=rate, sampling=sampling)
    return defense.privacy_claim(training, clients, rounds, 1e-5, ACCOUNTING)


def test_dp_fedavg_names_each_observer():
    sigma, clients = 1.2, 20
    claim = _claim(DPFedAvg(DPFedAvgParams(noise_multiplier=sigma)), clients=clients)
    released, server, local = (claim.against(a) for a in ("released", "server", "local"))
    # the mean divides by the realized |P_t|, which a neighbour with one client fewer would change:
    # the Gaussian analysis covers neighbours that keep every client (zero-out), not add/remove
    assert claim.adversary == "released" and claim.epsilon == released.epsilon and claim.relation == "zero-out"
    assert released.amplification and not server.amplification and server.relation == "zero-out"
    expected = _claim(DPFedAvg(DPFedAvgParams(noise_multiplier=sigma, denominator="expected")), clients=clients)
    assert expected.relation == "add-remove" and expected.epsilon == claim.epsilon  # a public divisor: add/remove
    # no secure aggregation: the server sees each upload, whose noise is σ/√|P_t| ≥ σ/√N
    assert server.noise_multiplier == pytest.approx(sigma / math.sqrt(clients)) == local.noise_multiplier
    assert server.epsilon > 5 * released.epsilon
    with_sa = _claim(DPFedAvg(DPFedAvgParams(noise_multiplier=sigma, secure_aggregation=True)), clients=clients)
    assert with_sa.against("server").noise_multiplier == sigma
    assert released.epsilon < with_sa.against("server").epsilon < server.epsilon  # no amplification against it
    central = _claim(DPFedAvg(DPFedAvgParams(noise_multiplier=sigma, noise_placement="aggregate")), clients=clients)
    assert not central.against("local").covered and central.against("server").noise_multiplier == sigma


def test_fixed_size_sampling_is_replace_one():
    claim = _claim(DPFedAvg(DPFedAvgParams(noise_multiplier=2.0)), rate=0.25, sampling="fixed")
    released = claim.against("released")
    assert released.relation == "replace-one" and released.noise_multiplier == 1.0  # σ/2 per change of 2S


def test_masked_noise_is_accounted_with_what_one_client_adds():
    """Noise kept only on some coordinates: a coordinate kept by the target alone carries σ/√m_max (here
    m_max = N, Poisson); the dense default keeps σ; a data-dependent support makes no finite claim."""
    clients, sigma = 20, 1.0
    dense = _claim(FedSMPRandK(FedSMPParams(keep_fraction=0.25, noise_multiplier=sigma)), clients=clients)
    kept = _claim(FedSMPRandK(FedSMPParams(keep_fraction=0.25, noise_multiplier=sigma, noise_support="kept")), clients=clients)
    assert dense.against("released").noise_multiplier == sigma
    assert kept.against("released").noise_multiplier == pytest.approx(sigma / math.sqrt(clients))
    assert kept.epsilon > 5 * dense.epsilon
    for defense in (FedSMPTopK(FedSMPParams(noise_support="kept")),
                    DPFedSAMTopK(DPFedSAMTopKParams(mask_stage="after_noise", topk_source="clean"))):
        claim = _claim(defense)
        assert not claim.is_private and not any(a.covered for a in claim.adversaries)
    noisy = _claim(DPFedSAMTopK(DPFedSAMTopKParams(mask_stage="after_noise", topk_source="noisy", noise_multiplier=sigma)),
                   clients=clients)
    assert noisy.against("released").noise_multiplier == pytest.approx(sigma / math.sqrt(clients))


def test_claims_round_trip_through_json():
    claim = _claim(DPFedAvg(DPFedAvgParams()))
    again = PrivacyClaim.from_dict(claim.as_dict())
    assert again == claim
    assert AdversaryClaim.not_covered("local", "why").as_dict()["epsilon"] is None
