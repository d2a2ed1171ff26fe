"""The privacy-loss distribution (PLD) accountant's grids: built as dp-accounting builds them,
refused before one too large for the machine is allocated.

dp-accounting discretises a mechanism's privacy loss on a grid of step Δ and composes T rounds
by FFT over the composed grid (Koskela, Jälkö, Honkela 2020). Both grids grow without bound — a
round's like 1/σ², the composed one with T — so :func:`pld_of` sizes them first and, where one is
too large, names the σ or the rounds that would fit instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import dp_accounting
    from dp_accounting.pld import common as pld_common
    from dp_accounting.pld import privacy_loss_distribution
else:  # imported when a PLD is first computed
    dp_accounting = lazy_module("dp_accounting")
    pld_common = lazy_module("dp_accounting.pld.common")
    privacy_loss_distribution = lazy_module("dp_accounting.pld.privacy_loss_distribution")


#: dp-accounting's PLD grid step (its PLDAccountant's default): ε is exact to about this much
PLD_DISCRETIZATION = 1e-4
#: the largest privacy-loss grids the PLD accountant is given, one round's and the composed one's:
#: building a round's grid costs about 4 µs a point, and composing T rounds is an FFT over the
#: composed grid (16 bytes a point, a few arrays of it): 4e6 and 2^25 points are about 15 s and 1.5 GB
PLD_MAX_ROUND_POINTS = 4_000_000
PLD_MAX_COMPOSED_POINTS = 1 << 25


def pld_round_points(noise_multiplier: float) -> float:
    """An upper estimate of the grid of one round's privacy loss in dp-accounting's PLD.

    The Gaussian mechanism's privacy loss at output x is (1 − 2x)/(2σ²) (sensitivity 1); the
    grid spans x over the mean ± z·σ, z ≈ 9.75 (dp-accounting keeps all but e^−50 of the mass),
    so (2z/σ + 1/σ²)/Δ points. Sampling only compresses the loss (log(1 − q + q·e^L) lies between
    log(1 − q) and L), so this bounds the sampled mechanism's grid too (measured: σ = 0.1, 0.5 give
    2.95e6 and 4.3e5 points, this 2.95e6 and 4.3e5)."""
    return (2 * 9.75 / noise_multiplier + 1 / noise_multiplier**2) / PLD_DISCRETIZATION


def pld_of(sigma: float, rate: float, steps: int) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of T = ``steps`` rounds of the Gaussian mechanism with noise multiplier ``sigma``,
    Poisson-sampled at ``rate`` (add/remove neighbours), built exactly as dp-accounting's
    PLDAccountant builds it (so ε is its ε to the last bit), but refused in one line before a
    grid too large for this machine is allocated: a small σ widens a round's grid like 1/σ², and
    T rounds widen the composed one (T = 10⁹ asked for 154 GiB)."""
    # every round samples everyone: T Gaussian rounds are one Gaussian of σ/√T (the accountant's shortcut)
    round_sigma = sigma / math.sqrt(steps) if rate >= 1 else sigma
    round_points = pld_round_points(round_sigma)
    if round_points > PLD_MAX_ROUND_POINTS:
        smallest = next(s for s in np.geomspace(1e-3, 1e3, 601) if pld_round_points(s) <= PLD_MAX_ROUND_POINTS)
        what = f"σ = {sigma:g}" + (f" over {steps} rounds (σ/√T = {round_sigma:.3g})" if round_sigma != sigma else "")
        raise UserInputError(f"noise: {what} needs a privacy-loss grid of about {round_points:.3g} points in the PLD "
                             f"accountant (at most {PLD_MAX_ROUND_POINTS:.0e}: minutes and gigabytes); allowed: "
                             f"{'σ/√T' if round_sigma != sigma else 'σ'} ≥ {smallest:.3g} with accountant 'pld', "
                             "any σ with accountant 'rdp'")
    identity = privacy_loss_distribution.identity(value_discretization_interval=PLD_DISCRETIZATION)
    if rate >= 1:
        return identity.compose(privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=round_sigma, value_discretization_interval=PLD_DISCRETIZATION,
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE))
    one_round = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, value_discretization_interval=PLD_DISCRETIZATION, sampling_prob=rate,
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    # the composed grid, as dp-accounting truncates it (a Chernoff bound on the tails it drops)
    points = max(_composed_points(pmf, steps) for pmf in _pmfs(one_round))
    if points > PLD_MAX_COMPOSED_POINTS:
        raise UserInputError(f"steps: {steps} rounds at σ = {sigma:g}, q = {rate:g} compose to a privacy-loss grid of "
                             f"{points:.3g} points in the PLD accountant (at most {PLD_MAX_COMPOSED_POINTS:.3g}: "
                             "gigabytes of memory); allowed: fewer rounds or more noise with accountant 'pld', or "
                             "accountant 'rdp'")
    return identity.compose(one_round.self_compose(steps))


def _pmfs(pld: privacy_loss_distribution.PrivacyLossDistribution) -> list:
    # dp-accounting keeps the two directions' PMFs as attributes without a public accessor
    return [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]


def _composed_points(pmf, steps: int) -> int:
    """Length of dp-accounting's grid for ``pmf`` composed ``steps`` times (its own truncation)."""
    probs = pmf.to_dense_pmf()._probs
    lower, upper = pld_common.compute_self_convolve_bounds(probs, steps, 1e-15)
    return max(upper - lower + 1, len(probs))
