"""RDP of a subsampled mechanism from the RDP curve of the mechanism itself.

dp-accounting accounts the Gaussian mechanism (:mod:`defenses.privacy.accounting`); mechanisms it lacks
— the distributed discrete Gaussian (:mod:`defenses.ddgauss`), the Laplace and Staircase
mechanisms of UDP-FL (:mod:`defenses.blocks.harmonizer`) — are amplified here by the general upper
bounds, which hold at integer orders α ≥ 2 for any mechanism with RDP curve ε(·):

* Poisson subsampling at rate q, add/remove neighbours: Zhu & Wang 2019, "Poisson Subsampled
  Rényi Differential Privacy", Thm. 6 (:func:`poisson_subsampled_rdp`);
* a uniformly random subset of fixed size m = γ·n, replace-one neighbours: Wang, Balle,
  Kasiviswanathan 2019, "Subsampled Rényi Differential Privacy and Analytical Moments
  Accountant", Thm. 9 (:func:`without_replacement_subsampled_rdp`).

Each bound is taken together with the unsubsampled ε(α) (the smaller of the two holds); the
curves compose additively over rounds and convert to (ε, δ) with
:func:`defenses.privacy.accounting.rdp_to_epsilon`. Float64, log space.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

#: integer orders for bounds that hold at integer α only (Zhu & Wang 2019)
INTEGER_ORDERS: tuple[int, ...] = tuple(range(2, 129)) + (256,)


def _integer_curve(rdp_of: Callable[[np.ndarray], np.ndarray], orders: Sequence[int], bound: str
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(integer orders, the mechanism's RDP at them, the orders 2..max, its RDP at those) for a
    subsampling bound that sums over every integer order up to α."""
    orders = np.asarray(orders, dtype=np.int64)
    if np.any(orders < 2):
        raise ValueError(f"the {bound} bound needs integer orders ≥ 2")
    base = np.asarray(rdp_of(orders.astype(np.float64)), dtype=np.float64)
    every = np.arange(2, int(orders.max()) + 1, dtype=np.float64)
    return orders, base, every, np.asarray(rdp_of(every), dtype=np.float64)


def poisson_subsampled_rdp(rdp_of: Callable[[np.ndarray], np.ndarray], rate: float,
                           orders: Sequence[int] = INTEGER_ORDERS) -> np.ndarray:
    """RDP of a Poisson-subsampled mechanism from the RDP curve of the mechanism itself.

    The general upper bound of Zhu & Wang 2019 ("Poisson Subsampled Rényi Differential Privacy",
    Thm. 6), for integer α ≥ 2 and any mechanism with RDP ε(·):

        ε'(α) ≤ 1/(α−1) · log[ (1−q)^{α−1}(αq − q + 1) + C(α,2) q² (1−q)^{α−2} e^{ε(2)}
                                + 3 Σ_{l=3}^{α} C(α,l) q^l (1−q)^{α−l} e^{(l−1)ε(l)} ],

    taken together with the unsubsampled ε(α) (the smaller of the two holds). ``rdp_of`` maps
    an array of integer orders to the mechanism's RDP at those orders. Float64, log space.
    """
    from scipy.special import gammaln, logsumexp

    orders, base, ls, curve = _integer_curve(rdp_of, orders, "Zhu–Wang")
    if rate >= 1.0:
        return base
    log_q, log_1q = math.log(rate), math.log1p(-rate)
    out = np.empty(len(orders), dtype=np.float64)
    for i, alpha in enumerate(orders):
        terms = ls[: alpha - 1]  # l = 2..α
        log_terms = (gammaln(alpha + 1) - gammaln(terms + 1) - gammaln(alpha - terms + 1)
                     + terms * log_q + (alpha - terms) * log_1q + (terms - 1) * curve[: alpha - 1])
        weights = np.where(terms >= 3, 3.0, 1.0)
        first = (alpha - 1) * log_1q + math.log(alpha * rate - rate + 1)
        total = logsumexp(np.r_[first, log_terms], b=np.r_[1.0, weights])
        out[i] = min(total / (alpha - 1), base[i])
    return out


def without_replacement_subsampled_rdp(rdp_of: Callable[[np.ndarray], np.ndarray], rate: float,
                                       orders: Sequence[int] = INTEGER_ORDERS) -> np.ndarray:
    """RDP of a mechanism run on a uniformly random subset of fixed size m = γ·n, replace-one neighbours.

    The general upper bound of Wang, Balle, Kasiviswanathan 2019 ("Subsampled Rényi Differential
    Privacy and Analytical Moments Accountant", Thm. 9), for integer α ≥ 2 and a mechanism that is
    (α, ε(α))-RDP under replace-one, with ε(∞) = ∞ (so every min{2, (e^{ε(∞)} − 1)^j} is 2):

        ε'(α) ≤ 1/(α−1) · log[ 1 + γ² C(α,2) min{4(e^{ε(2)} − 1), 2e^{ε(2)}}
                                 + 2 Σ_{j=3}^{α} γ^j C(α,j) e^{(j−1)ε(j)} ],

    taken together with the unsubsampled ε(α). ``rdp_of`` maps integer orders to the mechanism's
    replace-one RDP. At α = 2 this coincides with the Gaussian-specific Thm. 27 that dp-accounting
    implements; above, Thm. 27 is tighter for the Gaussian (tests compare both). Float64, log space.
    """
    from scipy.special import gammaln, logsumexp

    orders, base, js, curve = _integer_curve(rdp_of, orders, "Wang–Balle–Kasiviswanathan")
    if rate >= 1.0:
        return base
    log_gamma = math.log(rate)
    eps2 = float(curve[0])
    # log min{4(e^{ε(2)} − 1), 2e^{ε(2)}}
    log_second = min(math.log(4.0) + eps2 + math.log(-math.expm1(-eps2)) if eps2 > 0 else -math.inf,
                     math.log(2.0) + eps2)
    out = np.empty(len(orders), dtype=np.float64)
    for i, alpha in enumerate(orders):
        log_comb = gammaln(alpha + 1) - gammaln(js[: alpha - 1] + 1) - gammaln(alpha - js[: alpha - 1] + 1)
        terms = [0.0, 2 * log_gamma + float(log_comb[0]) + log_second]
        if alpha >= 3:
            j = js[1: alpha - 1]
            terms.extend((math.log(2.0) + j * log_gamma + log_comb[1:] + (j - 1) * curve[1: alpha - 1]).tolist())
        out[i] = min(float(logsumexp(terms)) / (alpha - 1), base[i])
    return out
