"""Verdicts on the mechanism itself rather than on an ε figure: the uploads' conformance with the
claimed clip and noise, and the gated parametric test of the claimed μ. Each is one member of its
experiment's Holm family (:func:`reports.soundness.family_verdicts`) with a fixed weight; each can
make a VIOLATION, and neither can make a claim *consistent* on its own
(:func:`reports.soundness.experiment_verdict`).

* **Conformance** (:mod:`audit.core.upload_conformance`): where the server sees each upload, the
  canary clients' uploads are tested for the noise in every round and the clip on every inserted
  canary. A rejection is a VIOLATION of the claim's mechanism, not an ε lower bound.
* **Parametric** (:mod:`audit.core.parametric_gdp`): where a canary statistic is Gaussian by
  construction (the server's each-upload standardised sums), the slope of the scores on the
  claimed μᵢ, in units of the noise std, is θ — the mechanism's distinguishability over the
  accounted one — with an exact noncentral-t law. An estimate-based verdict: it holds when the
  Gaussian model holds, which its goodness-of-fit gate checks before the test is read (a gated-out
  test enters the family with p = 1, :attr:`~audit.core.parametric_gdp.ParametricGDP.gated_p_value`).
  Its false-violation rate under tight and conservative claims, Gaussian and non-Gaussian noise of
  the claimed variance, is measured by simulation (``benchmarks/parametric_gdp.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from audit.core.audit_power import POWER_TARGET
from audit.core.parametric_gdp import ParametricGDP
from audit.core.upload_conformance import UploadConformance
from audit.core.vocabulary import Relation, Unit, VerdictKind, VerdictStatus
from defenses.privacy.claims import PrivacyClaim
from reports.document import Verdict

#: the metric names of the two verdicts
CONFORMANCE_METRIC = "upload_conformance"
PARAMETRIC_METRIC = "parametric_gdp"
#: their weight in the family, fixed before the data are seen: the least any test gets. Their
#: evidence is decisive when there is any (10⁴–10⁶ uploads or canaries: a noise at 0.8 of the
#: claim, one unclipped upload, or θ = 2 gives p < 10⁻⁵), so the ε bounds, which need every bit of
#: α, keep almost all of it
MECHANISM_WEIGHT = 0.05


def _claimed(claim: PrivacyClaim | None) -> float | None:
    return float(claim.epsilon) if claim is not None and claim.is_private else None


def _holm(p_value: float, level: float, family: int, share: float) -> str:
    return f"p = {p_value:.2g} against Holm level {level:.2g} (family of {family} distinct tests, weight {share:.0%})"


def conformance_verdict(claim: PrivacyClaim | None, test: UploadConformance) -> Verdict:
    """The uploads' conformance with the claimed clip and noise, undecided: its p-value joins the
    experiment's family. ``claim`` is the server's figure."""
    return Verdict(metric=CONFORMANCE_METRIC, unit=Unit.CLIENT, kind=VerdictKind.CONFORMANCE, measured=None,
                   claimed=_claimed(claim), bound=None, bound_delta=None, status=VerdictStatus.INCONCLUSIVE,
                   text=test.describe(), claim_relation=claim.relation if claim is not None else None,
                   design_relation=Relation.ZERO_OUT, p_value=test.p_value)


def decide_conformance(v: Verdict, test: UploadConformance, rejected: bool, level: float, first_level: float,
                       family: int, share: float) -> Verdict:
    """The conformance verdict once its family is decided."""
    power = test.power(first_level)
    holm = _holm(test.p_value, level, family, share)
    reach = f"power {power:.0%} to detect half the claimed noise std with {test.held_out} held-out uploads"
    if rejected:
        status, text = VerdictStatus.VIOLATION, f"VIOLATION of the claimed mechanism: {test.failure()}; {holm}"
    elif power >= POWER_TARGET:
        status, text = VerdictStatus.CONSISTENT, (
            f"consistent: the uploads carry the claimed clip and noise — {test.describe()}; {holm}; {reach}")
    else:
        status, text = VerdictStatus.INCONCLUSIVE, f"inconclusive: {test.describe()}; {holm}; {reach}"
    return replace(v, status=status, text=text, family=family, level=level)


def parametric_verdict(claim: PrivacyClaim, test: ParametricGDP) -> Verdict:
    """The parametric test of the claimed μ, undecided: ``measured`` is the lower end of the ε of
    the client the claim's worst case is about (:meth:`~audit.core.parametric_gdp.ParametricGDP.claim_epsilon_low`),
    ``bound`` the claimed ε it is held to; its gated p-value joins the experiment's family. The
    verdict's ``p_value`` is the test's own where the gate let it speak, else null. The design is
    zero-out, as the conformance test's: a held-out canary takes part and uploads its noise."""
    epsilon, delta = float(claim.epsilon), float(claim.delta)
    low = test.claim_epsilon_low(epsilon, delta)
    return Verdict(metric=PARAMETRIC_METRIC, unit=Unit.CLIENT, kind=VerdictKind.PARAMETRIC,
                   measured=low if math.isfinite(low) else None, claimed=epsilon, bound=epsilon, bound_delta=delta,
                   status=VerdictStatus.INCONCLUSIVE, text="", claim_relation=claim.relation,
                   design_relation=Relation.ZERO_OUT,
                   p_value=test.p_value if test.applies else None)


def decide_parametric(v: Verdict, test: ParametricGDP, rejected: bool, level: float, first_level: float,
                      family: int, share: float) -> Verdict:
    """The parametric verdict once its family is decided: VIOLATION where the gate passed and the
    family rejects θ ≤ θ₀; otherwise it says what it found and never more (its power is stated:
    θ = 2θ₀ at the level the family first gives it)."""
    figures = (f"θ̂ = {test.ratio_hat:.3f} (≥ {test.ratio_low:.3f} at {1 - test.alpha:.0%}) against θ₀ = "
               f"{test.null_ratio:.3f}, the ratio at which the accounted client reaches the claimed ε = {v.bound:.3g}, over "
               f"{test.inserted} inserted and {test.held_out} held-out canaries")
    if not test.applies:
        return replace(v, status=VerdictStatus.NO_MEASUREMENT, family=family, level=level, text=(
            f"no measurement: the Gaussian model's goodness-of-fit gate rejected the scores ({test.gate_figures}), "
            f"so the parametric test says nothing; the rigorous bounds speak alone ({figures})"))
    holm = _holm(test.p_value, level, family, share)
    epsilon = "" if v.measured is None else f"; the accounted client's ε ≥ {v.measured:.3g} if the model holds"
    if rejected:
        return replace(v, status=VerdictStatus.VIOLATION, family=family, level=level, text=(
            f"VIOLATION (estimate-based: a Gaussian model, gated): the canaries are more distinguishable than "
            f"the claimed mechanism, {figures}{epsilon}; {holm}"))
    power = test.power(first_level, 2.0 * test.null_ratio)
    return replace(v, status=VerdictStatus.INCONCLUSIVE, family=family, level=level, text=(
        f"no departure from the claimed μ: {figures}; {holm}; power {power:.0%} to detect θ = 2θ₀ "
        "(an estimate-based test never makes the claim consistent on its own)"))
