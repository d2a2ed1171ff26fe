"""Deep Leakage from Gradients and its label-recovering variant.

* **DLG** (Zhu, Liu, Han 2019, "Deep Leakage from Gradients", NeurIPS 2019, Alg. 1): draw
  dummy images x' ~ N(0, 1) and dummy label logits, and minimise the squared Euclidean
  distance between the dummy upload and the observed one (Eq. 2),

      x'*, y'* = argmin_{x', y'} ‖∇W(x', softmax(y')) − ∇W‖²,

  jointly over images and soft labels with L-BFGS (step size 1). The recovered label of each
  image is the argmax of its dummy label.
* **iDLG** (Zhao, Mopuri, Bilen 2020, "iDLG: Improved Deep Leakage from Gradients", §3): for
  a single image, cross-entropy makes the true label the only row of the last layer's weight
  gradient with negative sign, so the label is read off first
  (:func:`attacks.reconstruction.label_recovery.idlg_label`) and L-BFGS runs on the image alone, from
  uniform noise. For batches > 1 the labels come from the counting heuristic of
  :func:`attacks.reconstruction.label_recovery.count_labels` (not part of iDLG).

Both match the attacker's simulation of the threat model (:meth:`ThreatModel.simulate`), so
they also run against FedAvg deltas and secure sums. Details the papers leave open, fixed here:

* one L-BFGS iteration per ``optimizer.step`` (history 100), so ``iterations`` counts
  iterations (the authors call ``step`` 300 times with torch's default of up to 20 each);
* a strong-Wolfe line search, where both papers' code steps with size 1 and none, and the
  loss divided by its starting value (a constant: the minimiser is unchanged; the reported
  matching loss is Eq. 2 itself). Why: on an untrained model with PyTorch's default
  initialisation the ℓ2 loss is tiny (~1e-4 for a gradient, ~1e-8 for a FedAvg delta); torch's
  L-BFGS then rejects every curvature pair (its y·s > 1e-10 test) and crawls as gradient
  descent of step 1, and its line search stops at fixed absolute tolerances (1e-9). Measured
  on lfw-faces/LeNet, batch 1: iDLG stalled at its first image without these, and reaches SSIM
  1.000 on 20 of 20 images in 100 iterations with them. A restart stops early when its loss
  turns non-finite or a step leaves the variables unchanged (the line search found no
  decrease), and every restart keeps its best iterate;
* the returned images are clipped to the data range (neither paper boxes the optimisation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attacks.reconstruction.gradient_matching import (
    Reconstruction,
    attack_setup,
    check_attack_inputs,
    l2_distance,
    labels_for,
)
from attacks.reconstruction.label_recovery import last_layer
from attacks.threat_models import Params, ThreatModel
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")
    nn = lazy_module("torch.nn")

#: the papers' 300 L-BFGS ``step`` calls, counted here as iterations
DEFAULT_ITERATIONS = 300


def _lbfgs_match(model: nn.Module, params: Params, observed: Params, threat: ThreatModel,
                 images: torch.Tensor, labels: torch.Tensor | None, label_logits: torch.Tensor | None,
                 iterations: int) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """Minimise the ℓ2 distance ‖∇W' − ∇W‖² with L-BFGS over the images (and the dummy label
    logits, when given); returns the best iterate (images, label logits) and its distance."""
    variables = [images] + ([label_logits] if label_logits is not None else [])
    # one iteration per step (≤ 25 evaluations in its line search); tolerances 0: a step that
    # finds no decrease ends the loop below instead
    optimizer = torch.optim.LBFGS(variables, lr=1.0, max_iter=1, max_eval=25, history_size=100,
                                  tolerance_grad=0.0, tolerance_change=0.0, line_search_fn="strong_wolfe")
    best: dict = {"loss": float("inf"), "images": images.detach().clone(),
                  "logits": None if label_logits is None else label_logits.detach().clone()}

    def distance() -> torch.Tensor:
        targets = labels if label_logits is None else F.softmax(label_logits, dim=1)
        return l2_distance(threat.simulate(model, params, images, targets), observed)

    # Eq. 2 divided by its value at the start, a constant: the same minimiser, but a loss that
    # starts at 1 whatever the upload's scale (learning rate, clipping, initialisation). torch's
    # strong-Wolfe search has fixed absolute tolerances (1e-9) and gives up on tiny losses.
    with torch.enable_grad():
        scale = float(distance().detach()) or 1.0
    if not math.isfinite(scale):
        return best["images"], best["logits"], float("inf")

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = distance() / scale
        loss.backward()
        value = float(loss.detach()) * scale  # reported unscaled: the paper's Eq. 2
        if value < best["loss"]:  # the loss belongs to the point it was evaluated at: keep that point
            best.update(loss=value, images=images.detach().clone(),
                        logits=None if label_logits is None else label_logits.detach().clone())
        return loss

    for _ in range(iterations):
        before = [v.detach().clone() for v in variables]
        loss = optimizer.step(closure)
        if not torch.isfinite(loss) or not all(torch.isfinite(v).all() for v in variables):
            break  # diverged: the best iterate so far stands
        if all(torch.equal(old, new) for old, new in zip(before, variables)):
            break  # the line search found no decrease: L-BFGS is deterministic, later steps would repeat it
    return best["images"], best["logits"], best["loss"]


def _finish(images: torch.Tensor, data_range: tuple[float, float]) -> torch.Tensor:
    return images.detach().cpu().clamp(*data_range)


def dlg(model: nn.Module, params: Params, observed: Params, threat: ThreatModel, image_shape: Sequence[int],
        labels: torch.Tensor | None = None, iterations: int = DEFAULT_ITERATIONS, restarts: int = 1, seed: int = 0,
        data_range: tuple[float, float] = (0.0, 1.0)) -> Reconstruction:
    """DLG (Zhu et al. 2019, Alg. 1): L-BFGS on dummy images and dummy soft labels, ℓ2 gradient distance.

    Restart r draws images low + (high − low)·N(0, 1) (N(0, 1) for [0, 1] data, as the
    authors) and label logits N(0, 1) from the stream (seed, "dlg", "restart", r); the restart
    with the lowest matching loss wins. Known ``labels`` are used as given (the soft labels are
    then not optimised). Returns images clipped to the data range, the argmax of the dummy
    labels, and the ℓ2 distance.
    """
    check_attack_inputs(iterations, restarts, data_range)
    low, high = data_range
    device = next(iter(params.values())).device
    params = {name: value.detach() for name, value in params.items()}
    observed = {name: value.detach() for name, value in observed.items()}
    fixed = None if labels is None else labels_for(model, params, observed, threat, image_shape, labels,
                                                   data_range, seed).to(device)
    num_classes = int(params[last_layer(params)[0]].shape[0])  # the dummy labels' length
    best = Reconstruction(torch.empty(0), torch.empty(0, dtype=torch.int64), float("inf"))
    for restart in range(restarts):
        generator = torch_generator(seed, "dlg", "restart", restart)
        images = (low + (high - low) * torch.randn((threat.examples, *image_shape), generator=generator))
        images = images.to(device).requires_grad_(True)
        logits = None
        if fixed is None:
            logits = torch.randn((threat.examples, num_classes), generator=generator).to(device).requires_grad_(True)
        found, found_logits, loss = _lbfgs_match(model, params, observed, threat, images, fixed, logits, iterations)
        if loss < best.matching_loss or best.images.numel() == 0:
            found_labels = fixed.cpu() if fixed is not None else found_logits.argmax(1).cpu()
            best = Reconstruction(_finish(found, data_range), found_labels, loss)
    return best


def idlg(model: nn.Module, params: Params, observed: Params, threat: ThreatModel, image_shape: Sequence[int],
         labels: torch.Tensor | None = None, iterations: int = DEFAULT_ITERATIONS, restarts: int = 1, seed: int = 0,
         data_range: tuple[float, float] = (0.0, 1.0)) -> Reconstruction:
    """iDLG (Zhao et al. 2020): the label from the last layer's gradient, then DLG on the images only.

    Labels: ``labels`` if given, else :func:`attacks.reconstruction.label_recovery.recover_labels` (iDLG's
    exact rule for one image). Restart r draws images uniform in the data range (the authors'
    ``torch.rand``) from the stream (seed, "idlg", "restart", r). Returns images clipped to the
    data range, the labels and the ℓ2 distance of the best restart.
    """
    params, observed, labels = attack_setup(model, params, observed, threat, image_shape, labels, iterations, restarts,
                                            data_range, seed)
    low, high = data_range
    device = labels.device
    best = Reconstruction(torch.empty(0), labels.cpu(), float("inf"))
    for restart in range(restarts):
        generator = torch_generator(seed, "idlg", "restart", restart)
        images = (low + (high - low) * torch.rand((threat.examples, *image_shape), generator=generator))
        images = images.to(device).requires_grad_(True)
        found, _, loss = _lbfgs_match(model, params, observed, threat, images, labels, None, iterations)
        if loss < best.matching_loss or best.images.numel() == 0:
            best = Reconstruction(_finish(found, data_range), labels.cpu(), loss)
    return best
