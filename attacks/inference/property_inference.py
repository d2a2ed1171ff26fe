"""Property inference against clients' uploads (Melis, Song, De Cristofaro, Shmatikov 2019,
"Exploiting Unintended Feature Leakage in Collaborative Learning", S&P 2019: passive property
inference from batch updates; see also Ganju et al. 2018 for whole-model property inference).

A property is a predicate on records that the model's task does not ask about: "is of class c",
"has attribute value v". A client's data *has* the property when at least one of its records
does. The server (or anyone who sees an upload) wants to tell, from a client's update alone,
whether its data has the property.

The attack of Melis et al.:

1. At the global model the clients start from, the attacker computes *shadow updates* on
   batches of its auxiliary data: some batches with the property (a fraction of their records
   drawn from the auxiliary records that have it) and some without (all records drawn from
   those that do not). The caller's ``update_of(x, y) -> flat tensor`` computes an upload from
   a batch exactly as a client would (the loss gradient at the global model, the model delta
   after local steps, and with the defense's clipping and noise applied), so the shadow updates
   are privatised like the real ones.
2. A binary classifier learns "has the property" from the shadow updates: by default a random
   forest, which is insensitive to the coordinates' scales and picks out the few informative
   ones among thousands; standardised logistic regression is the alternative, but with
   more features than shadow updates it overfits (on digits at a trained model, presence of a
   class: AUC ≈ 0.6–0.7 against ≈ 0.95 for the forest).
3. The classifier scores each target client's upload.

The attacker scores what the server it plays really observes (:mod:`attacks.server_view`). Under
secure aggregation (Bonawitz et al. 2017), or where a trusted aggregator adds the noise to the
sum, that is not the target's upload but the aggregate of the round's m uploads: the target's
plus m − 1 other clients', each clipped, with m noise shares of std S·σ/√m — std S·σ on the sum.
Each attacked observation is then that sum (the others: batches of other training records), and
each shadow observation sums the shadow batch's upload with m − 1 uploads of auxiliary batches
drawn at random, so the classifier learns from what it will be shown; the truth stays "the
target's batch has the property". Other clients' records dilute the target's signal, and a
property that is common in their batches is present in almost every aggregate (Melis et al.
measure the same decline as the participants grow; a malicious server can undo the aggregation,
Pasquini, Francati, Ateniese 2022, which this honest-but-curious replay does not try).

Updates of large models are compressed before the classifier with a count sketch (feature
hashing; Weinberger et al. 2009): coordinate i is added, with a random sign s(i) ∈ {±1}, to
bucket h(i) ∈ {0, …, k−1}. It keeps inner products in expectation, needs O(d) time and memory
per update (a dense Gaussian projection would need d·k), and is seeded like everything else. The
uploads, their privatisation and the sketch are in :mod:`attacks.inference.property_updates`.

Metrics over the target clients: ROC AUC of the classifier's score with DeLong's interval
(:func:`audit.core.metrics.auc`) and the accuracy of its 0.5-probability decision with a
Clopper–Pearson interval. Chance is AUC 0.5 (and the accuracy of guessing the majority).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult, run_result
from attacks.base import ATTACKS, RunAttack, Setting
from attacks.inference.property_updates import (
    CountSketch,
    UpdateFunction,
    flat_gradient,
    privatised_upload,
)
from attacks.server_view import not_replayed_reason, upload_view
from attacks.target_run import TargetRun, auxiliary_records
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import IntervalEstimate, auc, clopper_pearson
from audit.core.seeding import derive_seed, numpy_rng, sklearn_random_state, torch_generator

if TYPE_CHECKING:
    import torch
    from sklearn import ensemble, linear_model, pipeline, preprocessing
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    ensemble = lazy_module("sklearn.ensemble")
    linear_model = lazy_module("sklearn.linear_model")
    pipeline = lazy_module("sklearn.pipeline")
    preprocessing = lazy_module("sklearn.preprocessing")
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")



@dataclass
class PropertyInferenceResult:
    auc: IntervalEstimate  # DeLong interval
    accuracy: IntervalEstimate  # decision at probability 0.5; Clopper–Pearson interval
    scores: np.ndarray = field(repr=False)  # the classifier's probability of "has the property", per target client
    truth: np.ndarray = field(repr=False)  # bool per target client
    majority_accuracy: float = float("nan")  # accuracy of always guessing the more common truth
    shadow_updates: int = 0
    update_dimension: int = 0
    feature_dimension: int = 0  # after the count sketch
    summed: int = 1  # uploads in each observation (1: each upload alone; m: the aggregate of m)
    notes: str = ""

    def metrics(self) -> dict[str, IntervalEstimate]:
        return {"auc": self.auc, "accuracy": self.accuracy}


def client_has_property(record_property: np.ndarray, clients: Sequence[np.ndarray]) -> np.ndarray:
    """bool per client: does any of its records (indices into ``record_property``) have the property."""
    record_property = np.asarray(record_property, dtype=bool)
    return np.array([bool(record_property[np.asarray(c, dtype=np.int64)].any()) for c in clients])


# --------------------------------------------------------------------------- shadow batches


def other_batches(pool: np.ndarray, exclude: np.ndarray, count: int, batch_size: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` batches of ``batch_size`` records of ``pool`` outside ``exclude``: the other
    clients of a round, whose uploads the server sees summed with the target's. Records are
    distinct across the batches when there are enough (clients hold disjoint data)."""
    candidates = np.setdiff1d(np.asarray(pool), np.asarray(exclude))
    if len(candidates) == 0:
        candidates = np.asarray(pool)
    drawn = rng.choice(candidates, count * batch_size, replace=count * batch_size > len(candidates))
    return [drawn[k * batch_size:(k + 1) * batch_size] for k in range(count)]


def shadow_batches(auxiliary_property: np.ndarray, count: int, batch_size: int,
                   property_fraction: tuple[float, float], seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``count`` batches of auxiliary record indices, alternating with (even positions) and
    without the property. A batch with the property draws round(f·size) ≥ 1 of its records from
    those with it, f ~ Uniform(property_fraction), the rest from those without; a batch without
    draws all from those without. Records within a batch are distinct when there are enough."""
    auxiliary_property = np.asarray(auxiliary_property, dtype=bool)
    having, lacking = np.flatnonzero(auxiliary_property), np.flatnonzero(~auxiliary_property)
    if len(having) == 0 or len(lacking) == 0:
        raise ValueError("the auxiliary records need some with and some without the property")
    low, high = property_fraction
    if not 0.0 < low <= high <= 1.0:
        raise ValueError(f"property_fraction must satisfy 0 < low <= high <= 1, got {property_fraction}")
    rng = numpy_rng(seed, "property-inference", "shadow-batches")

    def draw(pool: np.ndarray, size: int) -> np.ndarray:
        return rng.choice(pool, size, replace=size > len(pool))

    batches, truth = [], np.zeros(count, dtype=bool)
    for index in range(count):
        if index % 2 == 0:
            with_property = min(batch_size, max(1, int(round(rng.uniform(low, high) * batch_size))))
            batch = np.concatenate([draw(having, with_property), draw(lacking, batch_size - with_property)])
            truth[index] = True
        else:
            batch = draw(lacking, batch_size)
        batches.append(rng.permutation(batch))
    return batches, truth


# --------------------------------------------------------------------------- the attack


def property_inference(
    update_of: UpdateFunction,
    target_clients: Sequence[tuple[torch.Tensor, torch.Tensor]],
    target_truth: np.ndarray,
    auxiliary_x: torch.Tensor,
    auxiliary_y: torch.Tensor,
    auxiliary_property: np.ndarray,
    seed: int,
    *,
    shadow_updates: int = 200,
    batch_size: int | None = None,
    property_fraction: tuple[float, float] = (0.1, 0.5),
    classifier: Literal["random-forest", "logistic"] = "random-forest",
    sketch_width: int = 2048,
    confidence: float = 0.95,
    target_others: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]] | None = None,
) -> PropertyInferenceResult:
    """Melis et al.'s batch property inference on the target clients' uploads.

    ``target_clients``: each client's (features, labels), from which ``update_of`` computes
    the upload the attacker sees; ``target_truth``: bool per client, whether its data has the
    property (the ground truth, never shown to the attack). ``auxiliary_*``: the attacker's
    records, disjoint from the clients', and the property of each. Shadow batches have
    ``batch_size`` records (default: the median client size) and ``shadow_updates`` of them are
    made, half with the property. Updates longer than ``sketch_width`` are count-sketched to
    that width. Deterministic in ``seed`` (given a deterministic ``update_of``).

    ``target_others``: where the server sees only aggregates, per target client the batches of
    the m − 1 other clients whose uploads are summed with its own (the same number for every
    target); each observation is then the sum of the m uploads ``update_of`` returns (each with
    its own noise share), and each shadow observation sums the shadow batch's upload with m − 1
    uploads of ``batch_size`` auxiliary records drawn at random (with or without the property,
    as they come). None: each upload is observed alone.
    """
    target_truth = np.asarray(target_truth, dtype=bool)
    if len(target_truth) != len(target_clients):
        raise ValueError("target_truth needs one entry per target client")
    if target_truth.all() or not target_truth.any():
        raise ValueError("the target clients need some with and some without the property")
    if shadow_updates < 4:
        raise ValueError("property inference needs at least 4 shadow updates")
    others = 0
    if target_others is not None:
        if len(target_others) != len(target_clients):
            raise ValueError("target_others needs one list of batches per target client")
        counts = {len(batches) for batches in target_others}
        if len(counts) != 1:
            raise ValueError(f"every target needs the same number of other uploads, got {sorted(counts)}")
        others = counts.pop()
    if batch_size is None:
        batch_size = int(np.median([len(y) for _, y in target_clients]))
    batches, shadow_truth = shadow_batches(auxiliary_property, shadow_updates, batch_size, property_fraction, seed)
    auxiliary = np.arange(len(auxiliary_property))
    others_rng = numpy_rng(seed, "property-inference", "shadow-others")
    shadow_others = [other_batches(auxiliary, batch, others, batch_size, others_rng) if others else [] for batch in batches]

    def observed(batch: tuple[torch.Tensor, torch.Tensor], rest: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        total = update_of(*batch).reshape(-1)
        for other in rest:  # the aggregate: every upload privatised on its own, then summed
            total = total + update_of(*other).reshape(-1)
        return total

    def auxiliary_batch(index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(index)
        return auxiliary_x[index], auxiliary_y[index]

    def shadow_observation(k: int) -> torch.Tensor:
        return observed(auxiliary_batch(batches[k]), [auxiliary_batch(o) for o in shadow_others[k]])

    # the first observation fixes the dimension; the sketch is identity when it is already small
    first = shadow_observation(0)
    dimension = int(first.numel())
    sketch = CountSketch(dimension, sketch_width, seed) if dimension > sketch_width else None

    def features_of(update: torch.Tensor) -> np.ndarray:
        update = update.reshape(-1)
        if update.numel() != dimension:
            raise ValueError(f"update_of returned {update.numel()} numbers, earlier {dimension}")
        return sketch(update) if sketch is not None else update.detach().to("cpu", torch.float64).numpy()

    shadow = [features_of(first)] + [features_of(shadow_observation(k)) for k in range(1, len(batches))]
    rests = list(target_others) if target_others is not None else [[] for _ in target_clients]
    targets = np.stack([features_of(observed(client, rest)) for client, rest in zip(target_clients, rests)])

    classifier_state = sklearn_random_state(seed, "property-inference", "classifier")
    if classifier == "logistic":
        model = pipeline.make_pipeline(preprocessing.StandardScaler(), linear_model.LogisticRegression(max_iter=5000))
    elif classifier == "random-forest":
        model = ensemble.RandomForestClassifier(n_estimators=200, random_state=classifier_state, n_jobs=1)
    else:
        raise ValueError(f"classifier must be 'logistic' or 'random-forest', got {classifier!r}")
    model.fit(np.stack(shadow), shadow_truth)
    scores = model.predict_proba(targets)[:, list(model.classes_).index(True)]

    correct = int(((scores >= 0.5) == target_truth).sum())
    clients = len(target_truth)
    accuracy = IntervalEstimate(correct / clients, *clopper_pearson(correct, clients, confidence))
    majority = float(max(target_truth.mean(), 1.0 - target_truth.mean()))
    summed = (f", each summed with {others} upload{'s' if others > 1 else ''} of random auxiliary batches as the "
              "server sees the target's" if others else "")
    notes = (f"{shadow_updates} shadow updates (half with the property, fraction {property_fraction[0]:g}–"
             f"{property_fraction[1]:g} of {batch_size} records{summed}) → {classifier} on "
             + (f"a {sketch_width}-bucket count sketch of the {dimension}-dim updates" if sketch
                else f"the {dimension}-dim updates")
             + f"; {clients} target clients ({int(target_truth.sum())} with the property)")
    return PropertyInferenceResult(
        auc=auc(scores, target_truth, confidence), accuracy=accuracy, scores=scores, truth=target_truth,
        majority_accuracy=majority, shadow_updates=shadow_updates, update_dimension=dimension,
        feature_dimension=sketch_width if sketch is not None else dimension, summed=others + 1, notes=notes)


# --------------------------------------------------------------------------- the registered attack


@dataclass(frozen=True)
class PropertyParams:
    property_class: int = field(default=0, metadata={"min": 0, "help": "property: the batch holds a record of this class"})
    batch_size: int = field(default=10, metadata={"min": 1, "help": "records per attacked upload"})
    targets: int = field(default=60, metadata={"min": 4, "help": "attacked uploads (batches of the run's training records)"})
    shadow_updates: int = field(default=200, metadata={"min": 4, "help": "attacker's shadow uploads from auxiliary data"})


@ATTACKS.register
class PropertyInference(RunAttack):
    name = "property-inference"
    summary = "does an upload's batch hold a given class? a classifier on shadow uploads (Melis et al.)"
    reference = "Melis, Song, De Cristofaro, Shmatikov 2019, Exploiting Unintended Feature Leakage in Collaborative Learning"
    Params = PropertyParams

    def check(self, field_path: str, setting: Setting) -> None:
        classes = setting.dataset.num_classes
        if self.params.property_class >= classes:  # a class the data does not have: no batch could hold it
            raise UserInputError(f"{field_path}.params.property_class: class {self.params.property_class} of the "
                                 f"{classes} classes of '{setting.dataset.name}'; allowed: 0 to {classes - 1}")

    def not_applicable(self, defense, dataset) -> str | None:
        if self.params.property_class >= dataset.num_classes:
            return f"property_class {self.params.property_class} ≥ the {dataset.num_classes} classes of '{dataset.name}'"
        return not_replayed_reason(defense)

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        view = upload_view(run.defense, run.training, len(run.clients))
        privatised = privatised_upload(flat_gradient(run.model, run.params), view,
                                       [value.numel() for value in run.params.values()],
                                       torch_generator(run.seed, "property-inference", self.label, "noise"))
        rng = numpy_rng(run.seed, "property-inference", self.label)
        batches = [rng.choice(run.members, self.params.batch_size, replace=False) for _ in range(self.params.targets)]

        def records(index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            return run.pool_x[torch.as_tensor(index)], run.pool_y[torch.as_tensor(index)]

        target_clients = [records(b) for b in batches]
        others = None
        if view.clients > 1:  # the server sees the sum of the target's upload and m − 1 others'
            others_rng = numpy_rng(run.seed, "property-inference", self.label, "others")
            others = [[records(o) for o in other_batches(run.members, b, view.clients - 1, self.params.batch_size, others_rng)]
                      for b in batches]
        has_class = (run.pool_y.numpy() == self.params.property_class)
        truth = np.array([bool(has_class[b].any()) for b in batches])
        auxiliary = auxiliary_records(run.members, len(run.pool_y))
        if truth.all() or not truth.any():
            return [run_result(self.label, "", "upload", {}, f"not scored: every attacked batch has the same truth ({truth[0]})")]
        outcome = property_inference(privatised, target_clients, truth, run.pool_x[torch.as_tensor(auxiliary)],
                                     run.pool_y[torch.as_tensor(auxiliary)], has_class[auxiliary],
                                     derive_seed(run.seed, "property-inference", self.label),
                                     shadow_updates=self.params.shadow_updates, batch_size=self.params.batch_size,
                                     target_others=others)
        privacy = ("uploads as they are" if view.clip is None else
                   f"{view.describe_clip()}, noise std {view.noise:.3g}·{view.clip:g} per upload")
        observed = view.observation()
        if view.clients > 1:
            observed += (f": the target's upload plus {view.clients - 1} uploads of other batches of run 0's training "
                         f"records, noise std S·σ = {view.observed_noise:.3g} on the sum")
        notes = (f"property: the batch holds class {self.params.property_class}; {len(batches)} uploads of "
                 f"{self.params.batch_size} training records of run 0 (gradients at its final model, {privacy}); "
                 f"the server observes {observed}; "
                 f"{outcome.shadow_updates} shadow uploads; majority guess {100 * outcome.majority_accuracy:.1f} %. "
                 + outcome.notes)
        return [run_result(self.label, "", "upload", outcome.metrics(), notes)]
