"""Attribute inference, model inversion and property inference against a trained run.

Adapters from a :class:`~attacks.base.TargetRun` (run 0 of an audited configuration) to the
standalone attacks of :mod:`attacks.attribute_inference`, :mod:`attacks.model_inversion` and
:mod:`attacks.property_inference`. What each attacks:

* ``attribute-inference`` — the final global model, queried on the run's own training records
  (targets), with the pool records it did not train on as the attacker's auxiliary data. When
  the audit's dataset has no sensitive attribute (digits, MNIST, faces), the defense is trained
  once more, same clients, training and target ε, on a tabular dataset that has one
  (``dataset``: ``diabetes`` by default, embedded; ``adult`` with ``root``), and that run is
  attacked; the notes say so.
* ``model-inversion`` — the final global model's output probabilities inverted back to the
  inputs of its training records, beside the auxiliary-mean baseline.
* ``property-inference`` — Melis et al.'s attack on uploads: batches of the run's training
  records, each uploaded as its gradient at the run's global model, privatised as the defense
  does (:mod:`attacks.server_view`); property = "the batch holds a record of class c".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attacks.attribute_inference import attribute_inference
from attacks.base import ATTACKS, AttackResult, RunAttack, TargetRun
from attacks.image_quality import image_grid_png, png_base64
from attacks.model_inversion import model_inversion
from attacks.property_inference import flat_gradient, property_inference
from attacks.server_view import not_replayed_reason, upload_view
from audit.core.seeding import derive_seed, numpy_rng, torch_generator
from defenses.clipping import clip_rows


def _result(label: str, variant: str, unit: str, metrics, notes: str, figures=None) -> AttackResult:
    return AttackResult(label, variant, unit, np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), dict(metrics), ((), ()),
                        notes, figures=list(figures or []), kind="run")


def _split_auxiliary(members: np.ndarray, size: int) -> np.ndarray:
    """Pool records the run did not train on: the attacker's auxiliary data."""
    return np.setdiff1d(np.arange(size), members)


@dataclass(frozen=True)
class AttributeParams:
    attributes: list[str] | None = field(default=None, metadata={"help": "sensitive attributes (default: all the dataset has)"})
    dataset: str = field(default="auto", metadata={
        "help": "auto: the audit's dataset if it has a sensitive attribute, else the defense retrained on diabetes"})
    root: str | None = field(default=None, metadata={"help": "data root for `dataset` (adult needs one)"})
    max_targets: int = field(default=1000, metadata={"min": 10, "help": "training records attacked (a random subset)"})


@ATTACKS.register("attribute-inference")
class AttributeInference(RunAttack):
    name = "attribute-inference"
    summary = "infer a sensitive attribute of training records; black-box, white-box, beside a no-model baseline"
    reference = "Fredrikson et al. 2014/2015; Yeom et al. 2018; ML-Doctor (Liu et al. 2022)"
    Params = AttributeParams

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
        auxiliary = _split_auxiliary(members, len(labels))
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
                     "records (not trained on); advantage = accuracy − the no-model baseline's (paired bootstrap 95 %). "
                     + outcome.notes)
            results.append(_result(self.label, attribute, "record", outcome.metrics(), notes))
        return results


@dataclass(frozen=True)
class ModelInversionParams:
    max_targets: int = field(default=500, metadata={"min": 10, "help": "training records reconstructed (a random subset)"})
    epochs: int = field(default=300, metadata={"min": 1, "help": "training epochs of the inversion network (early stopping)"})


@ATTACKS.register("model-inversion")
class ModelInversion(RunAttack):
    name = "model-inversion"
    summary = "an inversion network maps the model's outputs back to its training inputs (MSE/MAE vs a mean baseline)"
    reference = "Fredrikson, Jha, Ristenpart 2015 (as paper 001, App. E, uses it)"
    Params = ModelInversionParams

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        rng = numpy_rng(run.seed, "model-inversion", self.label)
        targets = np.sort(rng.permutation(run.members)[:self.params.max_targets])
        auxiliary = _split_auxiliary(run.members, len(run.pool_y))
        outcome = model_inversion(run.model, run.params, run.pool_x, targets, auxiliary,
                                  derive_seed(run.seed, "model-inversion", self.label), epochs=self.params.epochs,
                                  device=run.device)
        figures = []
        if run.kind == "image":
            shown = torch.as_tensor(targets[:16])
            truth = run.pool_x[shown]
            grid = image_grid_png(truth, outcome.reconstructions[:16].reshape(truth.shape).cpu(),
                                  (min(0.0, float(run.pool_x.min())), max(1.0, float(run.pool_x.max()))))
            figures.append({"title": f"{self.label}: {run.key}", "png": png_base64(grid),
                            "caption": "Training records (top) and their inversions from the model's output probabilities (bottom)."})
        notes = (f"{len(targets)} training records of run 0, inversion network trained on {len(auxiliary)} records the run "
                 "did not train on; gain = baseline error − attack error (paired bootstrap 95 %). " + outcome.notes)
        return [_result(self.label, "", "record", outcome.metrics(), notes, figures)]


@dataclass(frozen=True)
class PropertyParams:
    property_class: int = field(default=0, metadata={"min": 0, "help": "property: the batch holds a record of this class"})
    batch_size: int = field(default=10, metadata={"min": 1, "help": "records per attacked upload"})
    targets: int = field(default=60, metadata={"min": 4, "help": "attacked uploads (batches of the run's training records)"})
    shadow_updates: int = field(default=200, metadata={"min": 4, "help": "attacker's shadow uploads from auxiliary data"})


@ATTACKS.register("property-inference")
class PropertyInference(RunAttack):
    name = "property-inference"
    summary = "does an upload's batch hold a given class? a classifier on shadow uploads (Melis et al.)"
    reference = "Melis, Song, De Cristofaro, Shmatikov 2019, Exploiting Unintended Feature Leakage in Collaborative Learning"
    Params = PropertyParams

    def not_applicable(self, defense, dataset) -> str | None:
        if self.params.property_class >= dataset.num_classes:
            return f"property_class {self.params.property_class} ≥ the {dataset.num_classes} classes of '{dataset.name}'"
        return not_replayed_reason(defense)

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        view = upload_view(run.defense, run.training, len(run.clients))
        gradient = flat_gradient(run.model, run.params)
        noise_stream = torch_generator(run.seed, "property-inference", self.label, "noise")

        def privatised(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            upload = gradient(x, y)
            if view.clip is None:
                return upload
            clipped = clip_rows(upload[None, :], view.clip)[0]
            noise = torch.randn(clipped.shape, generator=noise_stream, dtype=torch.float32).to(clipped)
            return clipped + view.noise * view.clip * noise

        rng = numpy_rng(run.seed, "property-inference", self.label)
        batches = [rng.choice(run.members, self.params.batch_size, replace=False) for _ in range(self.params.targets)]
        target_clients = [(run.pool_x[torch.as_tensor(b)], run.pool_y[torch.as_tensor(b)]) for b in batches]
        has_class = (run.pool_y.numpy() == self.params.property_class)
        truth = np.array([bool(has_class[b].any()) for b in batches])
        auxiliary = _split_auxiliary(run.members, len(run.pool_y))
        if truth.all() or not truth.any():
            return [_result(self.label, "", "upload", {}, f"not scored: every attacked batch has the same truth ({truth[0]})")]
        outcome = property_inference(privatised, target_clients, truth, run.pool_x[torch.as_tensor(auxiliary)],
                                     run.pool_y[torch.as_tensor(auxiliary)], has_class[auxiliary],
                                     derive_seed(run.seed, "property-inference", self.label),
                                     shadow_updates=self.params.shadow_updates, batch_size=self.params.batch_size)
        privacy = ("uploads as they are" if view.clip is None else
                   f"clipped to {view.clip:g}, noise std {view.noise:.3g}·{view.clip:g} per upload")
        notes = (f"property: the batch holds class {self.params.property_class}; {len(batches)} uploads of "
                 f"{self.params.batch_size} training records of run 0 (gradients at its final model, {privacy}); "
                 f"{outcome.shadow_updates} shadow uploads; majority guess {100 * outcome.majority_accuracy:.1f} %. "
                 + outcome.notes)
        return [_result(self.label, "", "upload", outcome.metrics(), notes)]

