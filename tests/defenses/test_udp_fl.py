"""UDP-FL (Feng et al. 2024: DP-SGD clients with harmonized mechanisms) and NbAFL (Wei et al. 2020): per-example
clipping, the shuffler, the federated plumbing and the claims."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from audit.core.errors import UserInputError
from defenses.base import AccountingSettings
from defenses.blocks.dp_sgd import clip_factors, per_example_gradients
from defenses.blocks.flat import ParamLayout, parameters_of
from defenses.blocks.local_training import client_batches
from defenses.fedavg import FedAvg
from defenses.federated.training_job import TrainingConfig
from defenses.nbafl import NbAFL, NbAFLParams, downlink_std, uplink_std
from defenses.udp_fl import UDPFL, UDPFLParams
from tests.defenses.test_blur_lus import _round_context


def _udp(**params) -> UDPFL:
    return UDPFL(UDPFLParams(**{"sample_rate": 0.2, **params}))


def test_per_example_clipping(digits_job):
    """Every clipped per-example gradient has norm ≤ C (ℓ2 or ℓ1)."""
    job = digits_job()
    model = job.model_factory()
    params = {n: p[None] for n, p in parameters_of(model).items()}
    x, y = job.pool_x[:12][None], job.pool_y[:12][None]
    gradients = per_example_gradients(model, params, x, y)
    for clip_norm, order in (("l2", 2), ("l1", 1)):
        factors = clip_factors(gradients, 0.05, clip_norm)
        flat = torch.cat([g.reshape(1, 12, -1) for g in gradients.values()], dim=2) * factors[..., None]
        assert (torch.linalg.vector_norm(flat, ord=order, dim=2) <= 0.05 * (1 + 1e-5)).all()
        assert (factors < 1).any()
    # per-example gradients are the gradients of each example alone
    single = torch.func.grad(lambda p: torch.nn.functional.cross_entropy(
        torch.func.functional_call(model, p, (x[0, 3:4],)), y[0, 3:4]))(parameters_of(model))
    for n in single:
        assert torch.allclose(gradients[n][0, 3], single[n], atol=1e-6)


def test_poisson_local_batches():
    defense = _udp(sample_rate=0.1)
    training = TrainingConfig(local_steps=2)
    batches = defense.local_batches(500, training, np.random.default_rng(0))
    assert len(batches) == 20 == defense.steps_per_round(training)
    sizes = np.array([len(b) for b in batches])
    assert abs(sizes.mean() - 50) < 4 * math.sqrt(500 * 0.1 * 0.9 / 20)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace", "staircase"])
def test_batched_and_loop_paths_agree(digits_job, mechanism):
    job = digits_job(rounds=2, local_steps=1, optimizer="adam", lr=0.01)
    defense = _udp(mechanism=mechanism, noise=2.0 if mechanism != "staircase" else 0.5, clip=0.5)
    batched = defense.train(job)
    looped = defense.train(replace(job, training=replace(job.training, engine="loop")))
    assert max(float((batched.final_params[k] - looped.final_params[k]).abs().max()) for k in batched.final_params) < 1e-4


def test_claims_say_where_the_paper_fails(digits_job):
    """The headline is the sound ε. Calibrated with the paper's 1-D accounting, Laplace's sound ε exceeds
    the target and the Staircase (ℓ2 clip) has no finite sound bound; calibrated soundly, the claim meets it."""
    job = digits_job(rounds=4, local_steps=1)
    accounting = AccountingSettings(conversion="classic")
    layout = ParamLayout.of(job.model_factory())
    gaussian = _udp(mechanism="gaussian").bind(layout).calibrate(3.0, 1e-5, job.training, 8, accounting)
    laplace = _udp(mechanism="laplace", accounting="paper_1d").bind(layout).calibrate(3.0, 1e-5, job.training, 8, accounting)
    staircase = _udp(mechanism="staircase", accounting="paper_1d").bind(layout).calibrate(3.0, 1e-5, job.training, 8,
                                                                                          accounting)
    claims = {name: d.privacy_claim(job.training, 8, 4, 1e-5, accounting)
              for name, d in (("gaussian", gaussian), ("laplace", laplace), ("staircase", staircase))}
    for claim in claims.values():
        assert claim.unit == "record" and claim.alternatives["paper_1d"] == pytest.approx(3.0, rel=1e-3)
    assert claims["gaussian"].epsilon == pytest.approx(3.0, rel=1e-3) and claims["gaussian"].epsilon <= 3.0
    assert claims["gaussian"].alternatives["sound"] == claims["gaussian"].alternatives["paper_1d"]
    assert "sound here" in claims["gaussian"].notes
    assert claims["laplace"].epsilon == claims["laplace"].alternatives["sound"] > 3.0
    assert "does NOT hold" in claims["laplace"].notes
    assert not claims["staircase"].is_private and "no finite bound" in claims["staircase"].notes
    assert not any(a.covered for a in claims["staircase"].adversaries)
    sound = _udp(mechanism="laplace").bind(layout).calibrate(3.0, 1e-5, job.training, 8, accounting)
    assert sound.params.accounting == "sound"  # the default
    assert sound.privacy_claim(job.training, 8, 4, 1e-5, accounting).epsilon <= 3.0
    assert sound.params.noise > laplace.params.noise, "a sound claim needs more noise"
    with pytest.raises(UserInputError, match="no finite sound bound"):
        _udp(mechanism="staircase").bind(layout).calibrate(3.0, 1e-5, job.training, 8, accounting)


def test_group_noise_is_keyed_by_everything_it_depends_on(digits_job):
    """The harmonized noise of a group depends on ε, δ, the conversion and the steps, not on ε alone."""
    job = digits_job(rounds=2, local_steps=1)
    defense = _udp(client_epsilons=[2.0, 4.0]).bind(ParamLayout.of(job.model_factory()))
    first = defense.group_mechanism(2.0, job.training, 1e-5, "improved")
    assert defense.group_mechanism(2.0, job.training, 1e-3, "improved").parameter < first.parameter  # larger δ: less noise
    assert defense.group_mechanism(2.0, replace(job.training, rounds=8), 1e-5, "improved").parameter > first.parameter
    assert defense.group_mechanism(2.0, job.training, 1e-5, "classic").parameter != first.parameter


def test_shuffling_leaves_the_model_unchanged_and_hides_identities(digits_job):
    """The shuffler (Feng et al. 2024, §4.4) permutes uploads (and their weights); FedAvg's result is unchanged."""
    from defenses.federated.training_job import RecordSpec

    job = replace(digits_job(rounds=2, local_steps=1, aggregation="weighted"), record=RecordSpec(upload_rounds="all"))
    plain = _udp(noise=1.0).train(job)
    shuffled = _udp(noise=1.0, shuffle=True).train(job)
    for n in plain.final_params:
        assert torch.allclose(plain.final_params[n], shuffled.final_params[n], atol=1e-6)
    assert any("/client_" in k for k in plain.server_view)
    assert not any("/client_" in k for k in shuffled.server_view) and any("/upload_" in k for k in shuffled.server_view)


def test_heterogeneous_epsilons(digits_job):
    job = digits_job(rounds=2, local_steps=1)
    defense = _udp(client_epsilons=[1.0, 8.0], penalty=0.05)
    outcome = defense.train(job)
    claim = outcome.claim
    assert claim.epsilon == pytest.approx(8.0, rel=1e-3) and "heterogeneous" in claim.notes
    bound = defense.bind(ParamLayout.of(job.model_factory()))
    conversion = job.accounting.conversion
    strict, loose = (bound.group_mechanism(1.0, job.training, job.delta, conversion),
                     bound.group_mechanism(8.0, job.training, job.delta, conversion))
    assert strict.parameter > loose.parameter  # more noise for the smaller ε
    with pytest.raises(UserInputError, match="client_epsilons"):
        defense.calibrate(2.0, 1e-5, job.training, 8, AccountingSettings())


def test_one_client_noiseless_fedavg_is_centralised_training(digits_job):
    """With one client and no noise, FedAvg after one round is plain SGD on that client's data."""
    job = digits_job(rounds=1, local_steps=2, lr=0.1, engine="loop")
    job = replace(job, clients=[job.clients[0]])
    outcome = FedAvg().train(job)
    torch.manual_seed(0)
    from audit.core.seeding import seed_torch
    from defenses.federated.engine import batch_stream

    seed_torch(job.seed, "torch")
    model = job.model_factory()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = client_batches(len(job.clients[0]), "epochs", 2, job.training.batch_size,
                             batch_stream(job.seed, 0, 0))
    for batch in batches:
        optimizer.zero_grad()
        index = torch.as_tensor(job.clients[0][batch])
        torch.nn.functional.cross_entropy(model(job.pool_x[index]), job.pool_y[index]).backward()
        optimizer.step()
    for n, p in model.named_parameters():
        assert torch.allclose(outcome.final_params[n], p.detach(), atol=1e-6)


def test_nbafl_noise_formulas_and_privatisation(digits_job):
    c = math.sqrt(2 * math.log(1.25 / 1e-5))
    assert uplink_std(10.0, 4.0, 1e-5, 3, 40) == pytest.approx(c * 3 * (2 * 10 / 40) / 4)
    assert downlink_std(10.0, 4.0, 1e-5, 3, 40, clients=8, rounds=3) == 0.0  # T ≤ L√N
    expected = 2 * c * 10 * math.sqrt(100 ** 2 - 5 ** 2 * 8) / (40 * 8 * 4)
    assert downlink_std(10.0, 4.0, 1e-5, 5, 40, clients=8, rounds=100) == pytest.approx(expected)
    job = digits_job(rounds=1)
    defense = NbAFL(NbAFLParams(clip=1.0, epsilon=50.0)).bind(ParamLayout.of(job.model_factory()))
    ctx, updates = _round_context(job, defense)
    uploads, diagnostics = defense.privatize(torch.zeros_like(updates), ctx)
    models = ctx.global_vector + uploads
    std = diagnostics["uplink_std"]
    assert std == pytest.approx(uplink_std(1.0, 50.0, job.delta, 1.0, min(len(c) for c in job.clients)))
    clean_norm = float(torch.linalg.vector_norm(ctx.global_vector))
    residual = (models.double() - ctx.global_vector.double() * min(1.0, 1.0 / clean_norm)).flatten().numpy()
    statistic = float((residual ** 2).sum() / std ** 2)
    assert stats.chi2.ppf(5e-4, residual.size) < statistic < stats.chi2.ppf(1 - 5e-4, residual.size)
    claim = defense.privacy_claim(job.training, 8, 1, job.delta, AccountingSettings(), ctx.state)
    # the sound headline: two clipped models differ by ≤ 2C, each upload carries σ_U, one round — the exact
    # Gaussian ε of μ = 2C/σ_U at δ (Balle & Wang 2018) is below it (RDP is an upper bound) and close to it
    from tests.defenses.privacy.test_claims import exact_gaussian_epsilon

    server = claim.against("server")
    exact = exact_gaussian_epsilon(2 * 1.0 / std, job.delta)
    assert claim.unit == "client" and claim.relation == "replace-one" and exact <= server.epsilon <= 1.5 * exact + 0.5
    assert server.noise_multiplier == pytest.approx(std / 2.0)
    # the released mean of all 8 uploads carries √8 times the noise of one (no downlink noise: T ≤ L√N)
    released = claim.against("released")
    assert released.noise_multiplier == pytest.approx(math.sqrt(8) * std / 2.0) and released.epsilon < server.epsilon
    assert claim.alternatives["paper_record_level"] == 50.0 and "rdp_given_sensitivity" in claim.alternatives
    assert "not proven" in claim.notes or "neither proven" in claim.notes
