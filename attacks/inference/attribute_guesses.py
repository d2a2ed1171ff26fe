"""The attribute-inference attacker's guesses (:mod:`attacks.inference.attribute_inference`).

From the model: Fredrikson et al.'s black-box rules (2014, "Privacy in Pharmacogenetics";
Fredrikson, Jha, Ristenpart 2015) — the candidate value under which the model is most confident
in the record's true label, optionally plus log π(v) (their MAP estimate) — the Bayes rule that
adds the model's evidence to a posterior from the other features, and ML-Doctor's white-box
attack model on penultimate-layer embeddings (Liu et al. 2022). Without the model: the no-model
baseline, the best of a few predictors from the other features and the true label, chosen by
cross-validation on the auxiliary records (as ART's ``AttributeInferenceBaselineTrueLabel``
reads them). Ties between candidates go to the most frequent value.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import sklearn_random_state

if TYPE_CHECKING:
    from sklearn import (
        ensemble,
        exceptions,
        linear_model,
        model_selection,
        neural_network,
        pipeline,
        preprocessing,
    )
else:  # imported when first used (audit.core.lazy_modules)
    ensemble = lazy_module("sklearn.ensemble")
    exceptions = lazy_module("sklearn.exceptions")
    linear_model = lazy_module("sklearn.linear_model")
    model_selection = lazy_module("sklearn.model_selection")
    neural_network = lazy_module("sklearn.neural_network")
    pipeline = lazy_module("sklearn.pipeline")
    preprocessing = lazy_module("sklearn.preprocessing")

#: ties between candidate scores closer than this (log-probability units) go to the prior
TIE_TOLERANCE = 1e-6


def decide(scores: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """argmax over candidates [records, values]; candidates within :data:`TIE_TOLERANCE` of the
    best count as tied and the most frequent value among them wins (lowest code on equal priors)."""
    tied = scores >= scores.max(1, keepdims=True) - TIE_TOLERANCE
    return np.argmax(np.where(tied, prior[None, :], -np.inf), axis=1)


def black_box_guesses(log_likelihoods: np.ndarray, prior: np.ndarray,
                      rule: Literal["confidence", "map"] = "confidence") -> np.ndarray:
    """Fredrikson et al.'s guess: the candidate under which the model is most confident in the
    true label (plus log π(v) for rule "map"); ties go to the most frequent value."""
    if rule == "map":
        return decide(log_likelihoods + np.log(np.maximum(prior, 1e-300)), prior)
    if rule != "confidence":
        raise ValueError(f"black-box rule must be 'confidence' or 'map', got {rule!r}")
    return decide(log_likelihoods, prior)


def bayes_guesses(log_likelihoods: np.ndarray, posterior: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """argmax_v log f(x_v)_y + log p̂(v | x₋ₐ): the model's evidence on top of the posterior from the other features."""
    return decide(log_likelihoods + np.log(np.maximum(posterior, 1e-300)), prior)


def fitted_posterior(classifier, inputs: np.ndarray, codes: np.ndarray, targets: np.ndarray, num_values: int) -> np.ndarray:
    """Fit and return the predicted distribution over all codes [targets, values]; a point mass
    on the only value when the auxiliary records hold one value."""
    posterior = np.zeros((len(targets), num_values))
    values = np.unique(codes)
    if len(values) < 2:
        posterior[:, values[0] if len(values) else 0] = 1.0
        return posterior
    classifier.fit(inputs, codes)
    posterior[:, np.asarray(classifier.classes_, dtype=np.int64)] = classifier.predict_proba(targets)
    return posterior


def white_box_posterior(aux_embeddings: np.ndarray, aux_codes: np.ndarray, target_embeddings: np.ndarray,
                        num_values: int, seed: int, hidden: Sequence[int] = (64,)) -> np.ndarray:
    """ML-Doctor's attack model: a standardised MLP from embeddings to the attribute. Early
    stopping on a stratified 10 % of the auxiliary records when every value has ≥ 10 of them."""
    counts = np.bincount(aux_codes)
    early_stopping = bool(counts[counts > 0].min() >= 10) if len(aux_codes) else False
    classifier = pipeline.make_pipeline(preprocessing.StandardScaler(), neural_network.MLPClassifier(
        hidden_layer_sizes=tuple(int(h) for h in hidden), alpha=1e-3, max_iter=300, early_stopping=early_stopping,
        n_iter_no_change=10, random_state=sklearn_random_state(seed)))
    with warnings.catch_warnings():
        # 300 epochs is the attack's fixed budget (without early stopping it always ends there)
        warnings.simplefilter("ignore", exceptions.ConvergenceWarning)
        return fitted_posterior(classifier, aux_embeddings, aux_codes, target_embeddings, num_values)


def baseline_inputs(other_features: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The baseline's inputs [records, others + classes]: the other features x₋ₐ beside the one-hot
    label y. One-hot, not the class index: a class is a category, and the attribute may depend on
    it in any order (a = y mod 2 is not monotone in y); classes absent from the records give
    constant zero columns, which neither classifier uses."""
    labels = np.asarray(labels, dtype=np.int64)
    return np.concatenate([np.asarray(other_features, dtype=np.float64), np.eye(num_classes)[labels]], axis=1)


def _baseline_classifier(seed: int, classifier: str):
    if classifier == "logistic":
        return pipeline.make_pipeline(preprocessing.StandardScaler(), linear_model.LogisticRegression(max_iter=1000))
    if classifier == "gradient-boosting":
        return ensemble.HistGradientBoostingClassifier(max_iter=200, random_state=sklearn_random_state(seed))
    raise ValueError(f"baseline classifier must be 'logistic' or 'gradient-boosting', got {classifier!r}")


def baseline_posterior(aux_inputs: np.ndarray, aux_codes: np.ndarray, target_inputs: np.ndarray, num_values: int,
                       seed: int, classifier: Literal["logistic", "gradient-boosting"] = "logistic") -> np.ndarray:
    """The no-model attacker's p̂(v | inputs): a classifier from what the attacker knows without the
    model (e.g. the other features and the one-hot label, :func:`baseline_inputs`) to the attribute."""
    return fitted_posterior(_baseline_classifier(seed, classifier), aux_inputs, aux_codes, target_inputs, num_values)


#: the no-model predictors the baseline chooses among, by what they read
BASELINE_CANDIDATES = ("other features and label", "other features", "label", "majority")


@dataclass(frozen=True)
class BaselineChoice:
    """The no-model predictor with the best cross-validated accuracy on the auxiliary records."""

    chosen: str
    accuracy: dict[str, float]  # candidate → K-fold accuracy on the auxiliary records
    folds: int
    posterior: np.ndarray  # the chosen predictor's p̂(v | ·) on the targets [targets, values]

    def describe(self) -> str:
        if not self.accuracy:
            return f"{self.chosen} (too few auxiliary records of a value to cross-validate)"
        scores = ", ".join(f"{name} {value:.3f}" for name, value in self.accuracy.items())
        return f"{self.chosen}, the best {self.folds}-fold accuracy on the auxiliary records ({scores})"


def best_baseline(aux_others: np.ndarray, aux_labels: np.ndarray, aux_codes: np.ndarray, target_others: np.ndarray,
                  target_labels: np.ndarray, num_classes: int, num_values: int, seed: int,
                  classifier: Literal["logistic", "gradient-boosting"] = "logistic", folds: int = 5) -> BaselineChoice:
    """The best guess from everything the attacker has except the model, chosen on the auxiliary
    records alone: the candidate predictors (:data:`BASELINE_CANDIDATES`: the other features with
    the one-hot label, either alone, or the majority value) are scored by stratified K-fold
    accuracy and the best one (the first on a tie) is refitted on all auxiliary records.

    Why choose: more inputs are not always a better guess from few records — a one-hot label of
    many classes can cost a classifier of 200 records more in variance than it adds (diabetes'
    sex: 72.4 % with the label, 73.8 % without) — and an advantage measured against a weaker
    baseline than the attacker could have picked credits the model with the difference."""
    inputs = {"other features and label": (baseline_inputs(aux_others, aux_labels, num_classes),
                                           baseline_inputs(target_others, target_labels, num_classes)),
              "other features": (np.asarray(aux_others, dtype=np.float64), np.asarray(target_others, dtype=np.float64)),
              "label": (np.eye(num_classes)[aux_labels], np.eye(num_classes)[target_labels])}
    counts = np.bincount(aux_codes, minlength=num_values)
    majority = int(np.argmax(counts))
    k = min(folds, int(counts[counts > 0].min()) if counts.any() else 0)
    if (counts > 0).sum() < 2 or k < 2:  # nothing to choose between: the first candidate
        aux, target = inputs[BASELINE_CANDIDATES[0]]
        return BaselineChoice(BASELINE_CANDIDATES[0], {}, 0,
                              baseline_posterior(aux, aux_codes, target, num_values, seed, classifier))
    # one set of folds for every candidate (a RandomState splitter would draw new folds on each use)
    splits = list(model_selection.StratifiedKFold(k, shuffle=True, random_state=sklearn_random_state(seed, "baseline-folds"))
                  .split(aux_codes, aux_codes))
    accuracy = {name: float(model_selection.cross_val_score(_baseline_classifier(seed, classifier), aux,
                                                            aux_codes, cv=splits).mean())
                for name, (aux, _) in inputs.items()}
    accuracy["majority"] = float(np.mean([np.mean(aux_codes[test] == majority) for _, test in splits]))
    chosen = max(BASELINE_CANDIDATES, key=lambda name: (accuracy[name], -BASELINE_CANDIDATES.index(name)))
    if chosen == "majority":
        posterior = np.zeros((len(target_others), num_values))
        posterior[:, majority] = 1.0
    else:
        aux, target = inputs[chosen]
        posterior = baseline_posterior(aux, aux_codes, target, num_values, seed, classifier)
    return BaselineChoice(chosen, accuracy, k, posterior)
