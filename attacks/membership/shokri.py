"""Shokri, Stronati, Song, Shmatikov 2017, "Membership Inference Attacks against Machine
Learning Models" (§V): shadow models trained like the target, and one attack classifier per
class that reads the model's output vector and says "in" or "out".

The shadow models are the other membership runs: they were trained exactly like the target
(same defense, data distribution and training), with known membership — the "perfect
knowledge of the training procedure" setting of §V-C. Runs are split into folds; the targets
of one fold are attacked by classifiers trained on the shadows of the others. Features: the
model's probability vector sorted in decreasing order (which makes one classifier per label
meaningful across records, as ML-Leaks does) and, by default, its logarithm, which keeps apart
confident outputs that raw probabilities squash near 1. Classifiers are scikit-learn's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, MembershipAttack, Setting
from attacks.membership_experiment import MembershipExperiment
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import derive_seed, numpy_rng, sklearn_random_state

if TYPE_CHECKING:
    from sklearn import ensemble, linear_model, neural_network, pipeline, preprocessing
else:  # imported when first used (audit.core.lazy_modules)
    ensemble = lazy_module("sklearn.ensemble")
    linear_model = lazy_module("sklearn.linear_model")
    neural_network = lazy_module("sklearn.neural_network")
    pipeline = lazy_module("sklearn.pipeline")
    preprocessing = lazy_module("sklearn.preprocessing")


@dataclass(frozen=True)
class ShokriParams:
    unit: Literal["auto", "record", "client"] = field(default="auto", metadata={
        "help": "score records or whole clients (auto: the membership unit of the runs)"})
    classifier: Literal["mlp", "logistic", "gradient-boosting"] = field(default="mlp", metadata={
        "help": "attack model per class (Shokri et al. used a neural network)"})
    folds: int = field(default=4, metadata={"min": 2, "help": "runs are split into folds; shadows = the other folds"})
    hidden: int = field(default=64, metadata={"min": 1, "help": "hidden units of the mlp attack model"})
    log_features: bool = field(default=True, metadata={"help": "append log-probabilities to the sorted probability vector"})
    max_per_class: int = field(default=20000, metadata={"min": 10, "help": "training examples per attack model (random subset)"})


def sorted_features(logits: np.ndarray, log_features: bool) -> np.ndarray:
    """Sorted probability vector (and its log) from logits [..., classes]."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    log_sorted = -np.sort(-log_p, axis=-1)
    return np.concatenate([np.exp(log_sorted), log_sorted], -1) if log_features else np.exp(log_sorted)


@ATTACKS.register
class Shokri(MembershipAttack):
    name = "shokri"
    summary = "shadow-model attack: one classifier per class on the sorted output vector"
    reference = "Shokri et al. 2017, Membership Inference Attacks against Machine Learning Models"
    Params = ShokriParams
    min_runs = 4  # every fold needs shadows with and without each class's records

    def check(self, field_path: str, setting: Setting) -> None:
        # each fold needs at least one run: more folds than runs would quietly be cut to the runs
        if self.params.folds > setting.runs:
            raise UserInputError(f"{field_path}.params.folds: {self.params.folds} folds of {setting.runs} membership runs; "
                                 f"allowed: 2 to {setting.runs} (membership.runs)")

    def classifier(self, seed: int):
        if self.params.classifier == "logistic":
            model = linear_model.LogisticRegression(max_iter=1000)
        elif self.params.classifier == "gradient-boosting":
            model = ensemble.HistGradientBoostingClassifier(max_iter=100, random_state=sklearn_random_state(seed))
        else:
            model = neural_network.MLPClassifier(hidden_layer_sizes=(self.params.hidden,), max_iter=300, early_stopping=True,
                                  random_state=sklearn_random_state(seed))
        return pipeline.make_pipeline(preprocessing.StandardScaler(), model)

    def run(self, experiment: MembershipExperiment, progress: Callable[[int, int], None] | None = None) -> list[AttackResult]:
        features = sorted_features(experiment.logits(None)[:, 0], self.params.log_features)  # [runs, records, f]
        labels = experiment.labels.numpy()
        keep = experiment.keep.astype(bool)
        runs = experiment.runs
        folds = min(self.params.folds, runs)
        fold_of = np.arange(runs) % folds
        scores = np.full(keep.shape, 0.5)
        classes = np.unique(labels)
        done = 0
        for fold in range(folds):
            targets, shadows = np.flatnonzero(fold_of == fold), np.flatnonzero(fold_of != fold)
            for label in classes:
                records = np.flatnonzero(labels == label)
                x = features[np.ix_(shadows, records)].reshape(-1, features.shape[-1])
                y = keep[np.ix_(shadows, records)].ravel()
                if y.all() or not y.any():
                    continue  # no contrast to learn from: these records keep the uninformative 0.5
                if len(y) > self.params.max_per_class:
                    chosen = numpy_rng(experiment.seed, "shokri", fold,
                                       int(label)).choice(len(y), self.params.max_per_class, replace=False)
                    x, y = x[chosen], y[chosen]
                model = self.classifier(derive_seed(experiment.seed, "shokri", fold, int(label)))
                model.fit(x, y)
                positive = list(model.classes_).index(True)
                target_x = features[np.ix_(targets, records)].reshape(-1, features.shape[-1])
                scores[np.ix_(targets, records)] = model.predict_proba(target_x)[:, positive].reshape(len(targets), len(records))
            done += 1
            if progress is not None:
                progress(done, folds)
        notes = (f"{folds} folds: each target attacked by per-class {self.params.classifier} models trained on "
                 f"{runs - int(np.ceil(runs / folds))}+ shadow runs; features: sorted probabilities"
                 + (" and their logs" if self.params.log_features else ""))
        # fold 0's targets were scored by classifiers trained on the other folds' membership only
        fold = np.flatnonzero(fold_of == 0)
        # a fold's targets share its attack models: the intervals resample whole folds
        return [self.result("", experiment, scores, notes, independent=(fold, scores[fold]), run_groups=fold_of)]
