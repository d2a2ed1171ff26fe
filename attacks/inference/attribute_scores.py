"""Scoring guesses of a categorical attribute against the truth, beside a reference guess.

Per guess (on the target records of attribute inference, :mod:`attacks.inference.attribute_inference`):
accuracy with a Clopper–Pearson interval; macro-F1 (over the values present in the truth or the
guesses, as scikit-learn averages it) with a percentile bootstrap interval; and the
**advantage** = accuracy − the reference's accuracy (the no-model baseline on the other
features and the true label, as ART's ``AttributeInferenceBaselineTrueLabel``). Both guesses concern the same records, so the
advantage interval is a *paired* bootstrap: each resample of records counts the difference of the two
correct-indicators on the same records, so the records' common difficulty cancels (a guess
equal to the reference gets exactly [0, 0]). The same resamples (one seed, stream
``(seed, "attribute-inference", "bootstrap")``) serve every guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from audit.core.metrics import IntervalEstimate, clopper_pearson
from audit.core.seeding import numpy_rng

#: bootstrap resamples are drawn in blocks of at most this many (resample × record) counts
_BOOTSTRAP_BLOCK = 4_000_000


@dataclass(frozen=True)
class AttributeAttackScores:
    """How well one guess of the attribute did on the target records."""

    accuracy: IntervalEstimate  # Clopper–Pearson interval
    macro_f1: IntervalEstimate  # percentile bootstrap interval
    advantage: IntervalEstimate  # accuracy − baseline accuracy, paired percentile bootstrap interval
    predictions: np.ndarray = field(repr=False)  # guessed attribute code per target record


def _bootstrap_blocks(records: int, resamples: int, seed: int):
    """Multinomial resampling counts [block, records] (how often each record is drawn), in
    blocks; the same seed gives the same resamples, which is what pairs the attacks."""
    rng = numpy_rng(seed, "attribute-inference", "bootstrap")
    block = max(1, _BOOTSTRAP_BLOCK // max(records, 1))
    done = 0
    while done < resamples:
        size = min(block, resamples - done)
        yield rng.multinomial(records, np.full(records, 1.0 / records), size=size).astype(np.float64)
        done += size


def _macro_f1(weights: np.ndarray, truth: np.ndarray, predictions: np.ndarray, num_values: int) -> np.ndarray:
    """Macro-F1 for each row of record weights [resamples, records] (all ones: the plain value),
    averaged over the values that occur in the (resampled) truth or guesses, as scikit-learn does."""
    f1 = np.zeros((weights.shape[0], num_values))
    present = np.zeros_like(f1, dtype=bool)
    for value in range(num_values):
        hit, guessed = truth == value, predictions == value
        tp = weights @ (hit & guessed)
        fp = weights @ (~hit & guessed)
        fn = weights @ (hit & ~guessed)
        denominator = 2 * tp + fp + fn
        present[:, value] = denominator > 0
        f1[:, value] = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)
    return (f1 * present).sum(1) / np.maximum(present.sum(1), 1)


def score_guesses(truth: np.ndarray, predictions: np.ndarray, reference: np.ndarray, num_values: int,
                  seed: int, resamples: int = 2000, confidence: float = 0.95) -> AttributeAttackScores:
    """Accuracy (Clopper–Pearson), macro-F1 (percentile bootstrap) and the advantage over the
    ``reference`` guesses on the same records (paired percentile bootstrap, same seed ⇒ same
    resamples for every attack)."""
    truth, predictions, reference = (np.asarray(a, dtype=np.int64) for a in (truth, predictions, reference))
    if not (truth.shape == predictions.shape == reference.shape) or truth.ndim != 1:
        raise ValueError("truth, predictions and reference must be 1-D arrays of one length")
    records = len(truth)
    correct, reference_correct = predictions == truth, reference == truth
    hits = int(correct.sum())
    accuracy = IntervalEstimate(hits / records if records else float("nan"), *clopper_pearson(hits, records, confidence))
    difference = correct.astype(np.float64) - reference_correct
    f1_samples, advantage_samples = [], []
    if records:
        for weights in _bootstrap_blocks(records, resamples, seed):
            f1_samples.append(_macro_f1(weights, truth, predictions, num_values))
            advantage_samples.append(weights @ difference / records)
    tail = 100 * (1 - confidence) / 2

    def interval(value: float, samples: list[np.ndarray]) -> IntervalEstimate:
        if not samples:
            return IntervalEstimate(value)
        pooled = np.concatenate(samples)
        return IntervalEstimate(value, float(np.percentile(pooled, tail)), float(np.percentile(pooled, 100 - tail)))

    f1 = float(_macro_f1(np.ones((1, records)), truth, predictions, num_values)[0]) if records else float("nan")
    advantage = float(difference.mean()) if records else float("nan")
    return AttributeAttackScores(accuracy, interval(f1, f1_samples), interval(advantage, advantage_samples), predictions)
