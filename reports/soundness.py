"""Is a measured ε compatible with the claim? One verdict per (attack, ε figure).

An (ε, δ)-DP claim bounds every test an attacker can run, so an ε *lower bound* above what
the claim implies — beyond its confidence interval — means the claim or its implementation is
wrong (DESIGN.md, "Empirical ε"). A lower bound at confidence 1 − α is itself the lower end of
its interval, so it is compared as it is.

An *estimate* (the Gaussian fit of Andrew et al. 2024) is not a bound: the fit assumes Gaussian
statistics, and its interval covers the fitted ε, not a worst case. When even the lower end of
its interval lies above the claim the verdict says so ("estimate above claim") — worth a closer
look — but it never makes a violation on its own.

What a claim implies depends on the unit measured (:func:`claim_bound`):

* the claim's own unit: (ε, δ) as claimed;
* a record under a client-level claim: adding a record to one client's data *replaces* that
  client (one removal plus one addition under add/remove adjacency), so group privacy of size 2
  gives (2ε, (1 + e^ε)·δ) — Dwork & Roth 2014, Thm 2.2 / Lemma 2.2 (group privacy);
* a record under a client claim so weak that its group δ′ reaches 1: (2ε, δ′ ≥ 1) rules out no
  test at all — the verdict says "vacuous" and gives δ′ (an ε lower bound can never contradict it);
* anything else (a whole client under a record-level claim, any unit under a per-weight LDP
  claim): nothing — "not covered".

The ε figures of a measurement are computed at the δ of that bound (:func:`measurement_delta`),
so that "TPR ≤ e^ε·FPR + δ" is tested with the δ the claim really allows.
"""

from __future__ import annotations

import math
from dataclasses import replace

from defenses.claims import PrivacyClaim
from reports.document import EpsilonKind, Estimate, Status, Verdict

CONSISTENT: Status = "consistent"
VIOLATION: Status = "violation"
ESTIMATE_ABOVE: Status = "estimate above claim"
NOT_COVERED: Status = "not covered"
NO_CLAIM: Status = "no claim"
NO_MEASUREMENT: Status = "no measurement"
VACUOUS: Status = "vacuous"

#: precedence when one experiment collects many verdicts (the first present wins)
PRECEDENCE: tuple[Status, ...] = (VIOLATION, ESTIMATE_ABOVE, CONSISTENT, NOT_COVERED, VACUOUS, NO_CLAIM, NO_MEASUREMENT)


def _claimed_epsilon(claim: PrivacyClaim) -> float | None:
    return float(claim.epsilon) if claim.is_private else None


def group_delta(claim: PrivacyClaim) -> float:
    """δ′ = (1 + e^ε)·δ of a client-level claim for one record (group privacy of two add/remove
    steps; Dwork & Roth 2014, Thm 2.2), +inf where e^ε overflows."""
    epsilon = float(claim.epsilon)
    return (1.0 + math.exp(epsilon)) * float(claim.delta or 0.0) if epsilon < 700 else math.inf


def claim_bound(claim: PrivacyClaim, unit: str) -> tuple[float, float, str] | None:
    """(ε, δ, basis) that ``claim`` implies for a measurement per ``unit``; None when it implies
    nothing (see :func:`vacuous_delta` for the case where it implies a bound that rules out nothing)."""
    epsilon = _claimed_epsilon(claim)
    if epsilon is None:
        return None
    delta = float(claim.delta or 0.0)
    if unit == claim.unit and unit in ("client", "record"):
        return epsilon, delta, "the claim"
    if claim.unit == "client" and unit == "record" and (delta_prime := group_delta(claim)) < 1.0:
        return 2.0 * epsilon, delta_prime, "group privacy: a record changes one client's data"
    return None  # δ′ ≥ 1 included: :func:`vacuous_delta` names that case


def vacuous_delta(claim: PrivacyClaim, unit: str) -> float | None:
    """δ′ ≥ 1 when what ``claim`` implies per ``unit`` is (2ε, δ′) with δ′ ≥ 1 — a bound that every
    test satisfies (TPR ≤ 1 ≤ e^{2ε}·FPR + δ′) — else None."""
    if _claimed_epsilon(claim) is None or claim.unit != "client" or unit != "record":
        return None
    delta = group_delta(claim)
    return delta if delta >= 1.0 else None


def measurement_delta(claim: PrivacyClaim, unit: str, default: float) -> float:
    """The δ at which a measurement per ``unit`` computes its ε figures."""
    bound = claim_bound(claim, unit)
    return bound[1] if bound is not None else float(claim.delta or default)


def verdict(claim: PrivacyClaim, unit: str, metric: str, estimate: Estimate, kind: EpsilonKind) -> Verdict:
    """A verdict on one ε figure: ``status`` plus a sentence with the numbers."""
    measured = estimate.ci_low if kind == "estimate" else estimate.value
    value = estimate.value
    out = Verdict(metric=metric, unit=unit, kind=kind, measured=measured, claimed=_claimed_epsilon(claim),
                  bound=None, bound_delta=None, status=NO_MEASUREMENT, text="")
    if measured is None or not math.isfinite(measured):
        return replace(out, text="no measurement (too few canaries or units)")
    figure = (f"ε estimate {value:.3g} (95 % interval from {measured:.3g})" if kind == "estimate" and value is not None
              else f"ε_LB = {measured:.3g}")
    if out.claimed is None:
        return replace(out, status=NO_CLAIM, text=f"{figure} (no privacy claim)")
    bound = claim_bound(claim, unit)
    vacuous = vacuous_delta(claim, unit)
    if vacuous is not None:
        return replace(out, status=VACUOUS,
                       text=f"vacuous: per {unit}, the {claim.unit}-level claim ε = {out.claimed:.3g} implies "
                            f"(2ε = {2 * out.claimed:.3g}, δ′ = (1 + e^ε)·δ = {vacuous:.3g}) by group privacy, and "
                            f"δ′ ≥ 1 rules out no attack ({figure})")
    if bound is None:
        return replace(out, status=NOT_COVERED,
                       text=f"not covered: the claim is per {claim.unit}, the measurement per {unit} ({figure})")
    limit, limit_delta, basis = bound
    out = replace(out, bound=limit, bound_delta=limit_delta)
    against = (f"the claimed ε = {limit:.3g}" if basis == "the claim"
               else f"2ε = {limit:.3g}, the claimed ε = {out.claimed:.3g} doubled ({basis})")
    if measured <= limit * (1 + 1e-9):
        if kind == "estimate":
            return replace(out, status=CONSISTENT, text=f"consistent: {figure}; its lower end does not exceed {against}")
        return replace(out, status=CONSISTENT, text=f"consistent: {figure} ≤ {against}")
    if kind == "estimate":
        return replace(out, status=ESTIMATE_ABOVE,
                       text=f"estimate above claim: the lower end of the {figure} exceeds {against}; "
                            "a Gaussian-fit estimate is not a bound, so this is a warning, not a proof")
    return replace(out, status=VIOLATION,
                   text=f"VIOLATION: measured ε_LB = {measured:.3g} exceeds {against} beyond its confidence interval")


def attack_verdicts(claim: PrivacyClaim, unit: str, metrics: dict[str, Estimate],
                    epsilon_kind: dict[str, EpsilonKind]) -> list[Verdict]:
    """Verdicts for every ε figure an attack carries (``epsilon_kind``: figure → what it is)."""
    return [verdict(claim, unit, metric, metrics[metric], kind) for metric, kind in epsilon_kind.items() if metric in metrics]


def experiment_verdict(verdicts: list[Verdict]) -> Status:
    """The experiment's overall status: the first of :data:`PRECEDENCE` among its verdicts."""
    statuses = {v.status for v in verdicts}
    return next((status for status in PRECEDENCE if status in statuses), NO_MEASUREMENT)


def experiment_sentence(verdicts: list[Verdict], attacks: list[str]) -> str:
    """One sentence behind an experiment's status: the violations, else the strongest comparison.

    ``attacks`` names the attack of each verdict (same order)."""
    named = list(zip(attacks, verdicts))
    for status in (VIOLATION, ESTIMATE_ABOVE):
        hits = [f"{attack}: {v.text}" for attack, v in named if v.status == status]
        if hits:
            return "; ".join(hits)
    compared = [(attack, v) for attack, v in named if v.status == CONSISTENT and v.kind == "lower_bound"]
    if compared:
        attack, strongest = max(compared, key=lambda item: (item[1].measured or 0.0) / item[1].bound if item[1].bound else 0.0)
        return (f"the strongest lower bound, ε_LB = {strongest.measured:.3g} ({attack}, per {strongest.unit}), "
                f"stays below its limit {strongest.bound:.3g}")
    return ""
