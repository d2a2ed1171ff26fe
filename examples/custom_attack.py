"""A membership attack of your own, named in a config as ``examples/custom_attack.py:LogitMargin``.

Score: the logit margin z_y − max_{j≠y} z_j of the global model on a record with label y (the
multi-class margin of Crammer & Singer 2001): memorising a record widens it. With
``calibrate: true`` the record's difficulty is subtracted — its mean margin under the reference
runs that did not train on it (Watson, Guo, Cormode, Sablayrolles 2022, §3, "difficulty
calibration") — so records every model finds easy no longer look like members.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import MembershipAttack
from attacks.membership_experiment import MembershipExperiment, TargetParams, rounds_note


@dataclass(frozen=True)
class MarginParams(TargetParams):  # TargetParams: `unit` (record/client) and `rounds` (which global models)
    calibrate: bool = field(default=False, metadata={"help": "subtract the record's mean margin under reference runs "
                                                             "that did not train on it"})


def logit_margin(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """z_y − max_{j≠y} z_j for logits [..., records, classes] (float64)."""
    logits = logits.astype(np.float64)
    records = np.arange(len(labels))
    true = logits[..., records, labels]
    logits[..., records, labels] = -np.inf
    return true - logits.max(-1)


class LogitMargin(MembershipAttack):
    name = "logit-margin"
    summary = "margin of the true label's logit over the runner-up, optionally difficulty-calibrated"
    reference = "Crammer & Singer 2001 (margin); Watson et al. 2022, On the Importance of Difficulty Calibration"
    Params = MarginParams

    def run(self, experiment: MembershipExperiment, progress=None) -> list[AttackResult]:
        labels = experiment.labels.numpy()
        rounds = experiment.round_list(self.params.rounds)  # None = the final global model
        # logits(round) is [runs, views, records, classes]; view 0 is the record itself
        margin = np.mean([logit_margin(experiment.logits(r)[:, 0], labels) for r in rounds], axis=0)  # [runs, records]
        score = "logit margin minus its mean over OUT reference runs" if self.params.calibrate else "logit margin"
        notes = f"score: {score}; {rounds_note(experiment, self.params.rounds)}"
        if not self.params.calibrate:
            # each run's scores read its own model only, no membership: every run's coins feed the ε bound
            return [self.result("", experiment, margin, notes, independent=(np.arange(experiment.runs), margin))]
        out = ~experiment.keep.astype(bool)  # [runs, records]: the run did not train on the record
        others = 1.0 - np.eye(experiment.runs)  # [target, reference]: every run but the target
        counts = others @ out
        everyone = (others @ margin) / (experiment.runs - 1)  # a record no other run left out: all of them
        difficulty = np.where(counts > 0, (others @ (out * margin)) / np.maximum(counts, 1), everyone)
        # the calibration reads the other runs' membership: by default only the last target run's
        # coins, scored from the others', feed the ε lower bound
        return [self.result("", experiment, margin - difficulty, notes)]
