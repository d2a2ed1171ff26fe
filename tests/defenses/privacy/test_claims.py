"""Claims name their observer and neighbouring relation, and each figure follows from the noise that
reaches that observer: amplification by subsampling (Balle, Barthe & Gaboardi 2018) holds only against an
observer who does not know who was sampled."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from audit.core.errors import UserInputError
from defenses.base import DEFENSES, AccountingSettings
from defenses.blocks.flat import ParamLayout
from defenses.dp_fedsam import DPFedSAMTopK, DPFedSAMTopKParams
from defenses.fed_smp import FedSMPParams, FedSMPRandK, FedSMPTopK
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.training_job import RoundContext, TrainingConfig
from defenses.fl_basic import FLBasicDP, FLBasicDPParams
from defenses.fl_cs import FLCSDP, FLCSDPParams
from defenses.fl_std import FLStdDP, FLStdDPParams
from defenses.fl_top import FLTopDP, FLTopDPParams
from defenses.privacy.accounting import GaussianSchedule, compute_epsilon
from defenses.privacy.claims import (
    HONEST_SAMPLING,
    AdversaryClaim,
    PrivacyClaim,
    known_participation_epsilon,
    participation_bound,
)

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


def _released_statistic(defense, rows: torch.Tensor, clients: int, training: TrainingConfig) -> torch.Tensor:
    """What the released models are computed from, for uploads ``rows`` of participants 0..len−1."""
    ctx = RoundContext(0, np.arange(len(rows)), np.ones(len(rows), dtype=np.int64), clients, training, 0, "cpu",
                       global_vector=torch.zeros(rows.shape[1]))
    return defense.audit_hooks().release_statistic(rows, ctx)


LAYOUT = ParamLayout(("w", "b"), ((40, 10), (10,)))


@pytest.mark.parametrize("defense", [
    DPFedAvg(DPFedAvgParams(noise_multiplier=1.2), LAYOUT),
    DPFedAvg(DPFedAvgParams(noise_multiplier=1.2, denominator="expected"), LAYOUT),
    FLTopDP(FLTopDPParams(noise_multiplier=1.2), LAYOUT),
    FLBasicDP(FLBasicDPParams(noise_multiplier=1.2), LAYOUT),
    FLStdDP(FLStdDPParams(noise_multiplier=1.2), LAYOUT),
    FLCSDP(FLCSDPParams(noise_multiplier=1.2), LAYOUT),
], ids=lambda d: f"{d.name}-{getattr(d.params, 'denominator', 'realized')}")
def test_the_relation_follows_the_divisor_the_code_uses(defense):
    """The relation is read off the released statistic itself: append one participant whose upload is
    zero. An add-remove neighbour differs from the other by such a participant (present or absent); a
    zero-out neighbour has it in both. If the statistic changes, the divisor is the realised |P_t| and
    the Gaussian analysis (noise on the sum, the divisor public) covers only zero-out neighbours
    (Kairouz et al. 2021, §2): the claim must say zero-out, with the ε of the same sampled Gaussian
    (the sum moves by ≤ S either way). With a public divisor (qN) it may say add-remove."""
    clients, training = 20, TrainingConfig(rounds=30, client_rate=0.2)
    rows = torch.ones(3, 5, dtype=torch.float64)
    with_zero = torch.cat([rows, torch.zeros(1, 5, dtype=torch.float64)])
    realised = not torch.allclose(_released_statistic(defense, rows, clients, training),
                                  _released_statistic(defense, with_zero, clients, training))
    assert realised == (getattr(defense.params, "denominator", "realized") == "realized")
    claim = defense.privacy_claim(training, clients, 30, 1e-5, ACCOUNTING)
    released = claim.against("released")
    assert claim.relation == released.relation == ("zero-out" if realised else "add-remove")
    assert claim.against("server").relation == "zero-out"
    assert ("realized number of participants" in claim.notes) == realised
    sampled = compute_epsilon(GaussianSchedule(1.2, 0.2, 30 + getattr(defense, "extra_rounds", 0), "poisson", clients), 1e-5)
    assert released.epsilon == pytest.approx(sampled.epsilon, rel=1e-12)


def test_fixed_size_rounds_keep_replace_one_in_the_fl_family():
    """Under fixed-size sampling |P_t| = m every round: the divisor is public and the released figure stays
    replace-one (σ/2 per change of 2S), as for DP-FedAvg."""
    claim = FLTopDP(FLTopDPParams(noise_multiplier=2.0), LAYOUT).privacy_claim(
        TrainingConfig(rounds=30, client_rate=0.25, sampling="fixed"), 20, 30, 1e-5, ACCOUNTING)
    assert claim.relation == "replace-one" and claim.against("released").noise_multiplier == 1.0
    assert "realized number of participants" not in claim.notes


def test_every_server_figure_states_the_honest_sampling_it_assumes():
    """The server picks the participants: each registered defense's covered server figure says that it
    assumes honest sampling, in the one shared wording, under every sampling the defense accepts."""
    import defenses.catalog  # noqa: F401  (registers every defense)

    layout = ParamLayout(("w", "b"), ((64, 10), (10,)))
    trainings = (TrainingConfig(rounds=30), TrainingConfig(rounds=30, client_rate=0.2),
                 TrainingConfig(rounds=30, sampling="fixed", clients_per_round=5))
    checked = set()
    for name in DEFENSES.names():
        defense = DEFENSES.get(name)(None, layout)
        for training in trainings:
            try:
                defense.validate(training, 20)
            except UserInputError:
                continue
            server = defense.privacy_claim(training, 20, 30, 1e-5, ACCOUNTING).against("server")
            if server is not None and server.covered:
                assert server.notes.endswith(HONEST_SAMPLING) and server.notes.count(HONEST_SAMPLING) == 1, (name, training)
                checked.add(name)
    assert {"dp-fedavg", "fl-top-dp", "fl-basic-dp", "fl-std-dp", "fl-cs-dp", "ddgauss", "nbafl", "ae-dpfl", "udp-fl",
            "ldp-fl"} <= checked
