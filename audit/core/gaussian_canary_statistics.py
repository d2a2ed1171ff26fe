"""The test statistics that are optimal against a Gaussian claim, for a Dirac canary read at
every step of a run.

A Dirac canary puts its whole allowed contribution — the clip S — on one coordinate j with a
sign s. Wherever an observer sees a noisy sum on that coordinate, the canary's signed reading in
step t, standardised by the noise the claim accounts for,

    z_t = s · (observed sum at j in step t) / (σ·S),

is N(0, 1) plus the non-canary contributions when the canary is held out, and shifted by
μ = 1/σ (the canary's clipped value over the noise std) in the steps it took part in. The
Neyman–Pearson test of "held out" against "inserted" then depends on what the observer knows:

* **participation known** (the server, which picks who takes part; or full participation): the
  log-likelihood ratio is μ·Σ_t z_t − n·μ²/2 over the n steps the canary joined, a monotone
  function of the *standardised sum* Σ_t z_t / √n (:func:`standardised_sum`) — N(√n·μ, 1)
  against N(0, 1): exactly the μ√n-GDP pair the claim's composition accounts for;
* **participation hidden** (anyone who sees the models but not who was sampled; each step the
  canary joins with probability q): each step is the mixture (1 − q)·N(0, 1) + q·N(μ, 1)
  against N(0, 1), and the log-likelihood ratio of the run is the sum over steps of
  log(1 − q + q·exp(μ·z_t − μ²/2)) (:func:`mixture_log_likelihood_ratio`) — the statistic
  whose privacy-loss distribution the subsampled-Gaussian accountant composes (Mironov, Talwar,
  Zhang 2019; Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning", §4,
  read every iterate with it). At q = 1 it is the standardised sum up to a monotone map.

Any statistic gives a *valid* one-run bound (the bound's validity rests on the canaries' coins
alone); these are the ones with the most power against a mechanism that is exactly the claim.
"""

from __future__ import annotations

import numpy as np


def standardised_sum(readings: np.ndarray, taken: np.ndarray | None = None,
                     weights: np.ndarray | None = None) -> np.ndarray:
    """Σ_t w_t·z_t / √(Σ_t w_t²) over the last axis, over the steps the canary took part in:
    ``readings`` [..., T] the standardised signed readings, ``taken`` [..., T] (bool; None: all),
    ``weights`` (broadcast to the readings; None: all 1, giving Σ z_t / √n) the shift each step's
    reading has when the canary is inserted — the log-likelihood ratio of shifts μ_t is
    Σ μ_t·z_t up to a constant, N(√Σμ_t², 1) against N(0, 1). A canary that took part in no
    step scores 0 (its readings carry no information about it)."""
    z = np.asarray(readings, dtype=np.float64)
    mask = np.ones(z.shape, dtype=bool) if taken is None else np.asarray(taken, dtype=bool)
    w = np.broadcast_to(np.ones(1) if weights is None else np.asarray(weights, dtype=np.float64), z.shape)
    total = np.where(mask, w * z, 0.0).sum(axis=-1)
    scale = np.sqrt(np.where(mask, w * w, 0.0).sum(axis=-1))
    return np.where(scale > 0, total / np.maximum(scale, 1e-300), 0.0)


def mixture_log_likelihood_ratio(readings: np.ndarray, mu: float, rate: float, mirrored: bool = False) -> np.ndarray:
    """Σ_t log(1 − q + q·exp(μ·z_t − μ²/2)) over the last axis of ``readings`` [..., T]: the
    log-likelihood ratio of "inserted, each step joined with probability q = ``rate``" against
    "held out", for standardised readings z_t (computed with logaddexp: no overflow at large z).

    ``mirrored``: the held-out canary joins too, with its contribution negated (a replace-one
    pair): each step is (1 − q)·N(0, 1) + q·N(μ, 1) against (1 − q)·N(0, 1) + q·N(−μ, 1), the pair
    the subsampled Gaussian's replace-one privacy loss is computed from (dp-accounting's REPLACE
    adjacency), and the ratio is the difference of the two mixtures' log terms."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    if not np.isfinite(mu) or mu <= 0:
        raise ValueError(f"mu must be positive and finite, got {mu}")
    z = np.asarray(readings, dtype=np.float64)
    if rate == 1.0:
        return ((2.0 * mu * z) if mirrored else (mu * z - mu * mu / 2.0)).sum(axis=-1)

    def log_mixture(shift: np.ndarray) -> np.ndarray:
        return np.logaddexp(np.log1p(-rate), np.log(rate) + shift - mu * mu / 2.0)

    terms = log_mixture(mu * z) - (log_mixture(-mu * z) if mirrored else 0.0)
    return terms.sum(axis=-1)
