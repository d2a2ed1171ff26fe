"""LDP-FL (Sun et al. 2021): the two-point mechanism (Eq. 2, Alg. 2), ranges, split-and-shuffle (Alg. 3) and the
claim."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from attacks.mechanism_audits.mechanism_audit import audit_two_point
from audit.core.errors import UserInputError
from defenses.base import AccountingSettings
from defenses.blocks.flat import ParamLayout
from defenses.blocks.ldp import (
    perturb,
    probability_up,
    shuffle_amplification,
    two_point,
    two_point_magnitude,
)
from defenses.federated.training_job import RecordSpec, TrainingConfig
from defenses.ldp_fl import LDPFL, LDPFLParams, split_and_shuffle
from defenses.privacy.claims import ADVERSARIES
from tests.defenses.test_blur_lus import _round_context


def _draws(w: float, n: int, eps: float = 1.0, c: float = 0.0, r: float = 1.0, seed: int = 0) -> torch.Tensor:
    return two_point(torch.full((n,), w, dtype=torch.float64), c, r, eps, torch.Generator().manual_seed(seed))


def test_reference_magnitudes():
    # A(ε) = (e^ε + 1)/(e^ε − 1) (Sun et al. 2021, Eq. 2), printed to five or six significant figures
    for eps, value, tolerance in ((0.1, 20.017, 5e-4), (0.5, 4.0830, 5e-5), (1, 2.16395, 5e-6), (4, 1.03732, 1e-5),
                                  (5, 1.01357, 5e-6), (10, 1.00009, 5e-6)):
        assert two_point_magnitude(eps) == pytest.approx(value, abs=tolerance)
    assert 0.075 * two_point_magnitude(1.0) == pytest.approx(0.16230, abs=1e-5)  # the MNIST example


@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_two_values_never_inside_and_distance_bounds(eps):
    """Outputs are c ± rA, outside (c − r, c + r); 2r/(e^ε−1) ≤ |M(w)−w| ≤ 2re^ε/(e^ε−1)."""
    c, r = 0.3, 0.5
    w = torch.linspace(c - r, c + r, 101, dtype=torch.float64).repeat(50)
    out = two_point(w, c, r, eps, torch.Generator().manual_seed(1))
    a = two_point_magnitude(eps)
    assert set(np.round(out.unique().numpy(), 12)) <= {round(c - r * a, 12), round(c + r * a, 12)}
    assert bool(((out - c).abs() >= r).all())
    distance = (out - w).abs()
    assert bool((distance >= 2 * r / math.expm1(eps) - 1e-12).all())
    assert bool((distance <= 2 * r * math.exp(eps) / math.expm1(eps) + 1e-12).all())


def test_probability_up():
    """P(c + rA): ½ at c, e^ε/(e^ε+1) at c + r, bounded, extreme ratio exactly e^ε (Sun et al. 2021, Thm 1)."""
    eps = 1.3
    p = probability_up(torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64), 0.0, 1.0, eps).numpy()
    assert p[1] == pytest.approx(0.5) and p[2] == pytest.approx(math.exp(eps) / (math.exp(eps) + 1))
    assert p[0] == pytest.approx(1 / (math.exp(eps) + 1)) and p[2] / p[0] == pytest.approx(math.exp(eps))


@pytest.mark.parametrize("w", [-1.0, 0.0, 1.0, 0.37])
def test_unbiased_with_the_stated_variance(w):
    """Unbiased (Sun et al. 2021, Lemma 2): |mean − w| ≤ 4·√(Var/N); the empirical variance matches
    r²A² − (w−c)² (Eq. 6) within 3 %."""
    n, eps = 200_000, 1.0
    out = _draws(w, n, eps)
    variance = two_point_magnitude(eps) ** 2 - w ** 2
    assert abs(float(out.mean()) - w) <= 4 * math.sqrt(variance / n)
    assert float(out.var()) == pytest.approx(variance, rel=0.03)


def test_k_client_mean_variance_eq7_and_eq8():
    """Eq. 7: Var(mean of k) = r²A²/k − Σ(w_u−c)²/k², inside [r²A²/k − r²/k, r²A²/k] (Eq. 8)."""
    eps, k, trials = 2.0, 20, 20_000
    weights = torch.linspace(-1, 1, k, dtype=torch.float64)
    generator = torch.Generator().manual_seed(3)
    means = two_point(weights.repeat(trials, 1), 0.0, 1.0, eps, generator).mean(1)
    a2 = two_point_magnitude(eps) ** 2
    expected = a2 / k - float((weights ** 2).sum()) / k ** 2
    assert a2 / k - 1 / k <= expected <= a2 / k
    assert float(means.var()) == pytest.approx(expected, rel=0.05)


def test_duchi_equivalence_and_clipping():
    """With a shared uniform draw M(w; c, r) = c + r·Duchi((w − c)/r). An out-of-range input
    is clipped first, so M(c + 5r) is distributed exactly as M(c + r) — c + rA with probability
    e^ε/(1 + e^ε), not always (always would break the e^ε ratio)."""
    c, r, eps = 0.2, 0.5, 1.0
    w = torch.tensor([0.0, 0.3, 0.6], dtype=torch.float64)
    general = two_point(w, c, r, eps, torch.Generator().manual_seed(7))
    duchi = c + r * two_point((w - c) / r, 0.0, 1.0, eps, torch.Generator().manual_seed(7))
    assert torch.allclose(general, duchi)
    assert torch.allclose(perturb("duchi", torch.zeros(4), 9.0, 9.0, 1.0, torch.Generator().manual_seed(0)).abs(),
                          torch.full((4,), 2.163953, dtype=torch.float64), atol=1e-6)
    far = two_point(torch.full((1000,), c + 5 * r, dtype=torch.float64), c, r, eps, torch.Generator().manual_seed(2))
    edge = two_point(torch.full((1000,), c + r, dtype=torch.float64), c, r, eps, torch.Generator().manual_seed(2))
    assert torch.equal(far, edge)


def test_split_and_shuffle_keeps_every_mean():
    """Split and shuffle (Sun et al. 2021, Alg. 3): the per-id mean is unchanged; each id keeps its k values (k·d
    items in all)."""
    reports = torch.randn(7, 50, generator=torch.Generator().manual_seed(0))
    shuffled = split_and_shuffle(reports, torch.Generator().manual_seed(1))
    assert torch.allclose(shuffled.mean(0), reports.mean(0))
    assert torch.equal(torch.sort(shuffled, dim=0).values, torch.sort(reports, dim=0).values)
    assert not torch.equal(shuffled, reports)


def test_unlinked_view_has_no_identities_and_two_values_per_id(digits_job):
    """The unlinked view holds no client ids; with a fixed range each id shows at most 2 values."""
    job = replace(digits_job(rounds=1), record=RecordSpec(upload_rounds="all"))
    defense = LDPFL(LDPFLParams(epsilon=1.0, radius=0.5))
    outcome = defense.train(job)
    keys = list(outcome.server_view)
    assert not any("/client_" in k for k in keys) and any("/upload_" in k for k in keys)
    stacked = torch.stack([v for k, v in outcome.server_view.items() if "/upload_" in k])
    start = _initial_vector(job)
    reports = stacked + start  # the reported weights themselves
    for column in range(0, reports.shape[1], 97):
        assert len(torch.unique(torch.round(reports[:, column].double(), decimals=5))) <= 2
    linked = LDPFL(LDPFLParams(epsilon=1.0, radius=0.5, server_view="linked")).train(job)
    assert any("/client_" in k for k in linked.server_view)


def _initial_vector(job):
    from audit.core.seeding import seed_torch
    from defenses.blocks.flat import parameters_of

    seed_torch(job.seed, "torch")
    model = job.model_factory()
    return ParamLayout.of(model).flatten(parameters_of(model))


def test_adaptive_ranges(digits_job):
    """Adaptive ranges: c = 0, r = max − min covers [min, max] when min ≤ 0 ≤ max; global_prev and secure_minmax
    give every client of a round the same range; local ranges differ between clients."""
    job = digits_job()
    defense = LDPFL(LDPFLParams(range_mode="adaptive"))
    ctx, updates = _round_context(job, defense)
    models = ctx.global_vector[None, :].double() + updates.double()
    for source in ("global_prev", "secure_minmax", "local"):
        chosen = LDPFL(LDPFLParams(range_mode="adaptive", range_source=source))
        ranges = chosen._ranges(models, ctx)
        for (c, r), part in zip(ranges, ctx.layout.slices().values()):
            if source == "local":
                assert len(torch.unique(r)) > 1
                continue
            assert len(torch.unique(r)) == 1 and len(torch.unique(c)) == 1
            values = (ctx.global_vector[part] if source == "global_prev" else models[:, part]).double()
            low, high = float(values.min()), float(values.max())
            if low <= 0 <= high:
                assert float(c[0] - r[0]) <= low and high <= float(c[0] + r[0])


def test_claim_linked_figures_and_amplification(digits_job):
    """Linked per round = d·ε; the shuffle-amplification bound of Feldman, McMillan & Talwar 2021 is inapplicable
    at k = 100, δ = 1e-5."""
    layout = ParamLayout(("w",), ((21_840,),))
    defense = LDPFL(LDPFLParams(epsilon=1.0), layout)
    claim = defense.privacy_claim(TrainingConfig(rounds=10, client_rate=1.0), 100, 10, 1e-5, AccountingSettings())
    assert claim.unit == "weight" and claim.epsilon == 1.0 and claim.delta == 0.0
    assert claim.alternatives["linked_per_round"] == 21_840 and claim.alternatives["linked_total"] == 218_400
    assert "inapplicable" in claim.notes and shuffle_amplification(1.0, 100, 1e-5) is None
    wide = LDPFL(LDPFLParams(epsilon=0.5), layout).privacy_claim(TrainingConfig(rounds=10), 500, 10, 1e-5, AccountingSettings())
    assert wide.alternatives["shuffled_per_id_round"] == pytest.approx(0.344, abs=0.001)
    leaky = LDPFL(LDPFLParams(range_mode="adaptive", range_source="local"), layout).privacy_claim(
        TrainingConfig(), 10, 5, 1e-5, AccountingSettings())
    assert "range_leak" in leaky.notes and "unsafe" in leaky.notes


def test_same_seed_same_reports(digits_job):
    """The same seed gives the same perturbed weights and the same accuracy."""
    job = digits_job(rounds=2)
    first, second = LDPFL(LDPFLParams(epsilon=2.0)).train(job), LDPFL(LDPFLParams(epsilon=2.0)).train(job)
    assert all(torch.equal(first.final_params[n], second.final_params[n]) for n in first.final_params)
    assert first.metrics[-1]["test_accuracy"] == second.metrics[-1]["test_accuracy"]


def test_two_point_audit_is_tight_and_never_above_the_claim():
    """The two-point mechanism's audit is tight: ε = 1, N = 200000 gives a lower bound in (0.8, 1.0]."""
    result = audit_two_point(1.0, 200_000, seed=0)
    assert 0.8 < result["epsilon_lower_bound"] <= 1.0 and not result["violation"]
    for seed in (1, 2):
        assert audit_two_point(3.0, 50_000, seed=seed)["epsilon_lower_bound"] <= 3.0


def test_a_constant_tensor_keeps_its_value_under_an_adaptive_range(digits_job):
    """A tensor whose global values are all equal (max = min) has no width: the report must stay centred on
    its value (unbiased: the mean of many reports is the value), not wipe it to c = 0 or freeze it."""
    job = digits_job()
    defense = LDPFL(LDPFLParams(range_mode="adaptive", epsilon=2.0, radius=0.05))
    ctx, updates = _round_context(job, defense)
    bias = ctx.layout.slices()[ctx.layout.names[1]]
    ctx = replace(ctx, global_vector=ctx.global_vector.clone())
    ctx.global_vector[bias] = 0.3  # a constant tensor, e.g. a freshly initialised norm layer
    ranges = defense._ranges(ctx.global_vector[None, :].double().expand(len(ctx.participants), -1), ctx)
    c, r = ranges[1]
    assert torch.allclose(c, torch.full_like(c, 0.3)) and torch.allclose(r, torch.full_like(r, 0.05))
    reports = []
    for t in range(200):
        ctx = replace(ctx, round=t)
        uploads, _ = defense.with_params(server_view="linked").privatize(torch.zeros_like(updates), ctx)
        reports.append((ctx.global_vector[bias] + uploads[:, bias]).double())
    mean = torch.stack(reports).mean()
    spread = 0.05 * two_point_magnitude(2.0) / math.sqrt(200 * len(ctx.participants) * (bias.stop - bias.start))
    assert abs(float(mean) - 0.3) < 5 * spread


@pytest.mark.parametrize("source", ["secure_minmax", "local"])
def test_a_data_dependent_range_makes_no_finite_claim(digits_job, source):
    """Every two-point report is c ± rA, so |report − c| = rA reveals r exactly. With r computed from the
    clients' trained models, a neighbour whose one client's model differs (here: scaled by 2, which widens
    the range) moves every report's support: the two output distributions are disjoint, and no finite ε
    holds for any observer of a report. The claim says so (∞, every observer not covered), keeping the
    paper's per-weight ε as a labelled alternative, and refuses to be calibrated to an ε."""
    job = digits_job()
    defense = LDPFL(LDPFLParams(epsilon=1.0, range_mode="adaptive", range_source=source))
    ctx, updates = _round_context(job, defense)
    models = ctx.global_vector[None, :].double() + updates.double()
    neighbour = models.clone()
    neighbour[0] = 2 * neighbour[0]
    part = ctx.layout.slices()[ctx.layout.names[0]]
    magnitude = two_point_magnitude(1.0)
    # whose reports: under secure_minmax another client's (1), whose own data did not change; under
    # local the changed client's own (0), since each range is its owner's
    who = 0 if source == "local" else 1
    supports = []
    for rows in (models, neighbour):
        c, r = defense._ranges(rows, ctx)[0]
        reports = perturb("two_point", rows[who, part], c[who], r[who], 1.0, torch.Generator().manual_seed(0))
        assert torch.allclose((reports - c[who]).abs(), r[who] * magnitude)
        supports.append({round(float(c[who] + sign * r[who] * magnitude), 9) for sign in (-1, 1)})
    assert not supports[0] & supports[1]

    claim = defense.bind(ctx.layout).privacy_claim(job.training, len(job.clients), 3, 1e-5, AccountingSettings())
    assert math.isinf(claim.epsilon) and not claim.is_private and claim.unit == "weight"
    assert {a.adversary for a in claim.adversaries} == set(ADVERSARIES) and not any(a.covered for a in claim.adversaries)
    assert all("released without noise" in a.notes for a in claim.adversaries)
    assert claim.alternatives["paper_per_weight"] == 1.0 and "range_leak" in claim.notes
    with pytest.raises(UserInputError, match="no finite claim"):
        defense.calibrate(1.0, 1e-5, job.training, len(job.clients), AccountingSettings())
    # a public range (fixed, or the received global model's) keeps the per-weight ε for every observer
    for public in (LDPFLParams(epsilon=1.0), LDPFLParams(epsilon=1.0, range_mode="adaptive")):
        claim = LDPFL(public, ctx.layout).privacy_claim(job.training, len(job.clients), 3, 1e-5, AccountingSettings())
        assert claim.epsilon == 1.0 and all(a.covered and a.epsilon == 1.0 for a in claim.adversaries)


@pytest.mark.parametrize("source,width", [("global_prev", 1e-6), ("secure_minmax", 1e-9)])
def test_a_near_constant_tensor_is_reported_without_bias(digits_job, source, width):
    """A tensor of width ≪ its value (all weights ≈ 0.5) under center zero: the paper's r = max − min would
    clip it to ±width and its average would collapse to ≈ 0. M is unbiased for an input inside
    [c − r, c + r] (E[M(w)] = w, Sun et al. 2021, Eq. 4), so with a range that holds the tensor the
    decoded average of R rounds of k clients' reports is the tensor's mean w̄ within 5 standard errors,
    √(Σ Var/N²) with Var = r²A² − (w − c)² per report. The width is the smallest each source can carry:
    the float32 global model near 0.5 (global_prev), the clients' float64 models (secure_minmax)."""
    job = digits_job()
    eps, rounds = 2.0, 100
    defense = LDPFL(LDPFLParams(range_mode="adaptive", adaptive_center="zero", range_source=source, epsilon=eps))
    ctx, updates = _round_context(job, defense)
    bias = ctx.layout.slices()[ctx.layout.names[1]]
    size = bias.stop - bias.start
    spread = torch.linspace(0, 1, size, dtype=torch.float64)
    ctx = replace(ctx, global_vector=ctx.global_vector.clone())
    updates = torch.zeros_like(updates)
    if source == "global_prev":
        ctx.global_vector[bias] = (0.5 + width * spread).float()
    else:  # the clients' models differ from 0.5 by at most the width
        ctx.global_vector[bias] = 0.5
        updates[:, bias] = (width * spread).float()
    models = ctx.global_vector[None, :].double() + updates.double()
    values = models[:, bias]
    assert 0 < float(values.max() - values.min()) <= 1.5 * width
    c, r = defense._ranges(models, ctx)[1]
    assert bool((c - r <= values.min()).all()) and bool((values.max() <= c + r).all()), "the range holds the tensor"
    averages = []
    for t in range(rounds):
        ctx = replace(ctx, round=t)
        uploads, _ = defense.privatize(updates, ctx)
        averages.append(ctx.global_vector[bias].double() + defense.aggregate(uploads, ctx)[bias].double())
    decoded = float(torch.stack(averages).mean())
    count = rounds * len(ctx.participants) * size
    inside = torch.minimum(torch.maximum(values, (c - r)[:, None]), (c + r)[:, None])  # the values, given the range holds them
    variance = float((r[:, None] ** 2 * two_point_magnitude(eps) ** 2 - (inside - c[:, None]) ** 2).mean())
    assert abs(decoded - float(values.mean())) <= 5 * math.sqrt(variance / count)
