"""A canary audit's counts held to the accounted mechanism's own composed trade-off curve.

The one-run bounds of a canary audit test the counts against the (ε, δ) curve of the claim. That
curve is the loosest mechanism with that (ε, δ): the f-DP analysis of the same counts
(Mahloujifar, Melis, Chaudhuri 2024, "Auditing f-Differential Privacy in One Run") is capped by it,
and the Steinke–Nasr–Jagielski (2023) count bound by its 2mδ term — at a claimed ε = 8 neither can
reach 8 with 10⁵ coins. The claim, though, names the mechanism it accounts: Gaussian or Laplace
noise at a multiplier, a sampling rate, a number of compositions. Its own curve (Dong, Roth, Su
2022, Prop. 2.12, from dp-accounting's privacy-loss distribution; :mod:`audit.core.mechanism_tradeoff`)
is far tighter, and the counts refute it when the code releases less noise than accounted.

:func:`mechanism_curve_result` turns an audit's result into a second result of its own: the same
counts, tested against that curve, with ε_LB the ε of the least-noise member of the mechanism's
family the counts reject, held to the accounted mechanism's exact ε (not the claim's, which an
accountant such as RDP may state above it). It applies only where an honest implementation's
canary statistic leaks no more per canary than that one-dimensional mechanism — the caller decides.
"""

from __future__ import annotations

from dataclasses import replace

from attacks.attack_result import AttackResult
from audit.core.mechanism_tradeoff import composed_epsilon, mechanism_one_run_audit
from audit.core.vocabulary import EpsilonKind

#: the figure the result reports: the f-DP analysis of the counts, against the mechanism's curve
FIGURE = "epsilon_one_run_fdp"


def mechanism_curve_result(base: AttackResult, kind: str, parameter: float, rate: float, steps: int,
                           mechanism: str, variant: str) -> AttackResult | None:
    """``base``'s counts against the ``kind`` ("gaussian" or "laplace") mechanism with noise
    ``parameter`` at sensitivity 1, Poisson ``rate``, composed ``steps`` times, as a result named
    ``variant`` held to that mechanism's exact ε at the δ of ``base``'s counts, in place of
    ``base``'s claim; None where ``base`` has no counts or no private claim. ``mechanism``
    describes it for the reader. Where ``base``'s counts state no power
    (:func:`audit.core.audit_power.power_caveat`), neither does this result."""
    counted, claim = base.evidence.get(FIGURE), base.claim
    if counted is None or claim is None or not claim.is_private:
        return None
    delta = counted.delta
    exact = composed_epsilon(kind, parameter, rate, steps, delta)
    tested = replace(mechanism_one_run_audit(counted.canaries, counted.tried, kind, parameter, rate, steps, delta,
                                             counted.alpha, counted.fractions),
                     unmodelled_power=counted.unmodelled_power)
    accounted = (f"the accounted mechanism's own curve: {mechanism}, Poisson rate {rate:g}, {steps} compositions "
                 f"(dp-accounting PLD), ε = {exact:.4g} at δ = {delta:.2g}")
    held = replace(claim, epsilon=exact, accountant=accounted, notes=f"{accounted}; {claim.notes}")
    notes = (f"the counts of the {base.variant or base.attack} result ({counted.guesses} guesses, {counted.correct} right "
             f"at its best level) tested against {accounted}; ε_LB is that ε for the least noise (×{tested.scale:.3g}) "
             "whose curve they reject")
    return replace(base, variant=variant, notes=notes,
                   metrics={**{k: v for k, v in base.metrics.items() if not k.startswith("epsilon")},
                            FIGURE: tested.as_estimate()},
                   epsilon_kind={FIGURE: EpsilonKind.LOWER_BOUND}, evidence={FIGURE: tested}, claim=held)
