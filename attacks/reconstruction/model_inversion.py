"""Model inversion with a learned inverse network (Fredrikson, Jha, Ristenpart 2015, "Model
Inversion Attacks that Exploit Confidence Information and Basic Countermeasures"; the
training-based form used by Feng et al. 2024, App. E / Table 9, and by ML-Doctor's ``modinv``).

The attacker queries the target model f on auxiliary records from the data distribution,
collects triples (f(x), y, x) and trains an inverse network g to map an output vector and the
record's class back to its input:

    g* = argmin_g  (1/|A|) Σ_{(x,y)∈A} ‖g(f(x), y) − x‖²                  (1)  (A: auxiliary records)

then reconstructs each target record from the model's output on it, x̂ = g*(f(x), y). Reported,
as in Table 9, are the mean squared and mean absolute errors between x̂ and x over the target
records (per record: the mean over the input's coordinates; images are flattened).

What the model adds. The attacker knows each target's class y — Fredrikson et al.'s attacker
inverts a class it names — and its auxiliary records give it the class-level public statistics,
so without the model its best reconstruction under squared error is the auxiliary mean of the
target's class,

    x̂_baseline = x̄_y = mean{x : (x, y') ∈ A, y' = y}                            (2)

(a class without an auxiliary record: the mean of all of them). A model's output reveals at
least the class of a record it classifies correctly, so the former baseline, the overall mean
x̄, credited every accurate model with the class: on digits the class accounts for 40 % of the
squared error around x̄, and it was all that an overfit MLP's output probabilities gave away.
The report shows the baseline (2) next to the attack, and the **gain** = baseline error −
attack error on the same records (same metric: squared or absolute error), with a paired
percentile bootstrap interval (gain > 0: the model's outputs tell the attacker something about
the input beyond its class). The inverse network knows the class as well and starts at the
baseline — its output is x̄_y + h(f(x), y) with h's last layer initialised to zero — and it
keeps the epoch with the lowest error on a held-out tenth of the auxiliary records, so it only
moves away from x̄_y when that helps on records it was not fitted to. The gain is what the
outputs reveal about an input, not what the model memorised: a model's outputs on records it
never trained on can reveal as much (unsaturated log-probabilities, or an untrained network's
random projection of the input).

Network inputs: the output vector f(x) (``query="probabilities"``, the softmax confidences
of Fredrikson et al., or ``"log-probabilities"``), standardised with the auxiliary records'
statistics, beside the one-hot class. Training: Adam, mini-batches, all randomness from
:mod:`audit.core.seeding`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult, run_result
from attacks.base import ATTACKS, RunAttack
from attacks.reconstruction.image_quality import image_grid_png, png_base64
from attacks.target_run import TargetRun, auxiliary_records
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import IntervalEstimate
from audit.core.seeding import derive_seed, numpy_rng, seed_torch, torch_generator
from audit.core.vocabulary import Unit
from defenses.federated.evaluation import logits_of

if TYPE_CHECKING:
    import torch
    from torch import nn

    from attacks.reconstruction import inverse_network
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")
    inverse_network = lazy_module("attacks.reconstruction.inverse_network")  # an nn.Module: torch at import

#: bootstrap resamples are drawn in blocks of at most this many (resample × record) counts
_BOOTSTRAP_BLOCK = 4_000_000


@dataclass
class ModelInversionResult:
    mse: IntervalEstimate  # mean over target records of the per-record mean squared error (bootstrap interval)
    mae: IntervalEstimate  # the same for the absolute error
    baseline_mse: IntervalEstimate  # reconstructing every record as the auxiliary mean input of its class, eq. (2)
    baseline_mae: IntervalEstimate
    mse_gain: IntervalEstimate  # baseline_mse − mse on the same records (paired bootstrap); > 0: the outputs help
    mae_gain: IntervalEstimate
    reconstructions: torch.Tensor = field(repr=False)  # x̂ per target record, shaped like the inputs
    epochs_trained: int = 0  # the epoch whose network was kept (lowest held-out error)
    notes: str = ""

    def metrics(self) -> dict[str, IntervalEstimate]:
        return {name: getattr(self, name) for name in ("mse", "mae", "baseline_mse", "baseline_mae", "mse_gain", "mae_gain")}


def class_means(inputs: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The mean flattened input of each class [classes, width] over the given records — the
    class-level public statistic the baseline reconstructs from; a class without a record gets
    the mean of all of them (the best constant the attacker then has)."""
    overall = inputs.mean(0)
    means = overall.expand(num_classes, -1).clone()
    for label in torch.unique(labels).tolist():
        means[label] = inputs[labels == label].mean(0)
    return means


def model_queries(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor,
                  query: Literal["probabilities", "log-probabilities"] = "probabilities") -> torch.Tensor:
    """What the attacker reads from the model for each record: its output vector (float32)."""
    logits = logits_of(model, params, x).float()
    if query == "probabilities":
        return torch.softmax(logits, 1)
    if query == "log-probabilities":
        return torch.log_softmax(logits, 1)
    raise ValueError(f"query must be 'probabilities' or 'log-probabilities', got {query!r}")


def train_inverse_network(queries: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor, seed: int, *,
                          hidden: Sequence[int] = (256, 256), epochs: int = 300, batch_size: int = 64, lr: float = 1e-3,
                          patience: int = 30, validation_fraction: float = 0.1) -> tuple[inverse_network.InverseNetwork, int]:
    """Fit g: (query, label) → flattened input on auxiliary triples with Adam and squared error;
    keep the epoch with the lowest error on a held-out ``validation_fraction`` of them (epoch 0 =
    the untrained network = the auxiliary class means), stopping after ``patience`` epochs
    without a better one. Labels are class indices below the query's width (the model's
    classes). Returns the network and the epoch kept."""
    records = len(queries)
    order = numpy_rng(seed, "model-inversion", "validation").permutation(records)
    held_out = max(1, int(round(validation_fraction * records))) if records > 1 else 0
    validation, fitting = torch.as_tensor(order[:held_out]), torch.as_tensor(order[held_out:])
    labels = labels.to(queries.device)
    fit_q, fit_x, fit_y = queries[fitting], inputs[fitting], labels[fitting]
    if len(fit_q) == 0:
        raise ValueError("model inversion needs at least two auxiliary records")
    # standardisation from the fitting records only; a constant output coordinate gets scale 1
    query_mean = fit_q.mean(0)
    query_scale = fit_q.std(0, unbiased=False)
    query_scale = torch.where(query_scale > 1e-12, query_scale, torch.ones_like(query_scale))
    with torch.random.fork_rng(devices=[]):
        seed_torch(seed, "model-inversion", "init")
        fitted = (fit_q - query_mean) / query_scale
        network = inverse_network.InverseNetwork(queries.shape[1], inputs.shape[1], hidden, query_mean, query_scale,
                                 class_means(fit_x, fit_y, queries.shape[1]), fitted.min(0).values, fitted.max(0).values)
    network = network.to(queries.device)
    optimiser = torch.optim.Adam(network.parameters(), lr=lr)
    generator = torch_generator(seed, "model-inversion", "batches")

    def validation_error() -> float:
        if held_out == 0:
            return math.nan
        with torch.no_grad():
            return float(((network(queries[validation], labels[validation]) - inputs[validation]) ** 2).mean())

    best_error, best_epoch = validation_error(), 0
    best_state = {k: v.detach().clone() for k, v in network.state_dict().items()}
    for epoch in range(1, epochs + 1):
        permutation = torch.randperm(len(fit_q), generator=generator).to(queries.device)
        for start in range(0, len(fit_q), batch_size):
            batch = permutation[start:start + batch_size]
            optimiser.zero_grad()
            ((network(fit_q[batch], fit_y[batch]) - fit_x[batch]) ** 2).mean().backward()
            optimiser.step()
        error = validation_error()
        if held_out == 0 or error < best_error:
            best_error, best_epoch = error, epoch
            best_state = {k: v.detach().clone() for k, v in network.state_dict().items()}
        elif epoch - best_epoch >= patience:
            break
    network.load_state_dict(best_state)
    return network, best_epoch


def _paired_bootstrap(per_record: dict[str, np.ndarray], seed: int, resamples: int,
                      confidence: float) -> dict[str, IntervalEstimate]:
    """Mean of each per-record series with a percentile bootstrap interval; one set of resamples
    for all series, so differences of series are paired."""
    records = len(next(iter(per_record.values())))
    rng = numpy_rng(seed, "model-inversion", "bootstrap")
    samples: dict[str, list[np.ndarray]] = {name: [] for name in per_record}
    block = max(1, _BOOTSTRAP_BLOCK // max(records, 1))
    done = 0
    while records and done < resamples:
        size = min(block, resamples - done)
        weights = rng.multinomial(records, np.full(records, 1.0 / records), size=size).astype(np.float64)
        for name, values in per_record.items():
            samples[name].append(weights @ values / records)
        done += size
    tail = 100 * (1 - confidence) / 2
    out = {}
    for name, values in per_record.items():
        if not samples[name]:
            out[name] = IntervalEstimate(float(values.mean()) if records else math.nan)
            continue
        pooled = np.concatenate(samples[name])
        out[name] = IntervalEstimate(float(values.mean()), float(np.percentile(pooled, tail)),
                                     float(np.percentile(pooled, 100 - tail)))
    return out


def model_inversion(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    features: torch.Tensor,
    labels: torch.Tensor,
    target_index: np.ndarray,
    auxiliary_index: np.ndarray,
    seed: int,
    *,
    query: Literal["probabilities", "log-probabilities"] = "probabilities",
    hidden: Sequence[int] = (256, 256),
    epochs: int = 300,
    batch_size: int = 64,
    lr: float = 1e-3,
    patience: int = 30,
    resamples: int = 2000,
    confidence: float = 0.95,
    device: str = "cpu",
) -> ModelInversionResult:
    """Train an inverse network on the auxiliary records' (model output, input) pairs and
    reconstruct the target records from the model's outputs on them.

    ``features`` holds at least the rows picked by ``target_index`` (the records to
    reconstruct, e.g. the model's training records) and ``auxiliary_index`` (the attacker's
    data; must not overlap the targets); images are flattened. ``labels`` are the rows' class
    indices: the attacker knows each target's class, as in Fredrikson et al.'s setting, and so
    do both the baseline (the auxiliary mean of that class) and the inverse network. ``model``
    is the architecture template, run with ``params``. Deterministic in ``seed``.
    """
    target_index = np.asarray(target_index, dtype=np.int64)
    auxiliary_index = np.asarray(auxiliary_index, dtype=np.int64)
    if np.intersect1d(target_index, auxiliary_index).size:
        raise ValueError("target and auxiliary records overlap: the attacker would have trained on the targets")
    if len(target_index) == 0 or len(auxiliary_index) < 2:
        raise ValueError("model inversion needs target records and at least two auxiliary records")
    params = {name: value.to(device) for name, value in params.items()}
    model = model.to(device)
    aux_x = features[torch.as_tensor(auxiliary_index)].to(device)
    target_x = features[torch.as_tensor(target_index)].to(device)
    aux_flat = aux_x.reshape(len(aux_x), -1).float()
    target_flat = target_x.reshape(len(target_x), -1).float()
    aux_y = labels[torch.as_tensor(auxiliary_index)].to(device)
    target_y = labels[torch.as_tensor(target_index)].to(device)

    aux_queries = model_queries(model, params, aux_x, query)
    num_classes = aux_queries.shape[1]
    if int(labels.min()) < 0 or int(labels.max()) >= num_classes:
        raise ValueError(f"labels must be class indices 0..{num_classes - 1} (the model's outputs)")
    network, epoch = train_inverse_network(aux_queries, aux_flat, aux_y, seed,
                                           hidden=hidden, epochs=epochs, batch_size=batch_size, lr=lr, patience=patience)
    with torch.no_grad():
        reconstructed = network(model_queries(model, params, target_x, query), target_y)
    # the no-model reconstruction, eq. (2): the auxiliary mean of the target's class
    baseline = class_means(aux_flat, aux_y, num_classes)[target_y]

    attack_error = (reconstructed - target_flat).double().cpu().numpy()
    baseline_error = (baseline - target_flat).double().cpu().numpy()
    per_record = {
        "mse": (attack_error ** 2).mean(1), "mae": np.abs(attack_error).mean(1),
        "baseline_mse": (baseline_error ** 2).mean(1), "baseline_mae": np.abs(baseline_error).mean(1),
    }
    per_record["mse_gain"] = per_record["baseline_mse"] - per_record["mse"]
    per_record["mae_gain"] = per_record["baseline_mae"] - per_record["mae"]
    estimates = _paired_bootstrap(per_record, seed, resamples, confidence)
    notes = (f"inverse MLP {tuple(int(h) for h in hidden)} from the model's {query} ({reconstructed.shape[1]}-dim "
             f"input) trained on {len(auxiliary_index)} auxiliary records, epoch {epoch} kept; "
             f"{len(target_index)} target records; baseline = auxiliary mean input of the target's class; "
             f"gain = baseline error − attack error (paired bootstrap, {resamples} resamples)")
    return ModelInversionResult(**estimates, reconstructions=reconstructed.reshape(target_x.shape).cpu(),
                                epochs_trained=epoch, notes=notes)


# --------------------------------------------------------------------------- the registered attack


@dataclass(frozen=True)
class ModelInversionParams:
    max_targets: int = field(default=500, metadata={"min": 10, "help": "training records reconstructed (a random subset)"})
    epochs: int = field(default=300, metadata={"min": 1, "help": "training epochs of the inversion network (early stopping)"})


@ATTACKS.register
class ModelInversion(RunAttack):
    name = "model-inversion"
    summary = "an inversion network maps the model's outputs back to its training inputs (MSE/MAE vs a class-mean baseline)"
    reference = "Fredrikson, Jha, Ristenpart 2015 (as Feng et al. 2024, App. E, use it)"
    Params = ModelInversionParams

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        rng = numpy_rng(run.seed, "model-inversion", self.label)
        targets = np.sort(rng.permutation(run.members)[:self.params.max_targets])
        auxiliary = auxiliary_records(run.members, len(run.pool_y))
        outcome = model_inversion(run.model, run.params, run.pool_x, run.pool_y, targets, auxiliary,
                                  derive_seed(run.seed, "model-inversion", self.label), epochs=self.params.epochs,
                                  device=run.device)
        figures = []
        if run.kind == "image":
            shown = torch.as_tensor(targets[:16])
            truth = run.pool_x[shown]
            grid = image_grid_png(truth, outcome.reconstructions[:16].reshape(truth.shape).cpu(),
                                  (min(0.0, float(run.pool_x.min())), max(1.0, float(run.pool_x.max()))))
            figures.append({"title": f"{self.label}: {run.key}", "png": png_base64(grid),
                            "caption": "Training records (top) and their inversions from the model's output probabilities "
                                       "and their class (bottom)."})
        notes = (f"{len(targets)} training records of run 0, inversion network trained on {len(auxiliary)} records the run "
                 "did not train on; baseline = their mean input of the target's class; gain = baseline error − attack error "
                 "(paired bootstrap 95 %). " + outcome.notes)
        return [run_result(self.label, "", Unit.RECORD, outcome.metrics(), notes, figures)]
