"""Dirac canary clients through the defense's own code (defenses.federated.dirac_passage): the noise a
canary statistic measures is the noise the defense's dense code gives the real uploads — whatever
that code is, a user's rewrite of ``privatize`` included — and no noise comes from code of the
canaries' own. Expected values follow from the definitions: a canary adds its clipped value, ±S,
and nothing else, so the released step with canaries less their signal is the canary-free step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from defenses.blocks.dirac_rows import DiracRows
from defenses.fed_smp import FedSMPParams, FedSMPRandK, FedSMPTopK
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.engine import FederatedEngine, initial_vector
from defenses.federated.training_job import TrainingConfig, TrainingJob
from tests.defenses import broken_dp_fedavg as broken
from tests.defenses import broken_families as families

CLIP, SIGMA, DIM, CLIENTS = 0.5, 2.0, 210, 6


class _Noiseless(broken.UserWrittenHonest):
    """The user's rewrite without noise: what every fixture's release is without its noise."""

    def user_noise(self, ctx, std):
        return torch.zeros(len(ctx.participants), ctx.layout.dim)


def _job(canaries: DiracRows | None, seed: int = 4) -> TrainingJob:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 20, generator=generator), torch.randint(0, 10, (60,), generator=generator)
    training = TrainingConfig(rounds=1, local_steps=1, batch_size=5)
    return TrainingJob(lambda: torch.nn.Linear(20, 10), x, y, [np.arange(i, 60, CLIENTS) for i in range(CLIENTS)], x, y,
                       training, seed=seed, dirac_canaries=canaries)


def _canaries() -> DiracRows:
    """One canary per coordinate, ±1000·S raw (the clip must act), signs alternating."""
    signs = torch.where(torch.arange(DIM) % 2 == 0, 1.0, -1.0)
    return DiracRows(torch.arange(DIM), 1000.0 * CLIP * signs, DIM)


def _step(kind: type[DPFedAvg], canaries: DiracRows | None) -> tuple[torch.Tensor, list[dict]]:
    job = _job(canaries)
    outcome = FederatedEngine(kind(DPFedAvgParams(clip=CLIP, noise_multiplier=SIGMA)), job).run()
    _, layout, start = initial_vector(job.model_factory, job.seed)
    return (layout.flatten(outcome.final_params) - start).double(), outcome.metrics


FIXTURES = [broken.UserWrittenHonest, broken.UserHalvedNoise, broken.UserNoiseCancelledInPairs, broken.UserUniformNoise,
            broken.HalvedNoise, DPFedAvg]


@pytest.fixture(scope="module")
def noiseless() -> torch.Tensor:
    return _step(_Noiseless, None)[0]


@pytest.mark.parametrize("kind", FIXTURES, ids=lambda k: k.__name__)
def test_the_canaries_measure_the_noise_the_real_aggregate_carries(kind, noiseless):
    """Every coordinate carries a canary (all joined: q = 1). The released step less the canaries'
    signal (±S each, over the divisor the step shows) is the canary-free step, coordinate by
    coordinate: the canaries' statistic has exactly the real aggregate's noise — halved where the
    user's code halves it, cancelled where it cancels — and canary-only code contributes none."""
    free, _ = _step(kind, None)
    with_canaries, metrics = _step(kind, _canaries())
    divisor = metrics[0]["divisor"]
    assert divisor == pytest.approx(CLIENTS)  # |P_t|: the real clients, no canary
    assert "dirac_path" not in metrics[0]
    signal = CLIP * torch.where(torch.arange(DIM) % 2 == 0, 1.0, -1.0).double() / divisor
    canary_noise = (with_canaries - signal - noiseless) * divisor
    real_noise = (free - noiseless) * divisor
    assert torch.allclose(canary_noise, real_noise, rtol=0, atol=1e-5 * CLIP * SIGMA)


def test_the_noise_ratio_of_a_broken_rewrite_is_the_real_aggregates():
    """The probe of the canaries' path: the canary statistic's noise std over the honest rewrite's
    equals the real aggregate's ratio within 5 % (exactly, here) — ½ for halved noise, ≈ 0 for
    noise cancelled in pairs (an even number of participants)."""
    _, noiseless_metrics = _step(_Noiseless, _canaries())
    stds = {}
    for kind in (broken.UserWrittenHonest, broken.UserHalvedNoise, broken.UserNoiseCancelledInPairs):
        with_canaries, metrics = _step(kind, _canaries())
        free, _ = _step(kind, None)
        base, _ = _step(_Noiseless, _canaries())
        stds[kind.__name__] = (float((with_canaries - base).std()), float((free - _step(_Noiseless, None)[0]).std()))
    honest = stds["UserWrittenHonest"]
    for name, (canary, real) in stds.items():
        assert canary / honest[0] == pytest.approx(real / honest[1], rel=0.05, abs=1e-6), name
    assert stds["UserHalvedNoise"][0] / honest[0] == pytest.approx(0.5, rel=1e-3)
    assert stds["UserNoiseCancelledInPairs"][0] / honest[0] < 1e-5


def test_the_readings_of_each_upload_are_the_clipped_value_plus_one_uploads_noise():
    """A server that sees each upload reads ±S plus one upload's noise N(0, (σS)²/|P_t|), |P_t| the
    real clients: the residuals' variance lies in its 99.9 % χ² interval."""
    from scipy import stats

    outcome = FederatedEngine(DPFedAvg(DPFedAvgParams(clip=CLIP, noise_multiplier=SIGMA)), _job(_canaries())).run()
    readings = outcome.server_view["dirac/uploads"][0].double().numpy()
    signs = np.where(np.arange(DIM) % 2 == 0, 1.0, -1.0)
    residual = readings - signs * CLIP
    total, n = float(np.sum(residual ** 2)), len(residual)
    low, high = total / stats.chi2.ppf(0.9995, n), total / stats.chi2.ppf(0.0005, n)
    assert low <= (CLIP * SIGMA) ** 2 / CLIENTS <= high


def test_nbafl_canaries_are_models_clipped_by_its_own_code():
    """NbAFL clips the local *model* w_0 + Δ (Wei et al. 2020, Alg. 1): a canary's probe row is the
    update −w_0 plus its spike, so its model is the spike alone, clipped to ±C, and its upload
    reads ±C plus N(0, σ_U²) — the residuals' variance in its 99.9 % χ² interval around
    σ_U = c·L·(2C/m)/ε; the noise the run records is each reading less its clipped value."""
    from scipy import stats

    from defenses.nbafl import NbAFL, NbAFLParams, uplink_std

    job = _job(_canaries())
    clip = 0.5
    outcome = FederatedEngine(NbAFL(NbAFLParams(clip=clip, epsilon=50.0, downlink=False)), job).run()
    readings = outcome.server_view["dirac/uploads"][0].double().numpy()
    noise = outcome.server_view["dirac/noise"][0].double().numpy()
    signs = np.where(np.arange(DIM) % 2 == 0, 1.0, -1.0)
    assert np.allclose(readings - noise, signs * clip)
    std = uplink_std(clip, 50.0, job.delta, 1.0, 60 // CLIENTS)
    total, n = float(np.sum(noise ** 2)), len(noise)
    assert total / stats.chi2.ppf(0.9995, n) <= std ** 2 <= total / stats.chi2.ppf(0.0005, n)


def test_noise_the_audit_cannot_couple_is_reported_not_read_around():
    """Noise from a generator seeded from the clock cannot be reproduced for the spike and the zero
    row: the round says why, and the canaries' path is not read."""
    _, metrics = _step(broken.UserClockSeededNoise, _canaries())
    assert "differ between two computations of one round" in metrics[0]["dirac_path"]


def test_noise_from_the_global_generator_is_coupled_and_the_run_left_as_it_was():
    """User code drawing from torch's global generator: the probes seed it alike for the spike and
    the zero row (the clipped values are read), and restore it — the run's own draws are those of
    the same run without canaries' probes."""
    torch.manual_seed(7)
    free, _ = _step(broken.UserGlobalRandomNoise, None)
    after_free = torch.rand(3)
    torch.manual_seed(7)
    _, metrics = _step(broken.UserGlobalRandomNoise, _canaries())
    assert "dirac_path" not in metrics[0] and metrics[0]["divisor"] == pytest.approx(CLIENTS)
    assert "dirac_drift" in metrics[0]  # its release's noise is not reproducible: the real share stays in the readings
    assert torch.equal(torch.rand(3), after_free)


def test_a_skipped_clip_shows_as_the_raw_value():
    """A user's rewrite that forgets to clip: each canary contributes its raw ±1000·S."""

    class Unclipped(broken.UserWrittenHonest):
        def privatize(self, updates, ctx):
            return updates + self.user_noise(ctx, CLIP * SIGMA / len(updates) ** 0.5).to(updates), {}

    with_canaries, metrics = _step(Unclipped, _canaries())
    free, _ = _step(Unclipped, None)
    shift = (with_canaries - free) * metrics[0]["divisor"]
    assert torch.allclose(shift.abs(), torch.full((DIM,), 1000.0 * CLIP, dtype=torch.float64), rtol=1e-4)


# ---------------------------------------------------------------- each canary on its own probe row


def _shift(defense, canaries: DiracRows) -> tuple[torch.Tensor, list[dict]]:
    """What the canaries add to the released step, times its divisor: the canaries' signal."""
    outcome = [FederatedEngine(defense, _job(rows)).run() for rows in (canaries, None)]
    job = _job(None)
    _, layout, _ = initial_vector(job.model_factory, job.seed)
    steps = [layout.flatten(o.final_params).double() for o in outcome]
    return (steps[0] - steps[1]) * outcome[0].metrics[0]["divisor"], outcome[0].metrics


def test_a_bug_on_some_coordinates_of_a_tensor_reaches_exactly_those_canaries():
    """A user's clip that leaves every odd coordinate unclipped (noise honest): the canaries on odd
    coordinates contribute their raw ±1000·S, those on even ones ±S. One probe per tensor would
    have read one coordinate for all (each class here holds odd and even coordinates: the signs
    alternate in pairs); the rewrite is read canary by canary."""
    signs = torch.where(torch.arange(DIM) // 2 % 2 == 0, 1.0, -1.0)
    shift, metrics = _shift(families.UserClipSkipsOddCoordinates(DPFedAvgParams(clip=CLIP, noise_multiplier=SIGMA)),
                            DiracRows(torch.arange(DIM), 1000.0 * CLIP * signs, DIM))
    assert "dirac_path" not in metrics[0]
    expected = torch.where(torch.arange(DIM) % 2 == 1, 1000.0 * CLIP, CLIP).double()
    assert torch.allclose(shift.abs(), expected, rtol=1e-4)


def test_each_rand_k_canary_meets_a_mask_of_its_own():
    """Fed-SMP rand-k keeps each client's coordinate with probability k/d, from that client's own
    mask: each canary contributes ±S or nothing, and the kept share over the 210 canaries is a
    binomial draw around k/d = 0.4 (within 5 standard deviations) — not all or none, as a
    probe shared by every canary of a tensor would make it."""
    defense = FedSMPRandK(FedSMPParams(clip=CLIP, noise_multiplier=SIGMA, keep_fraction=0.4))
    shift, metrics = _shift(defense, _canaries())
    assert "dirac_path" not in metrics[0]
    kept = shift.abs() > CLIP / 2
    assert torch.allclose(shift[kept].abs(), torch.full((int(kept.sum()),), CLIP, dtype=torch.float64), rtol=1e-4)
    assert float(shift[~kept].abs().max()) < 1e-4 * CLIP
    k = defense.kept(DIM) / DIM
    assert abs(int(kept.sum()) - k * DIM) < 5 * (DIM * k * (1 - k)) ** 0.5


def test_one_probe_per_class_only_for_code_known_to_treat_the_class_alike():
    """The fast path (one probe per tensor and value) is taken for DP-FedAvg's own privatisation and
    the top-k sparsifiers, whose one-coordinate outputs do not depend on the coordinate; any
    override on the canaries' path, a random or data-dependent mask, or a mask chosen after the
    noise is read canary by canary."""
    from defenses.blur_lus import DPFedAvgBLUR, DPFedAvgLUS
    from defenses.dp_fedsam import DPFedSAM, DPFedSAMTopK, DPFedSAMTopKParams

    alike = {kind.__name__: kind().audit_hooks().dirac_canaries_alike()
             for kind in (DPFedAvg, DPFedAvgBLUR, DPFedSAM, FedSMPTopK, DPFedSAMTopK, DPFedAvgLUS, FedSMPRandK,
                          broken.UserWrittenHonest, broken.HalvedNoise, families.UserTopKHalvedNoise)}
    assert alike == {"DPFedAvg": True, "DPFedAvgBLUR": True, "DPFedSAM": True, "FedSMPTopK": True, "DPFedSAMTopK": True,
                     "DPFedAvgLUS": False, "FedSMPRandK": False, "UserWrittenHonest": False, "HalvedNoise": False,
                     "UserTopKHalvedNoise": False}
    after_noise = DPFedSAMTopK(DPFedSAMTopKParams(mask_stage="after_noise", topk_source="noisy"))
    assert not after_noise.audit_hooks().dirac_canaries_alike()


@pytest.mark.parametrize("clip_mode", ["flat", "per_tensor"])
def test_the_fast_path_reads_what_every_canary_would(clip_mode):
    """Where one probe per class is taken, it reads what a probe for every canary reads: the two
    passages of one round give every canary the same clipped value. (Their readings carry the
    noise of different zero rows: each is one upload's noise, not the same draw.)"""
    from defenses.federated.dirac_passage import dirac_passage

    defense = DPFedAvg(DPFedAvgParams(clip=CLIP, noise_multiplier=SIGMA, clip_mode=clip_mode))
    job = _job(_canaries())
    engine = FederatedEngine(defense, job)
    state = engine.start()
    ctx, _ = engine.begin_round(state, 0)
    updates = engine.local_updates(ctx)
    rows = _canaries()
    one, every = (dirac_passage(engine.defense, ctx, updates, rows, alike=alike) for alike in (True, False))
    assert one.anomaly is None and every.anomaly is None
    assert torch.allclose(one.signal.double(), every.signal.double(), rtol=1e-6, atol=0)
    assert float(one.signal.abs().min()) == pytest.approx(CLIP, rel=1e-6)
