"""The noise where the adversary looks: per coordinate of what each observer sees,
a χ² test of its variance against the noise the claim accounts for — for every registered defense
with a Gaussian claim — and the summed aggregate of the masked defenses, which falls short of the claim if
each client drops its noise outside its mask."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from attacks.mechanism_audits.conformance import probe_setup
from defenses.base import DEFENSES, AccountingSettings
from defenses.catalog import DEFENSES as REGISTERED
from defenses.dp_fedsam import DPFedSAMTopK, DPFedSAMTopKParams
from defenses.fed_smp import FedSMPParams, FedSMPRandK
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.engine import FederatedEngine
from defenses.federated.training_job import RoundContext, TrainingConfig

TRIALS = 150


#: the package's private defenses (other tests register deliberately broken ones, named test-*)
PRIVATE = [name for name in REGISTERED.names() if REGISTERED.get(name).private and not name.startswith("test-")]


@pytest.mark.parametrize("name", PRIVATE)
def test_per_coordinate_noise_of_each_view(name):
    """For coordinates j the target can move: the noise of the all-zero round along the target's effect on
    coordinate j, per unit of that effect, must have the variance σ² the claim accounts for —
    Σ_t r_t²/σ² ~ χ²_n. Each trial t runs the zero round and the round with the target's input on j with
    the same seed, so the effect is known exactly (masks and subsets included); trials where the target
    does not reach the view (a coordinate outside this round's random subset) carry no such test."""
    setup = probe_setup(seed=1)
    probe = DEFENSES.get(name)().audit_hooks().release_probe(setup.job)
    claim = probe.defense.privacy_claim(setup.training, len(setup.job.clients), 1, setup.delta, setup.accounting, probe.state)
    gaussian = [a for a in claim.adversaries if a.covered and a.noise_multiplier is not None]
    if not gaussian:
        pytest.skip(f"{name}: no Gaussian claim (pure ε-LDP per weight)")
    views = [a.adversary for a in gaussian]
    zeros = torch.zeros(probe.contributors, probe.dim, dtype=torch.float64)
    magnitude = 1e3 * max(1.0, probe.bound)
    seeds = [1000 + t for t in range(TRIALS)]
    base = [probe.views(zeros, seed) for seed in seeds]
    means = {v: np.mean([b[v].numpy() for b in base], axis=0) for v in views}
    # coordinates the target moves with a spread input, then a few of them
    spread = zeros.clone()
    spread[0] = magnitude / math.sqrt(probe.dim)
    reach = np.zeros(probe.dim, dtype=bool)
    for seed in seeds[:10]:
        moved = probe.views(spread, seed)[views[0]].numpy() - probe.views(zeros, seed)[views[0]].numpy()
        if len(moved) == probe.dim:
            reach |= moved != 0
    candidates = np.flatnonzero(reach) if reach.any() else np.arange(probe.dim)
    coordinates = np.random.default_rng(0).choice(candidates, size=min(6, len(candidates)), replace=False)
    level = 1e-3 / (len(coordinates) * len(views))
    for j in coordinates:
        target = zeros.clone()
        target[0, j] = magnitude
        ratios = {v: [] for v in views}
        for seed, zero in zip(seeds, base):
            moved = probe.views(target, seed)
            for entry in gaussian:
                v = entry.adversary
                effect = moved[v].numpy() - zero[v].numpy()
                if entry.relation == "replace-one":  # the neighbour is the negated input: twice the effect
                    effect = effect * 2.0
                norm = float(effect @ effect)
                if norm > 0:
                    ratios[v].append(float((zero[v].numpy() - means[v]) @ effect) / norm)
        for entry in gaussian:
            r = np.array(ratios[entry.adversary])
            if len(r) < 10:
                continue  # the target rarely reaches this coordinate (e.g. a 5 % random subset)
            statistic = float((r ** 2).sum() / entry.noise_multiplier ** 2)
            assert stats.chi2.ppf(level / 2, len(r)) < statistic < stats.chi2.ppf(1 - level / 2, len(r)), (
                name, entry.adversary, int(j), math.sqrt(statistic / len(r)) * entry.noise_multiplier)


def _summed_noise(defense, clip: float, rounds: int = 30) -> np.ndarray:
    """The measurement: the defense's own privatize on zero updates of 8 clients, the uploads
    summed (what secure aggregation reveals), per-coordinate variance over 30 rounds / (σC)²."""
    setup = probe_setup(seed=2)
    engine = FederatedEngine(defense, setup.job)
    state = engine.start()
    ctx: RoundContext = engine.context(0, np.arange(8), state.model, state.layout, state.global_vector, 0.1,
                                       state.defense_state)
    rows = []
    for t in range(rounds):
        uploads, _ = engine.defense.privatize(torch.zeros(8, state.layout.dim), replace(ctx, round=t))
        rows.append(uploads.double().sum(0).numpy())
    return np.var(np.stack(rows), axis=0, ddof=1) / (defense.params.noise_multiplier * clip) ** 2


@pytest.mark.parametrize("make", [
    lambda: FedSMPRandK(FedSMPParams(keep_fraction=0.25, noise_multiplier=1.0, clip=0.5)),
    lambda: DPFedSAMTopK(DPFedSAMTopKParams(topk_fraction=0.25, noise_multiplier=1.0, clip=0.5)),
])
def test_masked_defenses_sound_defaults_carry_the_claimed_noise(make):
    """With noise only on each client's kept coordinates the ratio was 0.250 (fed-smp-randk) and 0.245
    (dp-fedsam-topk); the sound defaults must give ≥ 1 within the test's tolerance (30 rounds × 1,210
    coordinates: the mean of the ratio has a standard error of about √(2/30)/√1210 ≈ 0.0074)."""
    ratio = _summed_noise(make(), 0.5)
    assert abs(float(ratio.mean()) - 1.0) < 0.03
    assert float(np.quantile(ratio, 0.01)) > stats.chi2.ppf(0.001, 30) / 30  # no coordinate much short of σC


def test_the_paper_variants_claim_what_their_noise_gives():
    """With noise on kept coordinates only, the sum carries ≈ p·(σC)² per coordinate; the claim is then
    accounted with σ/√m (here m = 8): (σ_claim·C)² = (σC)²/8 ≤ the measured variance."""
    defense = FedSMPRandK(FedSMPParams(keep_fraction=0.25, noise_multiplier=1.0, clip=0.5, noise_support="kept"))
    ratio = _summed_noise(defense, 0.5)
    assert abs(float(ratio.mean()) - 0.25) < 0.03
    claim = defense.privacy_claim(TrainingConfig(rounds=30), 8, 30, 1e-5, AccountingSettings())
    assert claim.against("released").noise_multiplier == pytest.approx(1 / math.sqrt(8))
    assert float(ratio.mean()) >= (1 / math.sqrt(8)) ** 2
    # DP-FedAvg itself: the sum carries σC on every coordinate
    assert abs(float(_summed_noise(DPFedAvg(DPFedAvgParams(noise_multiplier=1.0, clip=0.5)), 0.5).mean()) - 1.0) < 0.03
