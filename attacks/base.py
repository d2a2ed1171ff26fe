"""The Attack interface and the registry of attacks.

Three kinds of attack share one registry, :data:`ATTACKS`:

* :class:`MembershipAttack` scores the units of a membership experiment
  (:class:`attacks.membership_experiment.MembershipExperiment`: LiRA, Shokri, threshold attacks,
  canary queries);
* :class:`attacks.canaries.canary_audit.CanaryAudit` trains its own runs with canaries inserted and
  turns the canaries' statistics into empirical ε (one-run audits, Gaussian fit);
* :class:`RunAttack` attacks one trained run as the server holds it
  (:class:`attacks.target_run.TargetRun`): reconstruction from uploads, model inversion, attribute
  and property inference.

Each returns :class:`attacks.attack_result.AttackResult` objects. docs/how-to/add-an-attack.md shows how
to write one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

import numpy as np

from attacks.attack_result import AttackResult
from attacks.membership_experiment import MembershipExperiment
from attacks.membership_metrics import ONE_RUN_FIGURES, design_coins, gdp_note, membership_metrics
from attacks.target_run import TargetRun
from audit.core.registry import Registry
from audit.core.vocabulary import AttackKind, EpsilonKind, Relation


@dataclass(frozen=True)
class Setting:
    """One experiment of the audit as planning knows it before training: what an attack's
    parameters are checked against (:meth:`Attack.check`), so that a round, client, fold or class
    the experiment does not have is refused before any work, not found after training."""

    rounds: int  # training rounds of the experiment
    clients: int  # clients of every run
    runs: int  # membership runs
    dataset: Any  # audit.core.dataset_types.Dataset: name, num_classes, input_shape, attribute_values


class Attack:
    """Anything listed under ``attacks:``; see :class:`MembershipAttack` and ``CanaryAudit``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    Params: ClassVar[type]
    #: the fewest membership runs the attack can work with (each target needs references)
    min_runs: ClassVar[int] = 2
    #: membership attacks score the membership runs; canary audits train runs of their own
    kind: ClassVar[AttackKind] = AttackKind.MEMBERSHIP

    params: Any
    label: str

    def __init__(self, params: Any = None, label: str | None = None):
        # an attack is a value shared by every experiment of a plan: set once, here
        object.__setattr__(self, "params", params if params is not None else self.Params())
        object.__setattr__(self, "label", label or self.name)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"{type(self).__name__}.{name}: an attack is an immutable value shared by every experiment "
                             "of a plan; keep what one experiment derives in that experiment's own records")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__}.{name}: an attack is an immutable value")

    def check(self, field_path: str, setting: Setting) -> None:
        """Reject params that do not fit the experiment ``setting`` (one line naming the field
        under ``field_path``, e.g. ``attacks[2].params.round``); called in planning for every
        experiment the attack will run on."""

    def rounds_needed(self, total_rounds: int) -> str | tuple[int, ...]:
        """Global models (besides the final one) the runs must store for this attack."""
        rounds = getattr(self.params, "rounds", "final")
        if rounds in ("final", "all"):
            return "none" if rounds == "final" else "all"
        return tuple(int(r) for r in rounds)

    def uploads_needed(self, total_rounds: int) -> str | tuple[int, ...]:
        """Rounds whose server view (uploads, aggregate) the runs must store."""
        return "none"


class MembershipAttack(Attack):
    """A membership-inference attack over a :class:`MembershipExperiment`."""

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        raise NotImplementedError

    def result(self, variant: str, experiment: MembershipExperiment, record_scores: np.ndarray, notes: str,
               records: np.ndarray | None = None, independent: tuple[np.ndarray, np.ndarray] | None = None,
               run_groups: np.ndarray | None = None) -> AttackResult:
        """Turn record scores [targets, records] into a result at the attack's unit; ``records``
        names the columns when only some records were attacked (whole clients, for the client unit).

        ``independent`` = (row indices, record scores of those rows) whose scores use no row of
        the set's membership (e.g. targets scored from reference runs outside the set): their
        inclusion coins feed the one-run ε bound. Default: the last target run alone, whose
        leave-one-out scores use only the other runs' membership. ``run_groups``: runs whose scores
        share an attack model (folds), resampled together by the intervals.
        """
        unit = experiment.resolve_unit(getattr(self.params, "unit", "auto"))
        rows, row_scores = independent if independent is not None else (np.array([experiment.runs - 1]), record_scores[-1:])
        scores, truth, covered = self._unit_scores(experiment, record_scores, unit, records)
        bound_scores, bound_truth, _ = self._unit_scores(experiment, row_scores, unit, records, rows)
        coins = design_coins(bound_scores[:, covered], bound_truth[:, covered], experiment.relation, unit, experiment.inclusion)
        if experiment.relation == Relation.REPLACE_ONE and not covered.all():
            coins = None  # pairs need both clients scored
        metrics, roc, evidence = membership_metrics(scores, truth, experiment.seed, delta=experiment.deltas.get(unit, 0.0),
                                                    coins=coins, run_groups=run_groups)
        note = f"one-run ε over {len(rows)} target run(s) scored without each other's membership{gdp_note(evidence)}"
        if coins is None:
            note = f"no one-run ε: it needs independent coins of probability ½ (inclusion {experiment.inclusion:g})"
        return AttackResult(self.label, variant, unit, scores, truth, metrics, roc, f"{notes}; {note}",
                            dict.fromkeys(ONE_RUN_FIGURES, EpsilonKind.LOWER_BOUND), relation=experiment.relation,
                            evidence=evidence)

    @staticmethod
    def _unit_scores(experiment: MembershipExperiment, record_scores: np.ndarray, unit: str, records: np.ndarray | None,
                     rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        truth = experiment.truth(unit)
        if rows is not None:
            truth = truth[rows]
        if records is None:
            scores = experiment.to_unit(record_scores, unit)
            return scores, truth, np.ones(scores.shape[1], dtype=bool)
        full = np.full((record_scores.shape[0], experiment.keep.shape[1]), np.nan)
        full[:, records] = record_scores
        scores = experiment.to_unit(full, unit)
        covered = ~np.isnan(scores).any(0)
        if rows is not None:
            return scores, truth, covered
        return scores[:, covered], truth[:, covered], covered


ATTACKS: Registry[type[Attack]] = Registry("attack", base=Attack)


class RunAttack(Attack):
    """An attack on one trained run (:class:`TargetRun`); see the module docstring."""

    kind = AttackKind.RUN
    min_runs = 1

    def not_applicable(self, defense: Any, dataset: Any) -> str | None:
        """Why this attack cannot run on ``defense`` with ``dataset`` (None when it can)."""
        return None

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        raise NotImplementedError
