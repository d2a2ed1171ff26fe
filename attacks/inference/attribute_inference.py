"""Attribute inference: guess a record's sensitive attribute (sex, race) from a trained model,
and measure how much the model helps compared with guessing it from the data alone.

Setting. The attacker knows a target record's other features x₋ₐ and its true label y (the
black-box attack queries the model with it); it holds auxiliary records (disjoint from the
targets) with known attribute, features and label; it may query the target model (black-box)
or read its parameters (white-box). Guesses per target record:

* **black-box** (Fredrikson et al. 2014, "Privacy in Pharmacogenetics"; Fredrikson, Jha,
  Ristenpart 2015, "Model Inversion Attacks that Exploit Confidence Information"; Yeom et al.
  2018, "Privacy Risk in Machine Learning", attribute inference): put each candidate value v of
  the attribute into the record's encoding, x_v, and guess

      v̂ = argmax_v  log f(x_v)_y                        (rule "confidence", the default)
      v̂ = argmax_v  log f(x_v)_y + log π(v)             (rule "map": Fredrikson 2014's MAP estimate)

  where f(·)_y is the model's softmax probability of the record's true label y and π the
  attribute's frequency in the auxiliary records. Ties (a model that ignores the attribute)
  go to the value with the largest π. The encoding of v is read from the auxiliary records:
  one-hot columns get v's one-hot, a standardised column gets the standardised value of v.
* **black-box, Bayes** (the same queries): v̂ = argmax_v log f(x_v)_y + log p̂(v | x₋ₐ), the MAP
  estimate with a classifier's posterior p̂(v | x₋ₐ) from the other features in place of the
  marginal π. If the model's f(x_v)_y estimates p(y | x₋ₐ, v), this is Bayes' rule for
  p(v | x₋ₐ, y) — which is why the prior leaves y out: y's evidence enters through the model.
  The plain rules above ignore how the other features predict the attribute, so they usually
  fall *below* the no-model baseline even against a leaky model; this one starts from the
  population's evidence and moves where the model's outweighs it. Its advantage over the
  baseline (which does use y, below) is what the model's outputs add beyond the population's
  relation between y and the attribute (≈ 0 for a model that only reproduces that relation).
* **white-box** (ML-Doctor, Liu et al. 2022, attribute inference; Feng et al. 2024, §5.5 and
  Table 8): a scikit-learn MLP trained on the target model's penultimate-layer embeddings (the
  input of its last ``nn.Linear``) of the auxiliary records, labelled with their attribute, then
  applied to the target records' embeddings. It does not use the label, so it is held to a baseline that knows
  more than it does (its advantage is a lower bound for a white-box attacker who knows y).
* **baseline** (no model; ART's ``AttributeInferenceBaselineTrueLabel``, "the rest of the
  features, and the true label"): a classifier p̂(v | x₋ₐ, y) trained on the auxiliary records'
  *other* features x₋ₐ (the attribute's columns removed) and their label y (one-hot), applied
  to the target records — or, where the auxiliary records' cross-validation says so, the same
  classifier on x₋ₐ alone, on y alone, or the majority value (:func:`best_baseline`): the best
  guess from everything the attacker has except the model. The black-box attacks use y, so a
  baseline without it would credit the model with what the label alone gives away (an attribute
  that is a function of y: the model would seem to leak it entirely); and a baseline weaker than
  one the attacker could have picked would credit it with the difference. Were p̂ the population's posterior p(v | x₋ₐ, y), its
  guess would be the Bayes decision, and no guess made from x₋ₐ, y and a model that does not depend on the
  record's attribute could beat it in expectation, whatever the rule: a positive advantage then
  means the model carries something of the record itself (up to how well the classifier
  estimates that posterior).
* **prior**: the auxiliary majority value for every record.

Neutralised queries. In tabular datasets the model's input contains the attribute itself, and
the white-box embeddings of a record carry it straight through the first layer, so an MLP on
them would "infer" the attribute by reading the input back — a property of the encoding, not
of what the model learned. To measure what the *model* adds, the white-box attack queries every
record (auxiliary and target alike) with its attribute columns set to their auxiliary mean (for
one-hot columns: the attribute's auxiliary frequencies, a "soft" one-hot; for a standardised
column: its mean). The black-box attack never reads the true value either: it substitutes
every candidate.

Metrics, per attack (on the target records; :mod:`attacks.inference.attribute_scores`): accuracy with a
Clopper–Pearson interval, macro-F1 with a percentile bootstrap interval, and the **advantage** =
accuracy − baseline accuracy with a *paired* bootstrap interval (the same resamples serve every
attack). The queries the attacks make — encodings, substituted and neutralised records, the
model's log-confidences and embeddings — are in :mod:`attacks.inference.attribute_queries`, the
guesses made from them in :mod:`attacks.inference.attribute_guesses`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult, run_result
from attacks.base import ATTACKS, RunAttack, Setting
from attacks.inference.attribute_guesses import (
    baseline_posterior,
    bayes_guesses,
    best_baseline,
    black_box_guesses,
    decide,
    white_box_posterior,
)
from attacks.inference.attribute_queries import (
    attribute_encodings,
    candidate_log_likelihoods,
    penultimate_embeddings,
    with_attribute_columns,
)
from attacks.inference.attribute_scores import AttributeAttackScores, score_guesses
from attacks.target_run import TargetRun, auxiliary_records
from audit.core.dataset_types import Dataset
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import IntervalEstimate
from audit.core.seeding import derive_seed, numpy_rng
from audit.core.vocabulary import Unit

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

#: the registered datasets with a sensitive attribute, which a side run may train on
SIDE_DATASETS = ("diabetes", "adult")
#: the guesses an :class:`AttributeInferenceResult` scores
GUESSES = ("black_box", "black_box_bayes", "white_box", "baseline", "prior")


@dataclass
class AttributeInferenceResult:
    attribute: str
    values: list[str]  # value name of each code
    truth: np.ndarray  # true code per target record
    black_box: AttributeAttackScores  # Fredrikson/Yeom: the rule chosen by ``black_box_rule``
    black_box_bayes: AttributeAttackScores  # the same queries weighed by the baseline's posterior
    white_box: AttributeAttackScores
    baseline: AttributeAttackScores  # the no-model classifier (its advantage is 0 by definition)
    prior: AttributeAttackScores  # always the auxiliary majority value
    notes: str = ""

    def metrics(self) -> dict[str, IntervalEstimate]:
        """Flat ``"<guess>.<metric>"`` → IntervalEstimate, e.g. ``"black_box.advantage"``."""
        out = {}
        for guess in GUESSES:
            scores: AttributeAttackScores = getattr(self, guess)
            for metric in ("accuracy", "macro_f1", "advantage"):
                out[f"{guess}.{metric}"] = getattr(scores, metric)
        return out


# --------------------------------------------------------------------------- the attack


def attribute_inference(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    features: torch.Tensor,
    labels: torch.Tensor,
    attribute_codes: np.ndarray,
    attribute_columns: Sequence[int],
    attribute_values: Sequence[str],
    target_index: np.ndarray,
    auxiliary_index: np.ndarray,
    seed: int,
    *,
    attribute: str = "",
    black_box_rule: Literal["confidence", "map"] = "confidence",
    white_box_hidden: Sequence[int] = (64,),
    baseline_classifier: Literal["logistic", "gradient-boosting"] = "logistic",
    encodings: np.ndarray | None = None,
    resamples: int = 2000,
    confidence: float = 0.95,
    device: str = "cpu",
) -> AttributeInferenceResult:
    """Black-box, white-box and no-model attribute inference on the target records.

    ``features``/``labels`` hold at least the target and auxiliary records (rows picked by
    ``target_index`` and ``auxiliary_index``, which must not overlap); ``attribute_codes`` the
    attribute's code per row (only the auxiliary rows' codes are shown to the attacks, the
    targets' are the truth); ``attribute_columns`` the indices, in the flattened record, of the
    columns that encode the attribute (``Dataset.attribute_columns``); ``model`` the architecture
    template, run with ``params``. ``encodings`` [values, columns] overrides the encodings read
    from the auxiliary records. ``labels`` are class indices; every advantage is over the baseline
    on the other features and the label (what the attacker has without the model). Deterministic
    in ``seed``.
    """
    target_index = np.asarray(target_index, dtype=np.int64)
    auxiliary_index = np.asarray(auxiliary_index, dtype=np.int64)
    if np.intersect1d(target_index, auxiliary_index).size:
        raise ValueError("target and auxiliary records overlap: the attacker would know the targets' attribute")
    if len(target_index) == 0 or len(auxiliary_index) == 0:
        raise ValueError("attribute inference needs target and auxiliary records")
    codes = np.asarray(attribute_codes, dtype=np.int64)
    num_values = len(attribute_values)
    columns = [int(c) for c in attribute_columns]
    flat = features.reshape(len(features), -1)
    aux_rows, target_rows = torch.as_tensor(auxiliary_index), torch.as_tensor(target_index)
    aux_x, target_x, target_y = features[aux_rows], features[target_rows], labels[target_rows]
    aux_codes, truth = codes[auxiliary_index], codes[target_index]

    prior = np.bincount(aux_codes, minlength=num_values).astype(np.float64) / len(aux_codes)
    if encodings is None:
        encodings = attribute_encodings(flat[aux_rows][:, columns].cpu().numpy(), aux_codes, num_values)
    encodings = np.asarray(encodings, dtype=np.float64)
    neutral = prior @ encodings  # the auxiliary mean of the attribute columns

    params = {name: value.to(device) for name, value in params.items()}
    model = model.to(device)
    log_likelihoods = candidate_log_likelihoods(model, params, target_x.to(device), target_y, columns, encodings)

    others = np.setdiff1d(np.arange(flat.shape[1]), columns)
    # the label is known to the attacker (the black-box queries use it), so the no-model guess uses it too
    label_codes = labels.cpu().numpy().astype(np.int64)
    num_classes = int(label_codes.max()) + 1
    aux_others, target_others = (flat[rows][:, others].double().cpu().numpy() for rows in (aux_rows, target_rows))
    baseline_choice = best_baseline(aux_others, label_codes[auxiliary_index], aux_codes, target_others,
                                    label_codes[target_index], num_classes, num_values,
                                    derive_seed(seed, "attribute-inference", "baseline"), baseline_classifier)
    posterior = baseline_choice.posterior
    # Bayes' rule p(v | x₋ₐ, y) ∝ p(v | x₋ₐ) · p(y | x₋ₐ, v): the model's f(x_v)_y stands for the
    # second factor, so the prior must not hold y already (else y's evidence counts twice)
    prior_posterior = baseline_posterior(aux_others, aux_codes, target_others, num_values,
                                         derive_seed(seed, "attribute-inference", "prior-posterior"), baseline_classifier)

    aux_embeddings = penultimate_embeddings(model, params, with_attribute_columns(aux_x, columns, neutral).to(device))
    target_embeddings = penultimate_embeddings(model, params, with_attribute_columns(target_x, columns, neutral).to(device))
    white_box = white_box_posterior(aux_embeddings, aux_codes, target_embeddings, num_values,
                                    derive_seed(seed, "attribute-inference", "white-box"), white_box_hidden)

    guesses = {
        "black_box": black_box_guesses(log_likelihoods, prior, black_box_rule),
        "black_box_bayes": bayes_guesses(log_likelihoods, prior_posterior, prior),
        "white_box": decide(white_box, prior),
        "baseline": decide(posterior, prior),
        "prior": np.full(len(truth), int(np.argmax(prior)), dtype=np.int64),
    }
    baseline = guesses["baseline"]

    def scored(predictions: np.ndarray) -> AttributeAttackScores:
        return score_guesses(truth, predictions, baseline, num_values, seed, resamples, confidence)

    notes = (f"{len(target_index)} target and {len(auxiliary_index)} auxiliary records; black-box rule "
             f"'{black_box_rule}' over {num_values} candidate values (Bayes: weighed by a posterior from the other features); "
             f"white-box MLP {tuple(white_box_hidden)} on {aux_embeddings.shape[1]}-dim penultimate embeddings of "
             f"neutralised queries; baseline {baseline_classifier} on {baseline_choice.describe()} "
             f"({len(others)} other features, {num_classes} classes); "
             f"advantage = accuracy − baseline accuracy (paired bootstrap, {resamples} resamples)")
    return AttributeInferenceResult(attribute=attribute, values=list(attribute_values), truth=truth,
                                    notes=notes, **{name: scored(g) for name, g in guesses.items()})


def attribute_inference_on_dataset(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    dataset: Dataset,
    attribute: str,
    target_index: np.ndarray,
    auxiliary_index: np.ndarray,
    seed: int,
    split: Literal["train", "test"] = "train",
    **options,
) -> AttributeInferenceResult:
    """:func:`attribute_inference` on the records of ``dataset.<split>``, with the attribute's
    codes, columns and value names taken from the dataset."""
    records = dataset.train if split == "train" else dataset.test
    if records is None:
        raise ValueError(f"dataset {dataset.name} has no {split} split")
    if attribute not in records.attributes or attribute not in dataset.attribute_columns:
        known = ", ".join(sorted(dataset.attribute_columns)) or "none"
        raise ValueError(f"dataset {dataset.name} has no sensitive attribute {attribute!r} (it has: {known})")
    return attribute_inference(
        model, params, records.features, records.labels, records.attributes[attribute],
        dataset.attribute_columns[attribute], dataset.attribute_values[attribute],
        target_index, auxiliary_index, seed, attribute=attribute, **options)


# --------------------------------------------------------------------------- the registered attack


@dataclass(frozen=True)
class AttributeParams:
    attributes: list[str] | None = field(default=None, metadata={"help": "sensitive attributes (default: all the dataset has)"})
    dataset: str = field(default="auto", metadata={
        "help": "auto: the audit's dataset if it has a sensitive attribute, else the defense retrained on diabetes"})
    root: str | None = field(default=None, metadata={"help": "data root for `dataset` (adult needs one)"})
    max_targets: int = field(default=1000, metadata={"min": 10, "help": "training records attacked (a random subset)"})


@ATTACKS.register
class AttributeInference(RunAttack):
    name = "attribute-inference"
    summary = "infer a sensitive attribute of training records; black-box, white-box, beside a no-model baseline"
    reference = "Fredrikson et al. 2014/2015; Yeom et al. 2018; ML-Doctor (Liu et al. 2022)"
    Params = AttributeParams

    def check(self, field_path: str, setting: Setting) -> None:
        """The dataset the attack will read (the audit's own, or the one its side run trains on,
        chosen as :meth:`evaluate` chooses it) must have a sensitive attribute, and each attribute
        named must be one of them: found here, not after the audit has trained."""
        own = setting.dataset
        if own.attribute_values and self.params.dataset in ("auto", own.name):
            name, attributes = own.name, list(own.attribute_values)
        else:
            name = "diabetes" if self.params.dataset == "auto" else self.params.dataset
            attributes = self._side_attributes(f"{field_path}.params", name, own.name)
        for attribute in self.params.attributes or []:
            if attribute not in attributes:
                raise UserInputError(f"{field_path}.params.attributes: '{attribute}' is not a sensitive attribute of "
                                     f"'{name}'; allowed: {', '.join(attributes)}")

    def _side_attributes(self, path: str, name: str, own: str) -> list[str]:
        """The sensitive attributes of side dataset ``name``, loaded as its side run will load it
        (which also checks that ``root`` holds it); registered datasets without such an attribute
        are refused unloaded (loading mnist could mean a download)."""
        from audit.core.datasets import DATASETS, load_dataset
        from audit.core.extensions import is_reference

        allowed = ", ".join(["auto", *SIDE_DATASETS, "or 'module:callable'"])
        if name not in SIDE_DATASETS and not is_reference(name):
            what = ("is the audit's dataset, which has no sensitive attribute" if name == own else
                    "has no sensitive attribute" if name in DATASETS else "is no registered dataset")
            raise UserInputError(f"{path}.dataset: '{name}' {what}; allowed: {allowed}")
        DATASETS.get(name, f"{path}.dataset")  # a code-loading name is refused here when plugins are off
        try:
            dataset = load_dataset(name, self.params.root)
        except UserInputError as exc:
            raise UserInputError(f"{path}.dataset: '{name}' cannot be loaded ({exc})") from None
        if not dataset.attribute_values:
            raise UserInputError(f"{path}.dataset: '{name}' has no sensitive attribute; allowed: {allowed}")
        return list(dataset.attribute_values)

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        own = run.dataset.attribute_values and self.params.dataset in ("auto", run.dataset.name)
        if own:
            dataset, members, model, params = run.dataset, run.members, run.model, run.params
            features, labels, codes_of = run.pool_x, run.pool_y, run.pool_attributes
            where = f"the audited run on {dataset.name}"
        else:
            name = "diabetes" if self.params.dataset == "auto" else self.params.dataset
            side = run.train_side(name, self.params.root)
            dataset, members, model, params = side.dataset, side.members, side.model, side.params
            features, labels, codes_of = side.pool.features, side.pool.labels, side.pool.attributes
            accuracy = "" if side.test_accuracy is None else f", test accuracy {100 * side.test_accuracy:.1f} %"
            where = (f"the same defense configuration retrained on {dataset.name} (an MLP; {run.dataset.name} has no "
                     f"sensitive attribute){accuracy}")
        if not dataset.attribute_values:
            raise RuntimeError(f"attribute-inference: dataset '{dataset.name}' has no sensitive attribute")
        names = self.params.attributes or list(dataset.attribute_values)
        rng = numpy_rng(run.seed, "attribute-inference", self.label)
        targets = np.sort(rng.permutation(members)[:self.params.max_targets])
        auxiliary = auxiliary_records(members, len(labels))
        results = []
        for attribute in names:
            if attribute not in dataset.attribute_values:
                raise RuntimeError(f"attribute-inference: '{dataset.name}' has no attribute '{attribute}'; "
                                   f"it has {', '.join(dataset.attribute_values)}")
            outcome = attribute_inference(
                model, params, features, labels, np.asarray(codes_of[attribute]), dataset.attribute_columns[attribute],
                dataset.attribute_values[attribute], targets, auxiliary,
                derive_seed(run.seed, "attribute-inference", self.label, attribute), attribute=attribute, device=run.device)
            notes = (f"attribute '{attribute}' of {len(targets)} training records of {where}; {len(auxiliary)} auxiliary "
                     "records (not trained on); advantage = accuracy − the no-model baseline's (other features and label; "
                     "paired bootstrap 95 %). "
                     + outcome.notes)
            results.append(run_result(self.label, attribute, Unit.RECORD, outcome.metrics(), notes))
        return results
