"""The server's Dirac canary scores under the gated parametric test of the claimed μ
(:mod:`audit.core.parametric_gdp`): an estimate-based verdict beside the rigorous one-run bounds.

Why these scores are Gaussian by construction:

* **each upload**: a Dirac canary's upload in round t is its own clipped update (±S on one
  coordinate, whatever the model) plus the noise the defense's own code gives an upload,
  N(0, σ²S²/|P_t|) under the claim. Its reading z_t = s·u·√|P_t|/(σS) is N(μ_t, 1) inserted
  (μ_t = √|P_t|/σ) and N(0, 1) held out (zero-out: it takes part and uploads noise only);
* **the aggregate, participation known** (secure aggregation): the round's step on the canary's
  coordinate, less the real clients' noise-free share of it (recomputed on the keyed streams from
  the model the round started from, :func:`defenses.federated.dirac_passage.real_share`), is the
  canary's clipped contribution plus the sum's noise: z_t is N(1/σ, 1) in a round it joined. Only
  where that share is known in every round: left in the readings, it is a function of earlier
  rounds that the canary moved, and the model would not hold.

The weighted sum over the rounds a canary joined
(:func:`audit.core.gaussian_canary_statistics.standardised_sum`) is then N(μᵢ, 1) against N(0, 1),
μᵢ = √Σ_{t joined} μ_t². A mechanism with less noise than accounted, or a larger contribution than
the clip, makes the pair θ·μᵢ-GDP with θ > 1.

The null θ₀ is the ratio at which the client the server's figure is accounted for reaches that
figure's ε at its δ: θ₀ = gdp_mu(ε, δ) / μ_claim (Dong, Roth & Su 2022, Cor. 2.13), with
μ_claim = √R / σ_server — R the rounds the figure accounts (every round, or its participation
bound, whose excess it pays from δ), σ_server its multiplier per change one client makes in what
the server sees. An honest mechanism has θ = 1 ≤ θ₀: the accountant (RDP) is no tighter than the
exact curve, and a canary's μᵢ is in the same units (its rounds, its |P_t| ≤ the population the
figure counts). θ above θ₀ is noise short of what any mechanism within the server's ε could have,
a VIOLATION of the claimed mechanism like the uploads' conformance test's, estimate-based.

Mirrored pairs (replace-one claims) are not tested: their held-out canaries upload −u, a second
shifted group the model does not hold.
"""

from __future__ import annotations

import math

import numpy as np

from audit.core.audit_power import gdp_mu
from audit.core.parametric_gdp import ParametricGDP, parametric_gdp_test
from audit.core.vocabulary import Observer
from defenses.privacy.claims import PrivacyClaim


def claimed_shifts(taken: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """[K]: μᵢ = √Σ_t μ_t² over the rounds each canary joined — ``taken`` [T, K] (bool), ``shifts``
    [T] the claimed shift of one reading (√|P_t|/σ for an upload, 1/σ for the aggregate)."""
    return np.sqrt(np.where(taken, np.asarray(shifts, dtype=np.float64)[:, None] ** 2, 0.0).sum(axis=0))


def server_parametric(scores: np.ndarray, inserted: np.ndarray, claimed_mu: np.ndarray, exercised: np.ndarray,
                           claim: PrivacyClaim | None, mirrored: bool) -> tuple[ParametricGDP | None, str]:
    """The gated test of θ ≤ θ₀ on the server's scores ([runs, K] each, with each canary's
    claimed μᵢ), and a sentence for the notes; None with the reason where it is not run. Canaries
    that joined no round, or whose coordinate no round released, carry no reading and are left
    out of both groups (joining is independent of the coin)."""
    if mirrored:
        return None, "parametric test not run: held-out canaries are mirrored (a replace-one claim)"
    figure = claim.against(Observer.SERVER) if claim is not None else None
    if claim is None or figure is None or not claim.is_private or not claim.delta > 0:
        return None, "parametric test not run: the server's figure is no finite (ε, δ) with δ > 0"
    if not (figure.rounds and figure.noise_multiplier):
        return None, "parametric test not run: the server's figure accounts no Gaussian rounds"
    mu = np.asarray(claimed_mu, dtype=np.float64)
    keep = np.asarray(exercised, dtype=bool) & (mu > 0)
    chosen = np.asarray(inserted, dtype=bool)[keep]
    if not chosen.any():
        return None, "parametric test not run: no inserted canary joined a round"
    accounted = math.sqrt(figure.rounds) / figure.noise_multiplier
    null_ratio = gdp_mu(float(claim.epsilon), float(claim.delta)) / accounted
    test = parametric_gdp_test(np.asarray(scores, dtype=np.float64)[keep], chosen, mu[keep], null_ratio=null_ratio)
    if test is None:
        return None, "parametric test not run: fewer than 50 canaries in a group joined a round"
    return test, describe(test, float(claim.epsilon), float(claim.delta))


def describe(test: ParametricGDP, epsilon: float, delta: float) -> str:
    """The test's figures in one sentence: θ̂ with its lower bound, θ₀, the p-value and the gate."""
    gate = (f"the Gaussian model's gate passed ({test.gate_figures})" if test.applies else
            f"the Gaussian model's gate REJECTED it ({test.gate_figures}), so the test says nothing")
    low = test.claim_epsilon_low(epsilon, delta)
    reach = f", the accounted client's ε ≥ {low:.3g} at δ = {delta:.2g} if the model holds" if math.isfinite(low) else ""
    return (f"parametric test of the claimed μ (estimate-based, not a bound): θ̂ = μ̂/μ = {test.ratio_hat:.3f} "
            f"(≥ {test.ratio_low:.3f} at {1 - test.alpha:.0%}) over {test.inserted} inserted and {test.held_out} "
            f"held-out canaries, against θ₀ = {test.null_ratio:.3f} where the claimed ε is reached, "
            f"p = {test.p_value:.2g}{reach}; {gate}")
