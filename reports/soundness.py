"""Is a measured ε compatible with the claim? One verdict per (attack, ε figure).

An (ε, δ)-DP claim bounds every test an attacker can run, so an ε *lower bound* above what
the claim implies — beyond its confidence interval — means the claim or its implementation is
wrong (Jagielski, Ullman, Oprea 2020; Nasr et al. 2021). A lower bound at confidence 1 − α is
itself the lower end of its interval, so it is compared as it is.

An *estimate* (the Gaussian fit of Andrew et al. 2024) is not a bound: the fit assumes Gaussian
statistics, and its interval covers the fitted ε, not a worst case. When even the lower end of
its interval lies above the claim the verdict says so ("estimate above claim") — worth a closer
look — but it never makes a violation on its own.

What a claim implies depends on the unit measured and on the neighbouring relation of the
measurement's design — what one inclusion coin changes (:mod:`audit.tasks`) — set beside the
claim's relation (:func:`claim_bound`):

* the claim's own unit and relation: (ε, δ) as claimed;
* one step of the design is two of the claim's — a replaced client under an add/remove or
  zero-out claim, or a record added to one client's data (which *replaces* that client's data)
  under an add/remove or zero-out client-level claim: group privacy of size 2 gives
  (2ε, (1 + e^ε)·δ) — Dwork & Roth 2014, Thm 2.2 / Lemma 2.2; a record under a replace-one
  client-level claim is one replacement: (ε, δ);
* where that group δ′ reaches 1, (2ε, δ′ ≥ 1) rules out no test at all — the verdict says
  "vacuous" and gives δ′ (an ε lower bound can never contradict it);
* anything else (an added client under a replace-one or zero-out claim, a whole client under a
  record-level claim, any unit under a per-weight LDP claim): nothing — "not covered".

**A family per experiment.** Every ε lower bound of an experiment is a test of "the mechanism is
as private as the claim implies"; with k of them at 95 % each, one false VIOLATION becomes likely
(1 − 0.95^k). The bounds carry their one-run counts and their test, hence a p-value at the
implied (ε, δ): Steinke et al.'s binomial (:class:`audit.core.empirical_epsilon.OneRunAudit`) and
the f-DP analysis of Mahloujifar et al. 2024 (:class:`audit.core.fdp_one_run.FdpOneRunAudit`) —
two tests of the same claim on the same counts, both in the family, so that the correction pays
for reading whichever is tighter. :func:`family_verdicts` applies Holm's weighted step-down
correction (Holm 1979) at α = 5 % over the experiment's family — each test weighted by the power
its design has, fixed before the data are seen — and only a rejection is a VIOLATION. A bound
that is not rejected is **consistent** only if the audit had power — the probability of
detecting a mechanism twice as leaky as the bound, simulated with the design's coins and the
figure's own test (:mod:`audit.core.audit_power`), reaches 80 % — otherwise **inconclusive**,
with the coins that would be needed. A Gaussian-fit estimate is not a test: above the claim it
warns, below it is inconclusive; it is not in the family.

The ε figures of a measurement are computed at the δ of that bound (:func:`measurement_delta`),
so that "TPR ≤ e^ε·FPR + δ" is tested with the δ the claim really allows.

**The mechanism itself.** Where the server sees each upload, the canary clients' uploads are also
tested against the mechanism the claim accounts — the noise in every round, the clip on every
inserted canary — and their Gaussian-by-construction scores against the claimed μ by a gated
parametric test (:mod:`reports.mechanism_verdicts`). Each is one more hypothesis of the family,
with the least weight (its evidence is decisive when there is any): a rejection is a VIOLATION of
the claim's mechanism, not an ε lower bound, and neither makes a claim consistent on its own.
"""

from __future__ import annotations

import math
from dataclasses import replace

from audit.core.audit_power import POWER_TARGET, one_run_power
from audit.core.empirical_epsilon import OneRunAudit
from audit.core.mechanism_tradeoff import MechanismOneRunAudit
from audit.core.multiplicity import weighted_holm
from audit.core.parametric_gdp import ParametricGDP
from audit.core.upload_conformance import UploadConformance
from audit.core.vocabulary import EpsilonKind, Relation, Unit, VerdictKind, VerdictStatus
from defenses.privacy.claims import PrivacyClaim
from reports.document import Estimate, Power, Verdict
from reports.mechanism_verdicts import MECHANISM_WEIGHT, decide_conformance, decide_parametric

#: the family-wise error rate of an experiment's violation verdicts
FAMILY_ALPHA = 0.05
#: the least share of the family's α weight a test gets, however little power its design has
WEIGHT_FLOOR = 0.05

#: precedence when one experiment collects many verdicts (the first present wins)
PRECEDENCE: tuple[VerdictStatus, ...] = tuple(VerdictStatus)


def _claimed_epsilon(claim: PrivacyClaim) -> float | None:
    return float(claim.epsilon) if claim.is_private else None


def group_delta(claim: PrivacyClaim) -> float:
    """δ′ = (1 + e^ε)·δ of a group of two (Dwork & Roth 2014, Thm 2.2), +inf where e^ε overflows."""
    epsilon = float(claim.epsilon)
    return (1.0 + math.exp(epsilon)) * float(claim.delta or 0.0) if epsilon < 700 else math.inf


def _steps(claim: PrivacyClaim, unit: str, design: str) -> tuple[int, str] | None:
    """How many of the claim's neighbouring steps one coin of the design is, and why; None when
    the claim does not speak of the design's neighbours."""
    relation = claim.relation
    if unit == claim.unit and unit in (Unit.CLIENT, Unit.RECORD):
        if relation == design:
            return 1, "the claim"
        if design == Relation.REPLACE_ONE and relation in (Relation.ADD_REMOVE, Relation.ZERO_OUT):
            return 2, f"group privacy: replacing one {unit} is two {relation} steps"
        if design == Relation.ZERO_OUT and relation == Relation.ADD_REMOVE:
            return 2, f"group privacy: zeroing one {unit}'s data is a removal and an addition"
        if design == Relation.ZERO_OUT and relation == Relation.REPLACE_ONE:
            return 1, f"zeroing one {unit}'s data is one replacement"
        return None
    if claim.unit == Unit.CLIENT and unit == Unit.RECORD and design == Relation.ADD_REMOVE:
        if relation == Relation.REPLACE_ONE:
            return 1, "a record changes one client's data: one client replaced"
        if relation in (Relation.ADD_REMOVE, Relation.ZERO_OUT):
            return 2, f"group privacy: a record changes one client's data, two {relation} steps"
    return None


def claim_bound(claim: PrivacyClaim, unit: str, design: str = Relation.ADD_REMOVE) -> tuple[float, float, str] | None:
    """(ε, δ, basis) that ``claim`` implies for a measurement per ``unit`` whose design has
    neighbouring relation ``design``; None when it implies nothing (see :func:`vacuous_delta` for
    a bound that rules out nothing)."""
    epsilon = _claimed_epsilon(claim)
    steps = _steps(claim, unit, design)
    if epsilon is None or steps is None:
        return None
    delta = float(claim.delta or 0.0)
    if steps[0] == 1:
        return epsilon, delta, steps[1]
    delta_prime = group_delta(claim)
    return (2.0 * epsilon, delta_prime, steps[1]) if delta_prime < 1.0 else None


def vacuous_delta(claim: PrivacyClaim, unit: str, design: str = Relation.ADD_REMOVE) -> float | None:
    """δ′ ≥ 1 when what ``claim`` implies is (2ε, δ′) with δ′ ≥ 1 — a bound that every test
    satisfies (TPR ≤ 1 ≤ e^{2ε}·FPR + δ′) — else None."""
    steps = _steps(claim, unit, design)
    if _claimed_epsilon(claim) is None or steps is None or steps[0] == 1:
        return None
    delta = group_delta(claim)
    return delta if delta >= 1.0 else None


def measurement_delta(claim: PrivacyClaim, unit: str, default: float, design: str = Relation.ADD_REMOVE) -> float:
    """The δ at which a measurement per ``unit`` computes its ε figures."""
    bound = claim_bound(claim, unit, design)
    return bound[1] if bound is not None else float(claim.delta or default)


def verdict(claim: PrivacyClaim, unit: str, metric: str, estimate: Estimate, kind: EpsilonKind,
            design: str = Relation.ADD_REMOVE, evidence: OneRunAudit | None = None, decide: bool = True) -> Verdict:
    """A verdict on one ε figure on its own: ``status`` plus a sentence with the numbers.

    A lower bound with ``evidence`` gets its p-value at the implied (ε, δ); its final status
    (violation, consistent or inconclusive) is set by :func:`family_verdicts` with the rest of
    the experiment's family; with ``decide`` (a family of one) it is decided here the same way.
    """
    measured = estimate.ci_low if kind == EpsilonKind.ESTIMATE else estimate.value
    value = estimate.value
    out = Verdict(metric=metric, unit=unit, kind=VerdictKind(kind), measured=measured, claimed=_claimed_epsilon(claim),
                  bound=None, bound_delta=None, status=VerdictStatus.NO_MEASUREMENT, text="",
                  claim_relation=claim.relation, design_relation=design)
    if measured is None or not math.isfinite(measured):
        return replace(out, text="no measurement (too few canaries or units)")
    figure = (f"ε estimate {value:.3g} (95 % interval from {measured:.3g})" if kind == EpsilonKind.ESTIMATE and value is not None
              else f"ε_LB = {measured:.3g}")
    if out.claimed is None:
        return replace(out, status=VerdictStatus.NO_CLAIM, text=f"{figure} (no privacy claim)")
    vacuous = vacuous_delta(claim, unit, design)
    if vacuous is not None:
        return replace(out, status=VerdictStatus.VACUOUS,
                       text=f"vacuous: per {unit}, the {claim.unit}-level claim ε = {out.claimed:.3g} implies "
                            f"(2ε = {2 * out.claimed:.3g}, δ′ = (1 + e^ε)·δ = {vacuous:.3g}) by group privacy, and "
                            f"δ′ ≥ 1 rules out no attack ({figure})")
    bound = claim_bound(claim, unit, design)
    if bound is None:
        return replace(out, status=VerdictStatus.NOT_COVERED,
                       text=f"not covered: the claim is per {claim.unit} under {claim.relation} neighbours, the "
                            f"measurement per {unit} with a {design} design ({figure})")
    limit, limit_delta, _ = bound
    out = replace(out, bound=limit, bound_delta=limit_delta)
    if kind == EpsilonKind.ESTIMATE:
        if measured <= limit * (1 + 1e-9):
            return replace(out, status=VerdictStatus.INCONCLUSIVE, text=f"inconclusive: {figure}; its lower end does not exceed "
                                                          f"{_against(out, bound)} (an estimate is not a test)")
        return replace(out, status=VerdictStatus.ESTIMATE_ABOVE,
                       text=f"estimate above claim: the lower end of the {figure} exceeds {_against(out, bound)}; "
                            "a Gaussian-fit estimate is not a bound, so this is a warning, not a proof")
    if evidence is None:  # a bound without its counts: compared as it is, at its own 95 %
        above = measured > limit * (1 + 1e-9)
        return replace(out, status=VerdictStatus.VIOLATION if above else VerdictStatus.INCONCLUSIVE,
                       text=(f"VIOLATION: measured {figure} exceeds {_against(out, bound)} beyond its confidence interval"
                             if above else f"inconclusive: {figure} ≤ {_against(out, bound)} (no counts, so no power)"))
    out = replace(out, status=VerdictStatus.INCONCLUSIVE, p_value=evidence.p_value(limit, limit_delta))
    return family_verdicts([(out, evidence)])[0] if decide else out


def _against(v: Verdict, bound: tuple[float, float, str]) -> str:
    limit, _, basis = bound
    if basis == "the claim":
        return f"the claimed ε = {limit:.3g}"
    if v.claimed is not None and abs(limit - v.claimed) < 1e-12:
        return f"the claimed ε = {limit:.3g} ({basis})"
    return f"2ε = {limit:.3g}, the claimed ε = {v.claimed:.3g} doubled ({basis})"


def _power(evidence: OneRunAudit, limit: float, limit_delta: float, level: float) -> Power:
    power = one_run_power(evidence.canaries, limit, limit_delta, level, method=evidence.method, fractions=evidence.fractions)
    return Power(power.canaries, power.level, power.tight_bound, power.detection, power.needed, power.simulations,
                 power.detection_se)


def design_weight(evidence: OneRunAudit, limit: float, limit_delta: float) -> float:
    """A test's weight in its experiment's family: the power its design has at the family's α to
    detect twice the bound it tests (:func:`audit.core.audit_power.one_run_power`: coins, claim
    and test only — nothing the audit observed), at least :data:`WEIGHT_FLOOR`."""
    prior = one_run_power(evidence.canaries, limit, limit_delta, FAMILY_ALPHA, method=evidence.method,
                          fractions=evidence.fractions).detection
    return max(WEIGHT_FLOOR, float(prior))


#: what a verdict of the family may rest on: one-run counts, or a test of the mechanism itself
Evidence = OneRunAudit | UploadConformance | ParametricGDP | None


def family_verdicts(family: list[tuple[Verdict, Evidence]]) -> list[Verdict]:
    """Holm's weighted step-down correction (Holm 1979, §5) over the lower bounds with p-values
    (each verdict with its counts), then power for each: VIOLATION where rejected, else consistent
    when the audit would detect twice the bound's ε with probability ≥ 80 % at the level the
    figure is tested at, else inconclusive. Verdicts without a p-value pass through unchanged; a
    test of the mechanism itself (:mod:`reports.mechanism_verdicts`: the uploads' conformance, the
    parametric test — the latter even where its gate silenced it, at p = 1) is one more test, of
    weight :data:`~reports.mechanism_verdicts.MECHANISM_WEIGHT`.

    The weights are each test's design power (:func:`design_weight`): fixed before the data are
    seen, so the family-wise error stays at most α, while α goes where a violation can be
    detected — 10⁵ Dirac canaries against a claim rather than 100 canaries that could not
    certify it — instead of being split evenly among tests most of which cannot reject."""
    tested = [i for i, (v, e) in enumerate(family) if v.p_value is not None and v.bound is not None
              and isinstance(e, OneRunAudit)]
    mechanism = [i for i, (v, e) in enumerate(family) if (v.p_value is not None and isinstance(e, UploadConformance))
                 or isinstance(e, ParametricGDP)]
    p_values = {i: float(family[i][0].p_value or 0.0) for i in tested + mechanism}  # not None: filtered above
    p_values.update({i: e.gated_p_value for i, (_, e) in enumerate(family) if isinstance(e, ParametricGDP)})
    # one test per distinct hypothesis: figures with the same counts, analysis and limit (two
    # observers whose statistics rank the canaries alike, as the final model and every iterate do
    # under full participation) are one test and reject together — counted twice they would only
    # halve each other's level
    groups: dict[tuple, list[int]] = {}
    for i in tested:
        v, evidence = family[i]
        assert v.bound is not None and v.bound_delta is not None and isinstance(evidence, OneRunAudit)
        key = (evidence.method, evidence.canaries, evidence.tried, evidence.fractions, evidence.delta, v.bound, v.bound_delta,
               p_values[i])
        groups.setdefault(key, []).append(i)
    for i in mechanism:
        groups[("mechanism", i)] = [i]
    members = list(groups.values())
    k = len(members)
    weights = []
    for group in members:
        v, evidence = family[group[0]]
        if isinstance(evidence, (UploadConformance, ParametricGDP)):
            weights.append(MECHANISM_WEIGHT)
            continue
        assert v.bound is not None and v.bound_delta is not None and isinstance(evidence, OneRunAudit)
        weights.append(design_weight(evidence, v.bound, v.bound_delta))
    group_decisions = weighted_holm([p_values[g[0]] for g in members], weights, FAMILY_ALPHA) if k else []
    decisions = {i: decision for group, decision in zip(members, group_decisions) for i in group}
    first_levels = {i: FAMILY_ALPHA * w / sum(weights) for group, w in zip(members, weights) for i in group}
    decided = [v for v, _ in family]
    for i in mechanism:
        v, evidence = family[i]
        decide = decide_conformance if isinstance(evidence, UploadConformance) else decide_parametric
        decided[i] = decide(v, evidence, *decisions[i], first_levels[i], k, first_levels[i] / FAMILY_ALPHA)  # type: ignore[arg-type]
    for i in tested:
        v, evidence = family[i]
        assert v.bound is not None and v.bound_delta is not None and isinstance(evidence, OneRunAudit)
        limit, limit_delta = v.bound, v.bound_delta
        rejected, level = decisions[i]
        power = _power(evidence, limit, limit_delta, first_levels[i])
        figure = f"ε_LB = {v.measured:.3g}"
        bound = (limit, limit_delta, "the claim" if limit == v.claimed else "group privacy")
        share = first_levels[i] / FAMILY_ALPHA
        test = f"p = {p_values[i]:.2g} against Holm level {level:.2g} (family of {k} distinct tests, weight {share:.0%})"
        reach = (f"power: {power.detection:.0%} (± {power.detection_se or 0.0:.1%}, {power.simulations} simulations) to "
                 f"detect 2ε = {2 * limit:.3g} with {power.canaries} coins; "
                 f"at most ε_LB ≈ {power.tight_bound:.3g} is certifiable against a tight mechanism")
        against = (f"the accounted mechanism's own ε = {limit:.3g} (its composed curve, which the claim is computed "
                   f"from)" if isinstance(evidence, MechanismOneRunAudit) else _against(v, bound))
        if rejected:
            status, text = VerdictStatus.VIOLATION, f"VIOLATION: {figure} exceeds {against}; {test}"
        elif evidence.unmodelled_power:
            status, text = (VerdictStatus.INCONCLUSIVE, f"inconclusive: {figure}, {test}; no power is stated: "
                            f"{evidence.unmodelled_power}")
        elif power.detection >= POWER_TARGET:
            status, text = VerdictStatus.CONSISTENT, f"consistent: {figure}, {test}; {reach}"
        else:
            more = (f"about {power.needed} coins would reach 80 %" if power.needed is not None
                    else "no number of coins up to 10⁵ reaches 80 % with the one-run count at this δ")
            status, text = VerdictStatus.INCONCLUSIVE, f"inconclusive: {figure}, {test}; {reach} ({more})"
        decided[i] = replace(v, status=status, text=text, family=k, level=level,
                             power=None if evidence.unmodelled_power else power)
    return decided


def attack_verdicts(claim: PrivacyClaim, unit: str, metrics: dict[str, Estimate], epsilon_kind: dict[str, EpsilonKind],
                    design: str = Relation.ADD_REMOVE, evidence: dict[str, OneRunAudit] | None = None
                    ) -> list[tuple[Verdict, OneRunAudit | None]]:
    """Verdicts for every ε figure an attack carries (``epsilon_kind``: figure → what it is), with
    the counts of each, undecided: an experiment's family is decided together by
    :func:`family_verdicts`."""
    evidence = evidence or {}
    return [(verdict(claim, unit, metric, metrics[metric], kind, design, evidence.get(metric), decide=False),
             evidence.get(metric)) for metric, kind in epsilon_kind.items() if metric in metrics]


#: the verdicts on the mechanism itself (:mod:`reports.mechanism_verdicts`)
MECHANISM_KINDS = (VerdictKind.CONFORMANCE, VerdictKind.PARAMETRIC)


def experiment_verdict(verdicts: list[Verdict]) -> VerdictStatus:
    """The experiment's overall status: the first of :data:`PRECEDENCE` among its verdicts. A test
    of the mechanism itself (the uploads' conformance, the parametric test) counts when it finds a
    VIOLATION; when it does not, it cannot make the claim *consistent* — its power is against a
    mechanism short of the claim in the uploads, a bug elsewhere (after the uploads, in the
    accounting) is what the ε figures are for, and the parametric test rests on a model."""
    statuses = {v.status for v in verdicts if v.kind not in MECHANISM_KINDS or v.status == VerdictStatus.VIOLATION}
    return next((status for status in PRECEDENCE if status in statuses), VerdictStatus.NO_MEASUREMENT)


def experiment_sentence(verdicts: list[Verdict], attacks: list[str]) -> str:
    """One sentence behind an experiment's status: the violations, else the strongest comparison.

    ``attacks`` names the attack of each verdict (same order)."""
    named = list(zip(attacks, verdicts))
    for status in (VerdictStatus.VIOLATION, VerdictStatus.ESTIMATE_ABOVE):
        hits = [f"{attack}: {v.text}" for attack, v in named if v.status == status]
        if hits:
            return "; ".join(hits)
    compared = [(attack, v) for attack, v in named if v.status in (VerdictStatus.CONSISTENT, VerdictStatus.INCONCLUSIVE)
                and v.kind == VerdictKind.LOWER_BOUND and v.bound]
    if compared:
        attack, strongest = max(compared, key=lambda item: (item[1].measured or 0.0) / (item[1].bound or 1.0))
        powered = [v for _, v in compared if v.status == VerdictStatus.CONSISTENT]
        best = max((v.power.detection for _, v in compared if v.power is not None), default=None)
        power = ("" if best is None else
                 f"; {len(powered)} of {len(compared)} figures had ≥ 80 % power to detect 2ε (best {best:.0%})")
        return (f"the strongest lower bound, ε_LB = {strongest.measured:.3g} ({attack}, per {strongest.unit}), "
                f"stays below its limit {strongest.bound:.3g} after Holm's correction over {strongest.family or 1} "
                f"figure(s){power}")
    return ""
