"""Gradient inversion end to end: what a server reconstructs from one client's upload, and how well.

:func:`attack_batch` is the unit the audit pipeline and ``dpfl-audit invert`` share: observe
a client's batch through a :class:`~attacks.threat_models.ThreatModel`, run one of the
reconstruction attacks on the observation, and score the reconstruction against the private
batch (best-matched order, :mod:`attacks.reconstruction.image_quality`). :func:`invert` is the command's
experiment: the classic single-gradient setting on an *untrained* model (initialised from the
seed, as DLG and Inverting Gradients evaluate), batch after batch.

Random streams (:mod:`audit.core.seeding`): model init (seed, "invert", "model"); image choice
(seed, "invert", "images"); batch b's observation noise and attack restarts under
derive_seed(seed, "invert", "batch", b). The same seed gives the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from attacks.reconstruction import dlg, inverting_gradients
from attacks.reconstruction.gradient_matching import Reconstruction
from attacks.reconstruction.image_quality import image_grid_png, image_quality
from attacks.threat_models import Params, ThreatModel
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.models import build_model
from audit.core.seeding import derive_seed, numpy_rng, seed_torch

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

#: name → reconstruct(model, params, observed, threat, image_shape, labels=None, iterations=, restarts=, seed=, data_range=)
RECONSTRUCTION_ATTACKS: dict[str, Callable[..., Reconstruction]] = {
    "dlg": dlg.dlg,
    "idlg": dlg.idlg,
    "inverting-gradients": inverting_gradients.reconstruct,
}
DEFAULT_ITERATIONS = {
    "dlg": dlg.DEFAULT_ITERATIONS,
    "idlg": dlg.DEFAULT_ITERATIONS,
    "inverting-gradients": inverting_gradients.DEFAULT_ITERATIONS,
}
REFERENCES = {
    "dlg": "Zhu, Liu, Han 2019, Deep Leakage from Gradients",
    "idlg": "Zhao, Mopuri, Bilen 2020, iDLG: Improved Deep Leakage from Gradients",
    "inverting-gradients": "Geiping, Bauermeister, Dröge, Moeller 2020, Inverting Gradients",
}


def reconstruction_attack(name: str) -> Callable[..., Reconstruction]:
    if name not in RECONSTRUCTION_ATTACKS:
        raise UserInputError(f"attack: unknown reconstruction attack '{name}'; allowed: {', '.join(RECONSTRUCTION_ATTACKS)}")
    return RECONSTRUCTION_ATTACKS[name]


def data_range_of(features: torch.Tensor) -> tuple[float, float]:
    """The range the images live in: [0, 1] for this project's datasets, widened if the data exceed it."""
    return min(0.0, float(features.min())), max(1.0, float(features.max()))


def attack_batch(attack: str, model: nn.Module, params: Params, images: torch.Tensor, labels: torch.Tensor,
                 threat: ThreatModel, iterations: int | None = None, restarts: int = 1, seed: int = 0,
                 data_range: tuple[float, float] = (0.0, 1.0), known_labels: bool = False, **settings) -> dict:
    """Observe the clients' batch under ``threat``, reconstruct it with ``attack``, score it.

    ``images``/``labels`` are the private batch of all attacked clients (``threat.examples``
    images, client k holding the k-th slice of ``threat.batch_size``); ``known_labels`` hands
    the true labels to the attacker (otherwise it recovers them); ``settings`` go to the attack
    (e.g. ``tv=`` for Inverting Gradients). The observation's noise and the attack's restarts
    use streams under ``seed``. Returns the matched reconstruction (``images``, ``labels``:
    reconstruction i is paired with private image i), per-image ``mse``/``psnr``/``ssim``,
    ``label_accuracy`` (share of private images whose matched reconstruction carries the true
    label), and the attack's ``matching_loss``.
    """
    reconstruct = reconstruction_attack(attack)
    device = next(iter(params.values())).device
    images, labels = images.to(device), labels.to(device)
    observed = threat.observe(model, params, images, labels, seed=seed)
    result = reconstruct(model, params, observed, threat, tuple(images.shape[1:]),
                         labels=labels if known_labels else None,
                         iterations=iterations or DEFAULT_ITERATIONS[attack], restarts=restarts, seed=seed,
                         data_range=data_range, **settings)
    quality = image_quality(images, result.images, data_range[1] - data_range[0])
    order = torch.as_tensor(quality["order"])
    matched_labels = result.labels[order]
    return {
        "images": result.images[order], "labels": matched_labels, "matching_loss": result.matching_loss,
        "mse": quality["mse"], "psnr": quality["psnr"], "ssim": quality["ssim"],
        "label_accuracy": float((matched_labels == labels.cpu()).double().mean()),
    }


def untrained_model(model_name: str, input_shape: Sequence[int], num_classes: int, seed: int) -> nn.Module:
    """The model at its initialisation from (seed, "invert", "model"), in eval mode (no dropout);
    the global torch random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        seed_torch(seed, "invert", "model")
        model = build_model(model_name, input_shape, num_classes)
    return model.eval()


def invert(attack: str, dataset, model_name: str, batch_size: int, images: int | None = None,
           clip: float | None = None, noise: float = 0.0, iterations: int | None = None, restarts: int = 1,
           seed: int = 0) -> dict:
    """The single-gradient experiment of ``dpfl-audit invert`` on a loaded image ``dataset``.

    ``images`` (default one batch) private images drawn without replacement are cut into
    batches of ``batch_size``; each batch's gradient on the untrained model — clipped to
    ``clip`` and noised with σ = ``noise`` when given — is attacked separately. Returns the
    means (``ssim``, ``psnr``, ``mse``, ``label_accuracy``), per-image values, the settings,
    and the PNG bytes of the grid (private images above, reconstructions below) as ``png``.
    """
    reconstruction_attack(attack)
    count = batch_size if images is None else images
    if count % batch_size:
        raise UserInputError(f"--images: {count} images do not split into batches of {batch_size}")
    if count > len(dataset.train):
        raise UserInputError(f"--images: {dataset.name} has {len(dataset.train)} images, {count} requested")
    threat = ThreatModel("gradient", batch_size=batch_size, clip=clip, noise=noise)
    model = untrained_model(model_name, dataset.input_shape, dataset.num_classes, seed)
    params = {name: value.detach() for name, value in model.named_parameters() if value.requires_grad}
    data_range = data_range_of(dataset.train.features)
    chosen = np.sort(numpy_rng(seed, "invert", "images").choice(len(dataset.train), count, replace=False))
    truth, reconstructions, recovered, losses = [], [], [], []
    per_image: dict[str, list] = {"mse": [], "psnr": [], "ssim": []}
    correct = 0.0
    for b, start in enumerate(range(0, count, batch_size)):
        index = torch.as_tensor(chosen[start:start + batch_size])
        x, y = dataset.train.features[index], dataset.train.labels[index]
        outcome = attack_batch(attack, model, params, x, y, threat, iterations, restarts,
                               seed=derive_seed(seed, "invert", "batch", b), data_range=data_range)
        truth.append(x)
        reconstructions.append(outcome["images"])
        recovered.extend(int(v) for v in outcome["labels"])
        losses.append(outcome["matching_loss"])
        correct += outcome["label_accuracy"] * batch_size
        for key in per_image:
            per_image[key].extend(outcome[key])
    png = image_grid_png(torch.cat(truth), torch.cat(reconstructions), data_range)
    return {
        "attack": attack, "reference": REFERENCES[attack], "dataset": dataset.name, "model": model_name,
        "threat": threat.describe(), "batch_size": batch_size, "images": count, "clip": clip, "noise": noise,
        "iterations": iterations or DEFAULT_ITERATIONS[attack], "restarts": restarts, "seed": seed,
        "ssim": float(np.mean(per_image["ssim"])), "psnr": float(np.mean(per_image["psnr"])),
        "mse": float(np.mean(per_image["mse"])), "label_accuracy": correct / count,
        "per_image": {"index": chosen.tolist(), "label": dataset.train.labels[torch.as_tensor(chosen)].tolist(),
                      "recovered_label": recovered, **per_image},
        "matching_loss": losses, "png": png,
    }
