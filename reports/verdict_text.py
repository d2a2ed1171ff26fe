"""The report's sentences: what each configuration's verdicts, findings and settings say in words,
and the names of its figures and observers. The HTML page (:mod:`reports.html`), the sweep page and
the console summary of a command all print these, so that they say the same thing.
"""

from __future__ import annotations

import math
import typing
from typing import TYPE_CHECKING, Any

from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Observer, Unit, VerdictKind, VerdictStatus
from defenses.privacy.claims import PrivacyClaim
from reports.document import AttackRecord, Experiment, Results, Verdict

if TYPE_CHECKING:
    from reports import plots
else:  # matplotlib is imported with the first figure (audit.core.lazy_modules)
    plots = lazy_module("reports.plots")

MAIN_ATTACK_ORDER = ("lira-online", "lira-offline")
#: short names of the ε figures in the attack tables
EPSILON_NAMES = {"epsilon_one_run": "one-run", "epsilon_one_run_fdp": "one-run f-DP", "epsilon_gaussian_fit": "Gaussian fit",
                 "upload_conformance": "uploads' mechanism", "parametric_gdp": "claimed μ (parametric)"}
#: what each ε figure is, in words: the statistic and its paper (a verdict names its bound with it)
EPSILON_DESCRIPTIONS = {
    "epsilon_one_run": "the one-run count's ε lower bound (Steinke, Nasr & Jagielski 2023)",
    "epsilon_one_run_fdp": "the f-DP ε lower bound from the same one-run counts (Mahloujifar, Melis & Chaudhuri 2024)",
    "epsilon_gaussian_fit": "the Gaussian-fit ε estimate (Andrew et al. 2024)",
    "upload_conformance": "the test of the canary uploads' clip and noise against the claimed mechanism",
    "parametric_gdp": "the gated parametric test of the claimed μ on Gaussian canary scores (estimate-based)",
}
#: every status a verdict cell can show, as its badge says it (the status itself where not listed)
BADGE_TEXT: dict[str, str] = {VerdictStatus.VIOLATION: "VIOLATION"}


def badge_text(status: str) -> str:
    """What a verdict's badge says: :data:`BADGE_TEXT`, else the status itself."""
    return BADGE_TEXT.get(status, str(status))


#: the observers a claim speaks of, in words
OBSERVER_NAMES = {Observer.RELEASED: "released models", Observer.SERVER: "the server", Observer.LOCAL: "one upload alone"}


def _leak_metric(experiment: Experiment) -> tuple[str, float] | None:
    for name in MAIN_ATTACK_ORDER:
        for attack in experiment.attacks:
            if attack.attack == name and "auc" in attack.metrics and attack.metrics["auc"].value is not None:
                return name, attack.metrics["auc"].value
    return None


def accuracy_interval(accuracy: float, test_size: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Clopper–Pearson interval of a test accuracy measured on ``test_size`` records
    (:func:`audit.core.metrics.clopper_pearson` of round(accuracy · n) correct of n): how far from
    the accuracy the model's true accuracy may lie, from the test set's size alone."""
    from audit.core.metrics import clopper_pearson

    trials = max(int(test_size), 0)
    return clopper_pearson(min(max(round(accuracy * trials), 0), trials), trials, confidence)


def chance_text(chance: dict[str, Any] | None) -> str:
    """The chance level in words, e.g. ``chance 10.1 % (the most common of 10 classes in the test set)``."""
    if not chance:
        return "chance level not recorded"
    classes = f"the most common of {chance['classes']} classes" if chance.get("classes") else "the most common class"
    return f"chance {100 * chance['accuracy']:.1f} % (always predicting {classes} in the test set)"


def _best_trade_off(experiments: list[Experiment], test_size: int, chance: dict[str, Any] | None) -> str | None:
    """The private configuration with the best accuracy among those whose claim no measurement
    contradicts and whose accuracy is clearly above chance (the lower end of its Clopper–Pearson
    interval over the ``test_size`` test records above the chance accuracy), and the smallest
    claimed ε that reaches within 1 point of it. When no private configuration is distinguishable
    from chance, the sentence says so; without a recorded chance level it claims no trade-off."""
    # compared as floats: an integer accuracy from a hand-edited results.json (2⁶⁴ − 1) rounds up
    # when 0.01 is subtracted, and the best itself would no longer be "near" the best
    accuracy = {e.key: float(typing.cast(float, e.utility.test_accuracy.value)) for e in experiments
                if e.claim.is_private and finite_number(e.utility.test_accuracy.value)
                and e.soundness != VerdictStatus.VIOLATION and e.diverged is None}
    private = [e for e in experiments if e.key in accuracy]
    if not private:
        return None
    if not chance or not finite_number(chance.get("accuracy")) or test_size <= 0:
        highest = max(private, key=lambda e: accuracy[e.key])
        return (f"Highest private test accuracy: {highest.label}, {100 * accuracy[highest.key]:.1f} % "
                f"({chance_text(chance)}, so no privacy–utility trade-off is claimed: compare it with the accuracy of "
                "always predicting the most common class).")
    interval = {key: accuracy_interval(value, test_size) for key, value in accuracy.items()}
    above = [e for e in private if interval[e.key][0] > float(chance["accuracy"])]
    if not above:
        shown = [f"{e.label} {100 * accuracy[e.key]:.1f} % [{100 * interval[e.key][0]:.1f} %, {100 * interval[e.key][1]:.1f} %]"
                 for e in private[:4]]
        more = f" and {len(private) - 4} more" if len(private) > 4 else ""
        return (f"No private configuration is distinguishable from chance: {'; '.join(shown)}{more} — each 95 % "
                f"Clopper–Pearson interval (over {test_size} test records) includes {chance_text(chance)}. So no "
                "privacy–utility trade-off is reported: at these settings the private models learned nothing "
                "measurable.")
    best = max(accuracy[e.key] for e in above)
    choice = min((e for e in above if accuracy[e.key] >= best - 0.01), key=lambda e: e.claim.epsilon)
    low, high = interval[choice.key]
    return (f"Best privacy–utility trade-off: {choice.label} — test accuracy {100 * accuracy[choice.key]:.1f} % "
            f"[{100 * low:.1f} %, {100 * high:.1f} %] at claimed ε = {choice.claim.epsilon:.3g} per {choice.claim.unit} "
            f"({chance_text(chance)}; the smallest ε within 1 point of the best private accuracy, among claims no "
            "measurement contradicts and accuracies clearly above chance).")


def finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def named_figure(attack: AttackRecord, verdict: Verdict) -> str:
    """Which bound a verdict is about, in words: the attack, what it observes and which ε figure,
    e.g. ``flower-client-canaries (observes the final model), the one-run count's ε lower bound
    (Steinke, Nasr & Jagielski 2023)``."""
    observes = f" (observes {_observation_words(attack.observation)})" if attack.observation else ""
    return f"{attack.attack}{observes}, {EPSILON_DESCRIPTIONS.get(verdict.metric, verdict.metric)}"


def _observation_words(observation: str) -> str:
    return {"final model": "the final model", "all iterates": "every round's global model",
            "each upload": "each upload the server receives"}.get(str(observation), str(observation))


def violation_lines(experiment: Experiment, status: VerdictStatus = VerdictStatus.VIOLATION) -> list[str]:
    """One sentence per verdict of ``status`` (a VIOLATION, or an estimate above its claim) of
    ``experiment``, each naming its bound (:func:`named_figure`): the same ε_LB read by two
    analyses, or seen by two observers, is never the same sentence twice."""
    lines = []
    for attack in experiment.attacks:
        for v in attack.verdicts:
            if v.status != status:
                continue
            if status == VerdictStatus.VIOLATION and v.measured is not None and v.bound is not None:
                test = (f"; p = {v.p_value:.2g} < Holm level {v.level:.2g}"
                        if v.p_value is not None and v.level is not None else "")
                lines.append(f"{named_figure(attack, v)}: ε_LB = {v.measured:.3g} > ε = {v.bound:.3g} the claim allows "
                             f"per {v.unit}{test}.")
            else:  # an estimate above its claim, or a violation without its figures: the verdict's own sentence
                lines.append(f"{named_figure(attack, v)}: {v.text}.")
    return lines


def verdict_lines(experiment: Experiment) -> list[str]:
    """The verdict for a console: ``verdict: STATUS — sentence``, or for a VIOLATION the status and
    then one line per rejected test naming its bound (:func:`violation_lines`), so that two bounds
    that both reject are never printed as the same unnamed sentence."""
    named = violation_lines(experiment) if experiment.soundness == VerdictStatus.VIOLATION else []
    if not named:
        return [f"verdict: {experiment.soundness} — {experiment.soundness_text}"]
    return [f"verdict: {experiment.soundness} — {len(named)} test(s) reject the claim after Holm's correction:",
            *(f"  {line}" for line in named)]


def finding_entries(results: Results, chance: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The findings across configurations, most important first, each ``{"text", "items"}`` (items:
    the sentences under it, e.g. one per violating bound, each named): violations, warnings,
    divergence, how many configurations are consistent or inconclusive, the most leaky one, the
    best trade-off — claimed only for accuracies clearly above ``chance`` (``{"accuracy",
    "classes"}``: the accuracy of always predicting the test set's most common class; None: not
    recorded, and no trade-off is claimed)."""
    lines: list[Any] = []
    experiments = results.experiments
    violated = [e for e in experiments if e.soundness == VerdictStatus.VIOLATION]
    warned = [e for e in experiments if e.soundness == VerdictStatus.ESTIMATE_ABOVE]
    for experiment in violated:
        named = violation_lines(experiment)
        lines.append({"text": f"Soundness VIOLATION — {experiment.label}: {len(named)} test(s) reject the claim after "
                              "Holm's correction over the configuration's family of tests:", "items": named})
    for experiment in warned:
        lines.append({"text": f"Soundness warning — {experiment.label}: an estimate lies above the claim (a warning, "
                              "not a proof):", "items": violation_lines(experiment, VerdictStatus.ESTIMATE_ABOVE)})
    for experiment in experiments:
        if experiment.diverged is not None:
            where = experiment.diverged
            lines.append(f"Training diverged — {experiment.label}: membership run {where.run} stopped at round "
                         f"{where.round} ({where.what}); its attacks were skipped.")
    checked = [e for e in experiments if e.soundness == VerdictStatus.CONSISTENT]
    if not violated and checked:
        lines.append(f"No measured ε lower bound contradicts a claim: {len(checked)} of {len(experiments)} "
                     "configurations checked and consistent, by audits with at least 80 % power to detect twice the "
                     "claimed ε.")
    unpowered = [e for e in experiments if e.soundness == VerdictStatus.INCONCLUSIVE]
    if unpowered:
        lines.append(f"Inconclusive — {', '.join(e.label for e in unpowered)}: no violation found, but the audit could "
                     "not have detected a mechanism twice as leaky as claimed with 80 % probability (see each verdict's "
                     "power), so this is not evidence that the claim holds.")
    leaks = [(e, metric) for e in experiments if (metric := _leak_metric(e)) is not None]
    if leaks:
        worst, (attack, value) = max(leaks, key=lambda item: item[1][1])
        lines.append(f"Most leaky configuration: {worst.label} ({attack} AUC {value:.3f}; 0.5 is chance).")
    trade_off = _best_trade_off(experiments, results.audit.test_size, chance)
    if trade_off:
        lines.append(trade_off)
    return [line if isinstance(line, dict) else {"text": line, "items": []} for line in lines]


def finding_lines(results: Results, chance: dict[str, Any] | None = None) -> list[str]:
    """:func:`finding_entries` as sentences, each with the sentences under it."""
    return [" ".join([entry["text"], *entry["items"]]) for entry in finding_entries(results, chance)]


def configuration_lines(results: Results) -> list[str]:
    """Each configuration in one sentence (utility, claim, main leakage, soundness), plus what a
    client-level claim means for a single record."""
    lines = []
    for experiment in results.experiments:
        claim, accuracy = experiment.claim, experiment.utility.test_accuracy
        claim_text = ("no DP claim" if not claim.is_private else
                      f"claims ({claim.epsilon:.3g}, {claim.delta:.1e})-DP per {claim.unit} [{claim.accountant}]"
                      + _observers_text(claim))
        acc_text = "accuracy n/a" if accuracy.value is None else f"test accuracy {100 * accuracy.value:.1f} %"
        if experiment.diverged is not None:
            acc_text = f"training diverged at round {experiment.diverged.round}"
        leak = _leak_metric(experiment)
        leak_text = "" if leak is None else f"; {leak[0]} AUC {leak[1]:.3f}"
        lines.append(f"{experiment.label}: {acc_text}, {claim_text}{leak_text}; soundness: {experiment.soundness}.")
        if claim.is_private and claim.unit == Unit.CLIENT:
            lines.append(f"{experiment.label}: the claim protects whole clients; a single record is covered through "
                         f"group privacy (one record changes one client's data: at most 2ε = {2 * claim.epsilon:.3g}).")
    return lines


def summary_lines(results: Results, chance: dict[str, Any] | None = None) -> list[str]:
    """The verdicts in words, most important first: :func:`finding_lines`, then
    :func:`configuration_lines`."""
    return finding_lines(results, chance) + configuration_lines(results)


def _observers_text(claim: PrivacyClaim) -> str:
    """' against the released models; against the server ε = 9.1, one upload alone ε = 60' (headline first)."""
    names = {Observer.RELEASED: "the released models", Observer.SERVER: "the server", Observer.LOCAL: "one upload alone"}
    others = []
    for entry in claim.adversaries:
        if entry.adversary == claim.adversary:
            continue
        figure = f"ε = {entry.epsilon:.3g}" if entry.covered else "not covered"
        others.append(f"{names.get(entry.adversary, entry.adversary)} {figure}")
    headline = names.get(claim.adversary, "")
    return (f" against {headline}" if headline else "") + (f"; against {', '.join(others)}" if others else "")


def power_percent(detection: float) -> str:
    """A detection probability as the report prints it: ``12 %``."""
    return f"{100 * detection:.0f} %"


def verdict_parts(verdict: Verdict) -> tuple[str, str]:
    """One ε figure's verdict as its badge's word and a few words after it, e.g. ``("VIOLATION",
    "p = 0.0004 < 0.013")`` or ``("inconclusive", "below claim, power 12 %")``; the detail is "" where
    the status says it all. Power is given only where no violation was found: there it says how
    likely the audit was to find one (against twice the claimed ε); beside a violation it would
    read as a contradiction."""
    status = verdict.status
    word = badge_text(status)
    if status == VerdictStatus.VIOLATION:
        if verdict.p_value is not None and verdict.level is not None:
            return word, f"p = {verdict.p_value:.2g} < {verdict.level:.2g}"
        return word, f"ε_LB = {plots.format_number(verdict.measured, 2)} > {plots.format_number(verdict.bound, 2)}"
    if status in (VerdictStatus.CONSISTENT, VerdictStatus.INCONCLUSIVE):
        if verdict.kind == VerdictKind.CONFORMANCE:
            return word, ("clip and noise as claimed" if status == VerdictStatus.CONSISTENT else
                          "no departure found, power < 80 %")
        if verdict.kind == VerdictKind.PARAMETRIC:
            return word, "no departure, estimate-based"
        if verdict.kind == VerdictKind.ESTIMATE:
            return word, "estimate within claim, not a test"
        below = ("below claim" if verdict.measured is None or verdict.bound is None or verdict.measured <= verdict.bound
                 else "above claim, not significant after Holm")
        if verdict.power is None:
            return word, f"{below}, no counts: power unknown"
        return word, f"{below}, power {power_percent(verdict.power.detection)}"
    if status == VerdictStatus.ESTIMATE_ABOVE:
        return word, "a warning, not a proof"
    if status == VerdictStatus.VACUOUS:
        return word, "δ′ ≥ 1 rules out nothing"
    return word, ""  # not covered, no claim, no measurement: the status says it all


def short_verdict(verdict: Verdict) -> str:
    """One ε figure's verdict in a few words, e.g. ``VIOLATION (p = 0.0004 < 0.013)`` or
    ``inconclusive (below claim, power 12 %)`` (:func:`verdict_parts`); the full sentence is
    ``verdict.text``."""
    word, detail = verdict_parts(verdict)
    return f"{word} ({detail})" if detail else word


#: the metrics of the attack tables' columns, with the FPR a TPR column is read at
