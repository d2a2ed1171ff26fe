"""Record-level gradient canaries inside local DP-SGD: what a canary contributes is what DP-SGD's
per-example clip makes of it (Abadi et al. 2016, Alg. 1), it joins steps at the Poisson rate, its
statistic is the claimed mechanism's participation-hidden likelihood ratio, and a user's rewrite
of the step is exercised or named as not auditable."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from attacks.canaries.record_gradient_canaries import mixture_scores
from attacks.mechanism_audits.conformance import probe_setup
from defenses.blocks.dp_sgd import DPSGDObjective
from defenses.blocks.flat import ParamLayout
from defenses.blocks.local_training import LocalSchedule, OptimizerSettings, train_batched
from defenses.blocks.mechanisms import GaussianNoise, LaplaceNoise, StaircaseNoise
from defenses.blocks.record_gradient_canaries import ClaimedStep, GradientCanaryLog, GradientCanaryPlan
from defenses.federated.engine import FederatedEngine
from defenses.federated.training_job import TrainingConfig
from defenses.udp_fl import UDPFL, UDPFLObjective


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _plan(dim: int, count: int, width: int, rate: float, inserted: np.ndarray | None = None, seed: int = 0):
    rng = np.random.default_rng(seed)
    coords = rng.permutation(dim)[:count * width].reshape(count, width)
    signs = rng.choice([-1.0, 1.0], size=coords.shape)
    inserted = np.ones(count, dtype=bool) if inserted is None else inserted
    return GradientCanaryPlan(coords, signs, np.zeros(count, dtype=np.int64), inserted, 10.0, rate, seed)


def _released(plan: GradientCanaryPlan, clip: float, clip_norm: str, steps: int, batch: float = 5.0,
              noise: float = 1e-9) -> np.ndarray:
    """Readings [steps, K, b] of one client that holds no real example in its batches, with noise
    ``noise``·C (Gaussian): the canaries' own clipped values."""
    model = _Tiny()
    layout = ParamLayout.of(model)
    objective = DPSGDObjective(clip, clip_norm, lambda c: GaussianNoise(noise), lambda c: batch, seed=1)
    log = GradientCanaryLog(plan, layout, clip)
    objective.gradient_canaries = log
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    schedule = LocalSchedule.build([[np.array([], dtype=np.int64)] * steps], [np.array([0])], np.array([0]))
    pool_x, pool_y = torch.zeros(1, 3), torch.zeros(1, dtype=torch.long)
    train_batched(model, objective, params, schedule, pool_x, pool_y, OptimizerSettings(lr=0.0))
    return log.readings()


@pytest.mark.parametrize("clip_norm, width, value", [("l2", 1, 1.0), ("l1", 1, 1.0), ("l2", 4, 0.5), ("l1", 4, 0.25)])
def test_a_canary_that_joins_reads_its_clipped_value(clip_norm, width, value):
    """A raw gradient of norm 10·C spread as ±10C/√b over b coordinates is clipped to norm C: ±C/√b
    each under ℓ2, ±C/b under ℓ1 (its ℓ1 norm is 10C·√b). In units of the clipped sum, the reading is
    that value with the canary's sign — the clip acted (a skipped clip would read ten times more)."""
    plan = _plan(ParamLayout.of(_Tiny()).dim, 5, width, rate=1.0)
    readings = _released(plan, clip=0.7, clip_norm=clip_norm, steps=3)
    assert readings.shape == (3, 5, width)
    np.testing.assert_allclose(readings * plan.signs[None], value, atol=1e-5)


def test_held_out_canaries_never_join_and_inserted_ones_join_at_rate_q():
    count, steps, q = 8, 400, 0.3
    inserted = np.arange(count) % 2 == 0
    plan = _plan(ParamLayout.of(_Tiny()).dim, count, 1, rate=q, inserted=inserted)
    joined = np.abs(_released(plan, clip=1.0, clip_norm="l2", steps=steps)[:, :, 0]) > 0.5
    assert not joined[:, ~inserted].any()
    hits = int(joined[:, inserted].sum())
    trials = steps * int(inserted.sum())
    # two-sided binomial test at 1e-4 of the rate q (each join an independent draw)
    assert stats.binomtest(hits, trials, q).pvalue > 1e-4


def test_the_statistic_is_the_claimed_mechanisms_likelihood_ratio_mixture():
    """Gaussian σ: log f(z − 1) − log f(z) = z/σ² − 1/(2σ²); Laplace λ: (|z| − |z − 1|)/λ. Per step
    the hidden-participation mixture log(1 − q + q·e^ℓ); steps the holder did not take (NaN) add 0."""
    rng = np.random.default_rng(3)
    z = rng.normal(size=(6, 5, 1))
    z[2, 1, 0] = np.nan
    signs = rng.choice([-1.0, 1.0], size=(5, 1))
    q = 0.2
    readings = z * signs[None]
    for mechanism, ratio in ((GaussianNoise(1.7), lambda v: v / 1.7**2 - 1 / (2 * 1.7**2)),
                             (LaplaceNoise(0.8), lambda v: (np.abs(v) - np.abs(v - 1)) / 0.8)):
        expected = np.nansum(np.log(1 - q + q * np.exp(ratio(z[:, :, 0]))), axis=0)
        got = mixture_scores(readings, signs, ClaimedStep(mechanism, q, "l2", 6), 1)
        np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_width_adds_the_coordinates_ratios():
    """b coordinates: ℓ_t is the sum of the b one-coordinate ratios at the clipped value a = 1/b (ℓ1)."""
    rng = np.random.default_rng(4)
    z = rng.laplace(size=(3, 2, 4))
    step = ClaimedStep(StaircaseNoise(2.0), 1.0, "l1", 3)
    expected = sum((step.mechanism.log_density(z[..., i] - 0.25) - step.mechanism.log_density(z[..., i])) for i in range(4))
    np.testing.assert_allclose(mixture_scores(z, np.ones((2, 4)), step, 4), expected.sum(axis=0), rtol=1e-10)


# --------------------------------------------------------------------------- through UDP-FL's engine


class _TenthNoise(UDPFLObjective):  # a user's bug: the noise drawn at a tenth of its scale
    def noise(self, client, shapes, device):
        return {n: 0.1 * t for n, t in super().noise(client, shapes, device).items()}


class _NoClip(UDPFLObjective):  # a user's rewrite of the step that sums per-example gradients unclipped
    def batched_gradient(self, model, params, anchor, x, y, mask):
        from defenses.blocks.dp_sgd import per_example_gradients

        gradients = per_example_gradients(model, params, x, y)
        summed = {n: (g * mask.view(*mask.shape, *([1] * (g.dim() - 2)))).sum(1) for n, g in gradients.items()}
        return self.noisy_gradient(summed, params)


def _udp_fl(objective: type[UDPFLObjective] | None):
    class Rewritten(UDPFL):
        def local_objective(self):
            return objective(self) if objective is not None else super().local_objective()

    return Rewritten(UDPFL.Params(mechanism="laplace", clip_norm="l1", noise=0.7, sample_rate=0.25, clip=1.0))


def _engine_run(objective: type[UDPFLObjective] | None):
    setup = probe_setup(0, clients=2)
    job = replace(setup.job, training=replace(setup.job.training, rounds=2, local_unit="epochs", local_steps=1))
    dim = ParamLayout.of(job.model_factory()).dim
    count = 300
    rng = np.random.default_rng(5)
    coords = np.concatenate([rng.permutation(dim)[:count // 2] for _ in range(2)])[:, None]
    plan = GradientCanaryPlan(coords, rng.choice([-1.0, 1.0], size=(count, 1)), np.repeat([0, 1], count // 2),
                              rng.random(count) < 0.5, 10.0, 0.25, 9)
    outcome = FederatedEngine(_udp_fl(objective), replace(job, gradient_canaries=plan)).run()
    return plan, outcome


def test_a_users_lowered_noise_shows_in_the_readings():
    """Held-out canaries' readings are the step's own Laplace noise (scale λ = 0.7 in units of C, so
    a mean |z| of 0.7), plus the real records' clipped sum, taken out: the honest step shows λ, the
    user's rewrite that draws a tenth of it shows 0.07."""
    for objective, scale in ((None, 0.7), (_TenthNoise, 0.07)):
        plan, outcome = _engine_run(objective)
        readings = outcome.server_view["gradient/readings"].numpy()[:, ~plan.inserted, 0]
        assert readings.shape[0] == 2 * 4  # two rounds of ⌈1/q⌉ = 4 steps
        assert np.mean(np.abs(readings)) == pytest.approx(scale, rel=0.1)
        assert not any(row.get("gradient_path") for row in outcome.metrics)


def test_a_step_that_bypasses_the_clip_is_named_not_audited():
    plan, outcome = _engine_run(_NoClip)
    paths = [row.get("gradient_path") for row in outcome.metrics]
    assert paths[0] and "cannot be audited" in paths[0]


def test_a_defense_without_a_claimed_step_is_not_applicable():
    from attacks.canaries.record_gradient_canaries import RecordGradientCanaries
    from defenses.fedavg import DPFedAvg

    audit = RecordGradientCanaries()
    assert "no local DP-SGD step" in audit.not_applicable(DPFedAvg())
    assert audit.not_applicable(_udp_fl(None)) is None
    step = _udp_fl(None).audit_hooks().claimed_step(TrainingConfig(rounds=3, local_unit="epochs", local_steps=2))
    assert (step.rate, step.clip_norm, step.steps_per_round) == (0.25, "l1", 8)  # ⌈E/q⌉ = ⌈2/0.25⌉
    assert math.isfinite(step.mechanism.parameter)


def test_the_chance_an_inserted_canary_joins_no_step():
    """(1 − p + p·(1 − q)^S)^R: in each of R rounds its holder takes part with probability p and then
    takes S steps, each joined with probability q."""
    step = ClaimedStep(GaussianNoise(1.0), 0.1, "l2", 20)
    assert step.never_joins(1, 1.0) == pytest.approx(0.9**20)
    assert step.never_joins(3, 0.5) == pytest.approx((0.5 + 0.5 * 0.9**20) ** 3)


def test_an_alternative_figure_is_judged_under_its_own_name():
    """``against: paper_1d`` holds the released view to the claim's labelled alternative (UDP-FL's
    one-dimensional accounting) with the headline's δ and relation; a name the claim lacks is a
    one-line error naming the figures it has."""
    from attacks.canaries.record_gradient_canaries import judged_claim
    from audit.core.errors import UserInputError
    from defenses.privacy.accounting import AccountingSettings

    defense = UDPFL(UDPFL.Params(mechanism="laplace", noise=2.0, sample_rate=0.1)).bind(ParamLayout.of(_Tiny()))
    claim = defense.privacy_claim(TrainingConfig(rounds=2, local_unit="epochs", local_steps=1), 4, 2, 1e-5,
                                  AccountingSettings())
    headline = judged_claim(claim, "")
    judged = judged_claim(claim, "paper_1d")
    assert judged.epsilon == claim.alternatives["paper_1d"] < headline.epsilon == claim.alternatives["sound"]
    assert (judged.delta, judged.relation, judged.unit) == (headline.delta, headline.relation, headline.unit)
    assert "paper_1d" in judged.accountant
    with pytest.raises(UserInputError, match="allowed: paper_1d, sound"):
        judged_claim(claim, "exact")


# --------------------------------------------------------------------------- end to end

PLUGIN = '''
from defenses.udp_fl import UDPFL, UDPFLObjective


class TenthNoise(UDPFLObjective):
    def noise(self, client, shapes, device):
        return {n: 0.1 * t for n, t in super().noise(client, shapes, device).items()}


class TenthNoiseUDPFL(UDPFL):
    def local_objective(self):
        return TenthNoise(self)


class NoClip(UDPFLObjective):  # sums the per-example gradients without clipping them
    def batched_gradient(self, model, params, anchor, x, y, mask):
        from defenses.blocks.dp_sgd import per_example_gradients

        gradients = per_example_gradients(model, params, x, y)
        summed = {n: (g * mask.view(*mask.shape, *([1] * (g.dim() - 2)))).sum(1) for n, g in gradients.items()}
        return self.noisy_gradient(summed, params)


class NoClipUDPFL(UDPFL):
    def local_objective(self):
        return NoClip(self)
'''


def _audit(tmp_path, rounds: int) -> dict:
    import json

    from audit.cli import main
    from tests.helpers import tiny_config

    (tmp_path / "broken.py").write_text(PLUGIN, encoding="utf-8")
    params = {"mechanism": "laplace", "clip_norm": "l1", "clip": 1.0, "sample_rate": 0.25}
    (tmp_path / "design.yaml").write_text(tiny_config(
        dataset={"name": "digits", "max_pool": 80, "max_test": 40},
        model={"name": "mlp", "options": {"hidden": [16]}},
        training={"rounds": rounds, "local_unit": "epochs", "local_steps": 1, "lr": 0.05},
        defenses=[{"name": "udp-fl", "label": "honest", "epsilons": [2], "params": dict(params)},
                  {"name": f"{tmp_path / 'broken.py'}:TenthNoiseUDPFL", "label": "tenth", "epsilons": [2],
                   "params": dict(params)},
                  {"name": f"{tmp_path / 'broken.py'}:NoClipUDPFL", "label": "unclipped", "epsilons": [2],
                   "params": dict(params)}],
        diagnostics={"enabled": False},
        attacks=[{"name": "record-gradient-canaries", "params": {"coins": 2400, "per_run": 2400}}]), encoding="utf-8")
    assert main(["run", str(tmp_path / "design.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) in (0, 1)
    return {e["label"].split(" (")[0]: e for e in json.loads((tmp_path / "out" / "results.json").read_text())["experiments"]}


def test_end_to_end_a_tenth_of_the_noise_is_a_violation_and_the_honest_step_is_not(tmp_path):
    """Five rounds of ⌈1/q⌉ = 4 steps: an inserted canary joins none with probability 0.75²⁰ ≈ 0.3 %.
    The honest step's bounds stay below the claim and, the power model not describing subsampled
    steps, are inconclusive — never consistent; the user's tenth-noise rewrite is a VIOLATION."""
    experiments = _audit(tmp_path, rounds=5)
    honest = [v for a in experiments["honest"]["attacks"] for v in a["verdicts"] if v["kind"] == "lower_bound"]
    assert honest and all(v["status"] == "inconclusive" and "no power is stated" in v["text"] for v in honest)
    tenth = [v for a in experiments["tenth"]["attacks"] for v in a["verdicts"] if v["kind"] == "lower_bound"]
    assert any(v["status"] == "violation" for v in tenth)
    # the same counts against the accounted mechanism's own composed curve (ℓ1-clipped Laplace): held
    # to that mechanism's exact ε, and no weaker evidence than the (ε, δ) curve's
    curves = {label: next(a for a in experiments[label]["attacks"] if a["attack"].endswith("mechanism-curve"))
              for label in ("honest", "tenth")}
    (honest_curve,), (tenth_curve,) = curves["honest"]["verdicts"], curves["tenth"]["verdicts"]
    assert honest_curve["status"] == "inconclusive" and honest_curve["claimed"] < 2.0
    assert tenth_curve["status"] == "violation"
    assert tenth_curve["p_value"] <= min(v["p_value"] for v in tenth if v.get("p_value") is not None)
    # a user's step that bypasses the clip cannot be audited by these canaries: the result says so,
    # reads no statistic, and the experiment is never called consistent on code the audit did not meet
    unclipped = experiments["unclipped"]
    (record,) = [a for a in unclipped["attacks"] if a["attack"].startswith("record-gradient-canaries")]
    assert "not exercised" in record["notes"] and "no other path is audited" in record["notes"]
    assert {v["status"] for v in record["verdicts"]} <= {"no measurement"}
    assert unclipped["soundness"] == "no measurement"


def test_a_design_whose_canaries_may_join_no_step_is_refused():
    """Two rounds of ⌈1/q⌉ = 4 steps at q = 0.25: 0.75⁸ ≈ 10 % of inserted canaries would join no
    step — coins no observer can see, which the stated power would not count; five rounds: 0.3 %."""
    from attacks.canaries.record_gradient_canaries import RecordGradientCanaries

    audit, defense = RecordGradientCanaries(), _udp_fl(None)
    reason = audit.refused(defense, TrainingConfig(rounds=2, local_unit="epochs", local_steps=1))
    assert reason and "probability 10.0%" in reason and "allowed: at most 1%" in reason
    assert audit.refused(defense, TrainingConfig(rounds=5, local_unit="epochs", local_steps=1)) is None
