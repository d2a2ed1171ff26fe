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
* anything else (a whole client under a record-level claim, any unit under a per-weight LDP
  claim, a record under a client claim so weak that its group δ′ reaches 1): nothing — "not covered".

The ε figures of a measurement are computed at the δ of that bound (:func:`measurement_delta`),
so that "TPR ≤ e^ε·FPR + δ" is tested with the δ the claim really allows.
"""

from __future__ import annotations

import math
from typing import Any

CONSISTENT, VIOLATION, ESTIMATE_ABOVE = "consistent", "violation", "estimate above claim"
NOT_COVERED, NO_CLAIM, NO_MEASUREMENT = "not covered", "no claim", "no measurement"

#: precedence when one experiment collects many verdicts (the first present wins)
PRECEDENCE = (VIOLATION, ESTIMATE_ABOVE, CONSISTENT, NOT_COVERED, NO_CLAIM, NO_MEASUREMENT)


def _claimed_epsilon(claim: dict[str, Any]) -> float | None:
    epsilon = claim.get("epsilon")
    return None if epsilon is None or not math.isfinite(epsilon) else float(epsilon)


def claim_bound(claim: dict[str, Any], unit: str) -> tuple[float, float, str] | None:
    """(ε, δ, basis) that ``claim`` implies for a measurement per ``unit``; None when it implies nothing."""
    epsilon = _claimed_epsilon(claim)
    if epsilon is None:
        return None
    delta = float(claim.get("delta") or 0.0)
    claimed_unit = claim.get("unit", "none")
    if unit == claimed_unit and unit in ("client", "record"):
        return epsilon, delta, "the claim"
    if claimed_unit == "client" and unit == "record":
        group_delta = (1.0 + math.exp(epsilon)) * delta if epsilon < 700 else math.inf
        if group_delta >= 1.0:  # (2ε, δ' ≥ 1) constrains nothing: the record is not covered
            return None
        return 2.0 * epsilon, group_delta, "group privacy: a record changes one client's data"
    return None


def measurement_delta(claim: dict[str, Any], unit: str, default: float) -> float:
    """The δ at which a measurement per ``unit`` computes its ε figures."""
    bound = claim_bound(claim, unit)
    return bound[1] if bound is not None else float(claim.get("delta") or default)


def verdict(claim: dict[str, Any], unit: str, metric: str, estimate: dict[str, Any], kind: str) -> dict[str, Any]:
    """A verdict on one ε figure: ``status`` plus a sentence with the numbers."""
    measured = estimate.get("ci_low") if kind == "estimate" else estimate.get("value")
    value = estimate.get("value")
    out: dict[str, Any] = {"metric": metric, "unit": unit, "kind": kind, "measured": measured,
                           "claimed": _claimed_epsilon(claim), "bound": None, "bound_delta": None}
    if measured is None or not math.isfinite(measured):
        return {**out, "status": NO_MEASUREMENT, "text": "no measurement (too few canaries or units)"}
    figure = (f"ε estimate {value:.3g} (95 % interval from {measured:.3g})" if kind == "estimate" and value is not None
              else f"ε_LB = {measured:.3g}")
    if out["claimed"] is None:
        return {**out, "status": NO_CLAIM, "text": f"{figure} (no privacy claim)"}
    bound = claim_bound(claim, unit)
    if bound is None:
        return {**out, "status": NOT_COVERED,
                "text": f"not covered: the claim is per {claim.get('unit')}, the measurement per {unit} ({figure})"}
    limit, limit_delta, basis = bound
    out.update(bound=limit, bound_delta=limit_delta)
    against = (f"the claimed ε = {limit:.3g}" if basis == "the claim"
               else f"2ε = {limit:.3g}, the claimed ε = {out['claimed']:.3g} doubled ({basis})")
    if measured <= limit * (1 + 1e-9):
        if kind == "estimate":
            return {**out, "status": CONSISTENT, "text": f"consistent: {figure}; its lower end does not exceed {against}"}
        return {**out, "status": CONSISTENT, "text": f"consistent: {figure} ≤ {against}"}
    if kind == "estimate":
        return {**out, "status": ESTIMATE_ABOVE,
                "text": f"estimate above claim: the lower end of the {figure} exceeds {against}; "
                        "a Gaussian-fit estimate is not a bound, so this is a warning, not a proof"}
    return {**out, "status": VIOLATION,
            "text": f"VIOLATION: measured ε_LB = {measured:.3g} exceeds {against} beyond its confidence interval"}


def attack_verdicts(claim: dict[str, Any], attack: dict[str, Any]) -> list[dict[str, Any]]:
    """Verdicts for every ε figure an attack entry of results.json carries."""
    return [verdict(claim, attack["unit"], metric, attack["metrics"][metric], kind)
            for metric, kind in attack.get("epsilon_kind", {}).items() if metric in attack["metrics"]]


def experiment_verdict(verdicts: list[dict[str, Any]]) -> str:
    """The experiment's overall status: the first of :data:`PRECEDENCE` among its verdicts."""
    statuses = {v["status"] for v in verdicts}
    return next((status for status in PRECEDENCE if status in statuses), NO_MEASUREMENT)


def experiment_sentence(verdicts: list[dict[str, Any]], attacks: list[str]) -> str:
    """One sentence behind an experiment's status: the violations, else the strongest comparison.

    ``attacks`` names the attack of each verdict (same order)."""
    named = list(zip(attacks, verdicts))
    for status in (VIOLATION, ESTIMATE_ABOVE):
        hits = [f"{attack}: {v['text']}" for attack, v in named if v["status"] == status]
        if hits:
            return "; ".join(hits)
    compared = [(attack, v) for attack, v in named if v["status"] == CONSISTENT and v["kind"] == "lower_bound"]
    if compared:
        attack, strongest = max(compared, key=lambda item: item[1]["measured"] / item[1]["bound"] if item[1]["bound"] else 0.0)
        return (f"the strongest lower bound, ε_LB = {strongest['measured']:.3g} ({attack}, per {strongest['unit']}), "
                f"stays below its limit {strongest['bound']:.3g}")
    return ""
