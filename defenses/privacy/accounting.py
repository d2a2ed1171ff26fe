"""Privacy accounting for the (subsampled) Gaussian mechanism composed over rounds.

Every DP defense whose rounds are Gaussian mechanisms — DP-FedAvg (McMahan et al. 2018,
"Learning Differentially Private Recurrent Language Models", Alg. 1) and the defenses built on
it — is accounted here, on top of Google's ``dp-accounting``:

* ``rdp``: Rényi DP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019, integer and
  fractional orders), composed additively over rounds (Mironov 2017, Prop. 1), then converted
  to (ε, δ) with one of two conversions:

  - ``classic``: ε = min_α [T·RDP(α) + log(1/δ)/(α−1)] (Mironov 2017, Prop. 3; the moments
    accountant tail bound of Abadi et al. 2016, as Cheng et al. 2022 and Kerkouche et al. 2021 use);
  - ``improved``: ε = min_α [T·RDP(α) + log(1 − 1/α) − log(δ·α)/(α−1)] (Balle et al. 2020,
    Prop. 12; dp-accounting's ``compute_epsilon`` and opacus's default).

* ``pld``: the privacy-loss distribution accountant of dp-accounting (Poisson sampling only;
  its grids are sized first, :mod:`defenses.privacy.pld_grid`).

The inverse, :func:`calibrate_noise`, finds the least σ whose ε meets a target (the search
itself is :mod:`defenses.privacy.calibration`). Mechanisms dp-accounting lacks are amplified by the
general subsampling bounds of :mod:`defenses.privacy.subsampled_rdp` and converted here
(:func:`rdp_to_epsilon`).

All arithmetic is float64 (numpy). Every ε we print carries :func:`accountant_label`, which
names the accountant, the conversion and the dp-accounting version, because the same
mechanism gives visibly different ε under different conversions (e.g. 7.329 vs 8.074 at
σ=1.5, q=0.04, T=2250, δ=1e-5).

Sampling schemes and neighbouring relations (the unit — a client or a record — is whatever
the sampled items are):

* ``poisson``: each item joins a round independently with probability q; add/remove-one
  neighbours; sensitivity of the sum of clipped contributions is S, so the per-round
  mechanism is the sampled Gaussian with noise multiplier σ (noise std of the sum / S).
* ``fixed``: exactly m of N items per round without replacement; dp-accounting analyses this
  only under replace-one neighbours (Wang, Balle, Kasiviswanathan 2019), where one item's
  clipped contribution can change the sum by up to 2S, so the effective multiplier is σ/2.
  When m = N (everybody every round) there is no sampling and the round is the plain
  Gaussian mechanism under add/remove.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Relation
from defenses.privacy.calibration import smallest_noise
from defenses.privacy.pld_grid import pld_of

if TYPE_CHECKING:
    import dp_accounting
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant
else:  # imported when an ε is first computed: `list`, `config` and `check` name defenses without it
    dp_accounting = lazy_module("dp_accounting")
    dp_event = lazy_module("dp_accounting.dp_event")
    rdp_privacy_accountant = lazy_module("dp_accounting.rdp.rdp_privacy_accountant")

ACCOUNTANTS = ("rdp", "pld")
CONVERSIONS = ("improved", "classic")
SAMPLINGS = ("poisson", "fixed")

#: dp-accounting's default orders, ``rdp_privacy_accountant.DEFAULT_RDP_ORDERS``: 1.1..10.9 (step
#: 0.1), 11..63, 128, 256, 512, 1024 (written out so that naming a defense needs no dp-accounting;
#: tests/defenses/privacy/test_accounting.py checks they are the library's)
DEFAULT_ORDERS: tuple[float, ...] = tuple(float(a) for a in [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64))
                                          + [128, 256, 512, 1024])
#: our neighbouring relations by dp-accounting's names for them (the two it analyses): the one place they meet
NEIGHBORING_RELATIONS = {Relation.ADD_REMOVE: "ADD_OR_REMOVE_ONE", Relation.REPLACE_ONE: "REPLACE_ONE"}


def neighboring_relation(relation: Relation) -> dp_accounting.NeighboringRelation:
    """dp-accounting's ``NeighboringRelation`` for our ``relation``."""
    return getattr(dp_accounting.NeighboringRelation, NEIGHBORING_RELATIONS[relation])


@contextlib.contextmanager
def quiet_absl() -> Iterator[None]:
    """Silence dp-accounting's absl warnings (e.g. about extreme orders) inside the block."""
    logger = logging.getLogger("absl")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def dp_accounting_version() -> str:
    try:
        return metadata.version("dp-accounting")
    except metadata.PackageNotFoundError:  # pragma: no cover - installed as a dependency
        return "unknown"


def accountant_label(accountant: str, conversion: str) -> str:
    """The name printed beside every ε: accountant, conversion and library version."""
    if accountant == "pld":
        return f"pld (dp-accounting {dp_accounting_version()})"
    return f"rdp-{conversion} (dp-accounting {dp_accounting_version()})"


def _check_choice(value: str, allowed: Sequence[str], field: str) -> None:
    if value not in allowed:
        raise UserInputError(f"{field}: '{value}' is not allowed; allowed: {', '.join(allowed)}")


#: how :meth:`GaussianSchedule.describe` names a continuous Gaussian accounted every round, without
#: sampling or Poisson-subsampled: the mechanisms whose own composed curve an audit can test
CONTINUOUS_GAUSSIAN = ("Gaussian mechanism", "Poisson-subsampled Gaussian")


@dataclass(frozen=True)
class GaussianSchedule:
    """T rounds of a Gaussian mechanism with noise multiplier σ on a sampled set of items.

    ``sampling_rate`` is q for Poisson sampling and m/N for fixed-size sampling; ``population``
    (N) is needed for fixed-size sampling only.
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int
    sampling: str = "poisson"
    population: int | None = None

    def __post_init__(self) -> None:
        _check_choice(self.sampling, SAMPLINGS, "sampling")
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise UserInputError(f"noise: must be a finite number > 0, got {self.noise_multiplier}")
        if not 0 < self.sampling_rate <= 1:
            raise UserInputError(f"rate: must lie in (0, 1], got {self.sampling_rate}")
        if self.steps < 0:
            raise UserInputError(f"steps: must be >= 0, got {self.steps}")
        if self.sampling == "fixed" and self.sampling_rate < 1 and (self.population is None or self.population < 1):
            raise UserInputError("population: fixed-size sampling needs the number of items N")

    def with_noise(self, noise_multiplier: float) -> GaussianSchedule:
        return GaussianSchedule(noise_multiplier, self.sampling_rate, self.steps, self.sampling, self.population)

    def with_steps(self, steps: int) -> GaussianSchedule:
        return GaussianSchedule(self.noise_multiplier, self.sampling_rate, steps, self.sampling, self.population)

    @property
    def relation(self) -> Relation:
        """The relation the schedule is analysed under: replace-one for fixed-size sampling, else add/remove."""
        return Relation.REPLACE_ONE if self.sampling == "fixed" and self.sampling_rate < 1 else Relation.ADD_REMOVE

    @property
    def neighboring_relation(self) -> dp_accounting.NeighboringRelation:
        return neighboring_relation(self.relation)

    def round_event(self) -> dp_event.DpEvent:
        """The DpEvent of one round."""
        if self.sampling_rate >= 1:
            return dp_event.GaussianDpEvent(self.noise_multiplier)
        if self.sampling == "poisson":
            return dp_event.PoissonSampledDpEvent(
                self.sampling_rate, dp_event.GaussianDpEvent(self.noise_multiplier)
            )
        population = int(self.population)  # type: ignore[arg-type]
        sample_size = int(round(self.sampling_rate * population))
        # Replace-one neighbours: one item's clipped contribution moves the sum by up to 2S.
        return dp_event.SampledWithoutReplacementDpEvent(
            population, sample_size, dp_event.GaussianDpEvent(self.noise_multiplier / 2.0)
        )

    def describe(self) -> str:
        if self.sampling_rate >= 1:
            return f"{CONTINUOUS_GAUSSIAN[0]}, σ={self.noise_multiplier:.6g}, every item every round, T={self.steps}"
        if self.sampling == "poisson":
            return (f"{CONTINUOUS_GAUSSIAN[1]}, σ={self.noise_multiplier:.6g}, q={self.sampling_rate:.6g}, "
                    f"T={self.steps}, add/remove neighbours")
        return (f"Gaussian on a fixed-size sample without replacement, σ={self.noise_multiplier:.6g}, "
                f"m/N={self.sampling_rate:.6g}, N={self.population}, T={self.steps}, replace-one neighbours "
                f"(sensitivity 2S)")


def rdp_per_round(schedule: GaussianSchedule, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of one round at each order (float64), from dp-accounting."""
    accountant = rdp_privacy_accountant.RdpAccountant(list(orders), schedule.neighboring_relation)
    with quiet_absl():
        accountant.compose(schedule.round_event(), 1)
    return np.asarray(accountant.rdp, dtype=np.float64)


def rdp_to_epsilon(
    orders: Sequence[float], rdp: Sequence[float], delta: float, conversion: str = "improved"
) -> tuple[float, float]:
    """Convert an RDP curve to (ε, optimal order) at ``delta``.

    ``classic``: ε = min_α [RDP(α) + log(1/δ)/(α−1)] (Mironov 2017, Prop. 3).
    ``improved``: dp-accounting's conversion (Balle et al. 2020, Prop. 12).
    """
    _check_choice(conversion, CONVERSIONS, "conversion")
    if not 0 < delta < 1:
        raise UserInputError(f"delta: must lie in (0, 1), got {delta}")
    orders_arr = np.asarray(orders, dtype=np.float64)
    rdp_arr = np.asarray(rdp, dtype=np.float64)
    if conversion == "improved":
        with quiet_absl():
            eps, order = rdp_privacy_accountant.compute_epsilon(orders_arr, rdp_arr, delta)
        return float(eps), float(order)
    usable = orders_arr > 1
    candidates = np.full_like(rdp_arr, np.inf)
    candidates[usable] = rdp_arr[usable] + math.log(1.0 / delta) / (orders_arr[usable] - 1.0)
    best = int(np.argmin(candidates))
    return max(0.0, float(candidates[best])), float(orders_arr[best])


@dataclass(frozen=True)
class EpsilonReport:
    epsilon: float
    delta: float
    accountant: str
    conversion: str | None
    optimal_order: float | None
    label: str

    def as_dict(self) -> dict:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "conversion": self.conversion,
            "optimal_order": self.optimal_order,
            "label": self.label,
        }


@dataclass(frozen=True)
class AccountingSettings:
    """Which accountant and RDP→(ε, δ) conversion a run's claim uses (config section ``accounting``)."""

    accountant: str = "rdp"
    conversion: str = "improved"


def compute_epsilon(
    schedule: GaussianSchedule,
    delta: float,
    accountant: str = "rdp",
    conversion: str = "improved",
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> EpsilonReport:
    """ε at ``delta`` after ``schedule.steps`` rounds."""
    _check_choice(accountant, ACCOUNTANTS, "accountant")
    if not 0 < delta < 1:
        raise UserInputError(f"delta: must lie in (0, 1), got {delta}")
    if schedule.steps == 0:
        return EpsilonReport(0.0, delta, accountant, conversion if accountant == "rdp" else None, None,
                             accountant_label(accountant, conversion))
    if accountant == "rdp":
        eps, order = rdp_to_epsilon(orders, schedule.steps * rdp_per_round(schedule, orders), delta, conversion)
        return EpsilonReport(eps, delta, "rdp", conversion, order, accountant_label("rdp", conversion))
    if schedule.relation != Relation.ADD_REMOVE:
        raise UserInputError("accountant: 'pld' supports Poisson sampling only; use accountant 'rdp' for fixed-size sampling")
    with quiet_absl():
        composed = pld_of(schedule.noise_multiplier, schedule.sampling_rate, schedule.steps)
        eps = float(composed.get_epsilon_for_delta(delta))
    return EpsilonReport(eps, delta, "pld", None, None, accountant_label("pld", conversion))


def epsilon_trajectory(
    schedule: GaussianSchedule,
    delta: float,
    conversion: str = "improved",
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> np.ndarray:
    """RDP ε after each of the rounds 1..T (one RDP evaluation, T conversions)."""
    per_round = rdp_per_round(schedule, orders)
    return np.array(
        [rdp_to_epsilon(orders, t * per_round, delta, conversion)[0] for t in range(1, schedule.steps + 1)],
        dtype=np.float64,
    )


def calibrate_noise(
    target_epsilon: float,
    schedule: GaussianSchedule,
    delta: float,
    accountant: str = "rdp",
    conversion: str = "improved",
    relative_tolerance: float = 1e-4,
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> float:
    """The smallest noise multiplier (to ``relative_tolerance``) whose ε does not exceed the target.

    A bracket [lo, hi] with ε(lo) > target ≥ ε(hi), narrowed by :func:`smallest_noise`; the
    returned σ is always the upper end, so the calibrated mechanism never overshoots the target
    ε. ε is non-increasing in σ for every accountant here, which is what the bracket needs.
    ``schedule.noise_multiplier`` is ignored.

    Speed: with RDP, each step evaluates only a window of orders — the 17 around the previous
    optimum, and every integer order among the fractional ones; when the optimum lands on the edge
    of the 17 (or on an integer outside them) they move there until the optimum is inside them. The minimum over a
    subset of orders is never below the minimum over all of them, so a σ accepted on a window also
    meets the target with every order (soundness). Those integers are always in the window because
    ε is *not* unimodal in the order: dp-accounting bounds fractional orders by a looser series
    than integer ones, so ε dips at every integer order, and a window of fractional orders around
    one integer's dip missed a lower one (σ 0.5 % too large at ε = 9.5, q = 0.5, T = 264).
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise UserInputError(f"target-epsilon: must be a finite number > 0, got {target_epsilon}")
    if schedule.steps == 0:
        raise UserInputError("steps: calibration needs at least one round")
    all_orders = np.asarray(orders, dtype=np.float64)
    last = len(all_orders) - 1
    # the integer orders among fractional ones (2..10 in dp-accounting's grid); above, every order is an integer
    fractional = [order for order in all_orders if not float(order).is_integer()]
    integers = {i for i, order in enumerate(all_orders)
                if float(order).is_integer() and fractional and order < max(fractional)}
    window: list[int] = []  # the 17 orders around the last optimum

    def around(index: int) -> list[int]:
        return list(range(max(0, index - 8), min(last, index + 8) + 1))

    def rdp_report(sigma: float, subset: list[int]) -> tuple[EpsilonReport, int]:
        """ε over the orders ``subset`` and the index of the optimal order among all orders."""
        report = compute_epsilon(schedule.with_noise(sigma), delta, "rdp", conversion, all_orders[subset])
        return report, int(np.argmin(np.abs(all_orders - report.optimal_order))) if report.optimal_order else 0

    def eps_at(sigma: float) -> float:
        if accountant != "rdp":
            try:
                return compute_epsilon(schedule.with_noise(sigma), delta, accountant, conversion).epsilon
            except UserInputError as exc:  # the PLD's grid at this σ is too large
                raise UserInputError(f"target-epsilon: {target_epsilon:g} cannot be calibrated with accountant "
                                     f"'{accountant}' ({exc}); use accountant 'rdp'") from None
        moves = 0
        if not window:
            window[:] = list(range(len(all_orders)))
        while True:
            report, best = rdp_report(sigma, sorted(set(window) | integers))
            on_edge = (best == window[0] and best > 0) or (best == window[-1] and best < last) or best not in window
            moves += 1
            if on_edge and moves > len(all_orders):  # no settled optimum: every order decides
                report, best = rdp_report(sigma, list(range(len(all_orders))))
                on_edge = False
            window[:] = around(best)
            if not on_edge:
                return report.epsilon

    if accountant == "rdp":
        return smallest_noise(eps_at, target_epsilon, relative_tolerance)
    # The RDP's σ meets the target under the PLD too (the PLD's ε is the tighter of two upper
    # bounds), and the PLD's σ lies a little below it: the search starts there and moves in small
    # steps, so the PLD (seconds per σ when σ is small) is evaluated only near the answer
    rdp_sigma = calibrate_noise(target_epsilon, schedule, delta, "rdp", conversion, relative_tolerance, orders)
    return smallest_noise(eps_at, target_epsilon, relative_tolerance, start=rdp_sigma, step=1.25, settle_ends=True)
