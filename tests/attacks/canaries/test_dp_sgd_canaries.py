"""Dirac gradient canaries inside Opacus's DPOptimizer (attacks.canaries.dp_sgd_canaries): the canary goes
through Opacus's own clipping, noise and scaling, leaves everything else as Opacus computes it,
and joins the steps at the sampling rate."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from attacks.canaries.dp_sgd_canaries import CanaryPlan, GradientCanaryHook, canaries_per_run, plan_run
from audit.core.errors import UserInputError

pytest.importorskip("opacus")
# the linear model's input needs no gradient; Opacus's per-example hooks do not need one either
pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.usefixtures("one_torch_thread")]  # tiny models: one thread is the fastest

BATCH, CLIP = 4, 0.5



def _optimizer(sigma: float, noise_seed: int = 7):
    """A linear model 4 → 3 (15 coordinates: 12 weights, then 3 biases) under Opacus's DPOptimizer,
    learning rate 0 so that every step sees the same model and p.grad stays readable."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(torch.linspace(-1, 1, 12).view(3, 4))
        model.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        module = GradSampleModule(model)
        optimizer = DPOptimizer(torch.optim.SGD(module.parameters(), lr=0.0), noise_multiplier=sigma, max_grad_norm=CLIP,
                                expected_batch_size=BATCH, generator=torch.Generator().manual_seed(noise_seed))
    return module, optimizer


def _steps(sigma: float, hook: GradientCanaryHook | None, steps: int = 1) -> torch.Tensor:
    """``steps`` DP-SGD steps on a fixed batch; the last released gradient, flat."""
    module, optimizer = _optimizer(sigma)
    if hook is not None:
        hook.attach(optimizer)
    x = torch.linspace(-2, 2, BATCH * 4).view(BATCH, 4)
    y = torch.tensor([0, 1, 2, 1])
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
    return torch.cat([p.grad.reshape(-1) for p in optimizer.params]).double()


def _one(coordinate: int, sign: float, inserted: bool) -> CanaryPlan:
    return CanaryPlan(np.array([coordinate]), np.array([sign]), np.array([inserted]))


@pytest.mark.parametrize("coordinate, sign", [(5, -1.0), (13, 1.0)])  # a weight, a bias
def test_a_canary_of_ten_clip_norms_shifts_the_released_gradient_by_one_clip_norm(coordinate, sign):
    """DP-SGD (Abadi et al. 2016, Alg. 1) releases (Σ_i clip_C(g_i) + N(0, σ²C²))/B. A per-example
    gradient s·10C·e_j that went through the clip adds s·C/B at j and nothing elsewhere — same noise
    (same generator seed) in both runs, so the difference is exact; unclipped it would add 10·C/B.
    Its standardised reading, s·ĝ[j]·B/(σC), moves by exactly 1/σ."""
    sigma = 2.0
    joined = GradientCanaryHook(1.0, plan=_one(coordinate, sign, True), amplitude=10.0)
    absent = GradientCanaryHook(1.0, plan=_one(coordinate, sign, False), amplitude=10.0)
    with_canary, without = _steps(sigma, joined), _steps(sigma, absent)
    difference = (with_canary - without).numpy()
    expected = sign * CLIP / BATCH  # the clipped canary, divided by Opacus's expected batch size
    assert difference[coordinate] == pytest.approx(expected, rel=1e-5)
    assert abs(difference[coordinate]) < 2 * CLIP / BATCH  # not 10·C/B: the canary was clipped
    assert np.abs(np.delete(difference, coordinate)).max() < 1e-7  # the records' gradients untouched
    shift = joined.standardised(sigma)[0, 0] - absent.standardised(sigma)[0, 0]
    assert shift == pytest.approx(1 / sigma, rel=1e-5)
    assert joined.joined[0].tolist() == [True] and absent.joined[0].tolist() == [False]


def test_a_held_out_canary_leaves_opacus_bit_identical():
    """No row joins, so clipping, the noise stream and the scaling are Opacus's alone."""
    plain = _steps(1.0, None, steps=3)
    held_out = _steps(1.0, GradientCanaryHook(1.0, plan=_one(3, 1.0, False)), steps=3)
    assert torch.equal(plain, held_out)


def test_inserted_canaries_join_each_step_at_the_sampling_rate():
    rate, steps = 0.25, 200
    plan = CanaryPlan(np.arange(10), np.ones(10), np.arange(10) < 5)
    hook = GradientCanaryHook(rate, plan=plan, seed=3)
    _steps(1.0, hook, steps=steps)
    joined = np.stack(hook.joined)  # [steps, canaries]
    assert joined.shape == (steps, 10) and hook.steps == steps
    assert not joined[:, 5:].any()  # held out: absent (add/remove), never sampled
    share, se = joined[:, :5].mean(), np.sqrt(rate * (1 - rate) / (steps * 5))
    assert abs(share - rate) < 4 * se


def test_plans_are_distinct_coordinates_keyed_by_seed_and_run():
    assert canaries_per_run(10_000, 4810) == (3, 3334)
    assert canaries_per_run(100, 4810) == (1, 100)
    first, again, other = plan_run(4810, 3334, 0, 1), plan_run(4810, 3334, 0, 1), plan_run(4810, 3334, 0, 2)
    assert len(np.unique(first.coords)) == 3334 and first.coords.max() < 4810
    assert np.array_equal(first.coords, again.coords) and np.array_equal(first.inserted, again.inserted)
    assert not np.array_equal(first.coords, other.coords)
    assert 0.45 < first.inserted.mean() < 0.55 and set(np.unique(first.signs)) == {-1.0, 1.0}


def test_bad_input_is_one_line_naming_the_field():
    with pytest.raises(UserInputError, match="sample_rate"):
        GradientCanaryHook(0.0, coins=10)
    with pytest.raises(UserInputError, match="amplitude"):
        GradientCanaryHook(0.5, coins=10, amplitude=0.5)
    with pytest.raises(UserInputError, match="attach: needs opacus.optimizers.DPOptimizer"):
        GradientCanaryHook(0.5, coins=10).attach(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
    with pytest.raises(ValueError, match="distinct"):
        CanaryPlan(np.array([1, 1]), np.ones(2), np.ones(2, dtype=bool))
