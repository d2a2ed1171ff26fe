"""Threshold attacks: one statistic of the model's output on a record, thresholded.

* ``loss-threshold`` — Yeom, Giacomelli, Fredrikson, Jha 2018 ("Privacy Risk in Machine
  Learning", §3.2): members have lower loss; score = −loss.
* ``confidence-threshold`` — Salem et al. 2019 (ML-Leaks, adversary 3) / Song & Mittal 2021:
  score = the probability the model gives the record's true label.
* ``entropy-threshold`` — Salem et al. 2019: members get confident, low-entropy predictions;
  score = −entropy, or −modified entropy (Song & Mittal 2021, Eq. 4), which also uses the label.

The threshold is not chosen on the target's truth: the ``accuracy`` metric thresholds each
target run at the value that is best on the other (reference) runs; AUC and TPR at low FPR
sweep every threshold, as for every attack. With ``rounds: all`` (or a list) the statistic is
averaged over the global models of those rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from attacks import signals
from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, MembershipAttack
from attacks.membership_experiment import MembershipExperiment, TargetParams, rounds_note


@dataclass(frozen=True)
class ThresholdParams(TargetParams):
    pass


@dataclass(frozen=True)
class EntropyParams(TargetParams):
    modified: bool = field(default=False, metadata={"help": "Song & Mittal's modified entropy (uses the true label)"})


class ThresholdAttack(MembershipAttack):
    Params = ThresholdParams
    min_runs = 2  # one target and at least one reference run to choose the threshold on
    statistic: ClassVar[str] = ""

    def score(self, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Higher = more likely a member, for logits [runs, records, classes]."""
        raise NotImplementedError

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        labels = experiment.labels.numpy()
        rounds = experiment.round_list(self.params.rounds)
        total = np.zeros(experiment.keep.shape)
        for i, round_number in enumerate(rounds):
            total += self.score(experiment.logits(round_number)[:, 0], labels)
            if progress is not None:
                progress(i + 1, len(rounds))
        notes = (f"score: {self.statistic}; threshold for the accuracy chosen on the other runs; "
                 f"{rounds_note(experiment, self.params.rounds)}")
        scores = total / len(rounds)
        # the score reads the target model alone, no run's membership: every run's coins are independent
        return [self.result("", experiment, scores, notes, independent=(np.arange(experiment.runs), scores))]


@ATTACKS.register
class LossThreshold(ThresholdAttack):
    name = "loss-threshold"
    summary = "Yeom et al.'s loss threshold: members have lower loss"
    reference = "Yeom et al. 2018, Privacy Risk in Machine Learning: Analyzing the Connection to Overfitting"
    statistic = "−cross-entropy"

    def score(self, logits, labels):
        return -signals.loss(logits, labels)


@ATTACKS.register("confidence-threshold")
class ConfidenceThreshold(ThresholdAttack):
    name = "confidence-threshold"
    summary = "confidence on the true label, thresholded"
    reference = "Salem et al. 2019, ML-Leaks; Song & Mittal 2021, Systematic Evaluation of Privacy Risks of ML Models"
    statistic = "p(true label)"

    def score(self, logits, labels):
        return signals.confidence(logits, labels)


@ATTACKS.register
class EntropyThreshold(ThresholdAttack):
    name = "entropy-threshold"
    summary = "prediction entropy (or Song & Mittal's modified entropy), thresholded"
    reference = "Salem et al. 2019, ML-Leaks; Song & Mittal 2021 (modified entropy)"
    Params = EntropyParams

    @property
    def statistic(self) -> str:  # type: ignore[override]
        return "−modified entropy" if self.params.modified else "−entropy"

    def score(self, logits, labels):
        return -signals.entropy(logits, labels, modified=self.params.modified)
