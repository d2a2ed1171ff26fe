"""Inverting Gradients (Geiping, Bauermeister, Dröge, Moeller 2020, "Inverting Gradients — How
easy is it to break privacy in federated learning?", NeurIPS 2020).

The attacker holds the model θ and the observed upload ∇W (a gradient, a FedAvg delta, a
noisy or securely summed one: :class:`attacks.threat_models.ThreatModel`) and solves
(Eq. 4)

    argmin_{x ∈ [0, 1]^n}  1 − ⟨∇W(x, y), ∇W⟩ / (‖∇W(x, y)‖ ‖∇W‖)  +  α_TV · TV(x)

where ∇W(x, y) is the attacker's simulation of the same upload on dummy images x. The
paper's choices, kept here:

* cosine similarity instead of DLG's Euclidean distance: the angle of the gradient carries the
  image, its magnitude mostly the training state (and clipping/learning rates only rescale).
  By default one cosine per parameter tensor, summed (the authors' ``cost_fn='simlocal'``);
  ``layerwise=False`` gives the paper's single cosine of the whole gradient (``'sim'``). Why:
  on an untrained sigmoid LeNet with PyTorch's initialisation the last layer's gradient is
  ~2,000× larger than the first's, so the whole-gradient cosine reaches float32's floor
  (~1e-7) while the first layers — which carry the pixels — are still unmatched (measured on
  16 lfw-faces images: mean SSIM 0.68 whole vs 0.98 layer-wise after 500 iterations);
* total variation as the image prior, weight α_TV (1e-3 here, see ``DEFAULT_TV``);
* Adam on the *sign* of the gradient (signed gradient descent, as in adversarial attacks),
  step size reduced ×0.1 at 3/8, 5/8 and 7/8 of the iterations;
* box constraint: after every step x is projected onto the data range;
* restarts from fresh random images, keeping the one with the lowest matching loss (without
  the prior: the authors' ``scoring_choice='loss'``);
* labels: iDLG's rule for a single image, otherwise the given or recovered labels
  (:func:`attacks.reconstruction.label_recovery.recover_labels`).

Deviation: the authors optimise standardised images from N(0, 1); our images live in their
data range (here [0, 1]) and start uniform in it, so the default step size is in data units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attacks.reconstruction.gradient_matching import Reconstruction, attack_setup, cosine_distance, total_variation
from attacks.threat_models import Params, ThreatModel
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

#: the paper runs 4,800 iterations on 32×32 CIFAR-10 (24,000 for ImageNet); on 25×25 LeNet
#: 2,000 suffice for all but near-black images (docs/explanation/attacks.md, "Gradient inversion")
DEFAULT_ITERATIONS = 2000
DEFAULT_LR = 0.1
#: α_TV: the paper's 1e-4 weighs one whole-gradient cosine (at most 2); the layer-wise loss used
#: here sums one cosine distance per parameter tensor, and 1e-3 measured best on lfw-faces/LeNet
DEFAULT_TV = 1e-3


def decay_milestones(iterations: int) -> list[int]:
    """Where the step size drops ×0.1: 3/8, 5/8 and 7/8 of the run (the authors' MultiStepLR)."""
    return [int(iterations * fraction) for fraction in (3 / 8, 5 / 8, 7 / 8)]


def matching_loss(model: nn.Module, params: Params, observed: Params, threat: ThreatModel,
                  images: torch.Tensor, labels: torch.Tensor, layerwise: bool = True) -> float:
    """The score of a candidate: cosine distance between its simulated upload and the observed one."""
    simulated = threat.simulate(model, params, images.detach().requires_grad_(True), labels)
    return float(cosine_distance(simulated, observed, layerwise).detach())


def reconstruct(model: nn.Module, params: Params, observed: Params, threat: ThreatModel,
                image_shape: Sequence[int], labels: torch.Tensor | None = None,
                iterations: int = DEFAULT_ITERATIONS, restarts: int = 1, seed: int = 0,
                data_range: tuple[float, float] = (0.0, 1.0), lr: float = DEFAULT_LR,
                tv: float = DEFAULT_TV, layerwise: bool = True, signed: bool = True) -> Reconstruction:
    """Reconstruct the ``threat.examples`` images behind ``observed`` (Geiping et al. 2020, Eq. 4).

    ``image_shape`` is one image's (C, H, W); ``labels`` the true labels if the attacker knows
    them (otherwise recovered); ``iterations`` signed-Adam steps of size ``lr`` per restart;
    ``tv`` the total-variation weight α_TV; ``layerwise`` sums 1 − cos over layers instead of
    one cosine over the whole upload. Restart r starts from uniform noise drawn from the seed
    stream (seed, "inverting-gradients", "restart", r), so a seed fixes the result.
    Returns the best restart's images (in the data range), the labels used and its cosine
    distance.
    """
    params, observed, labels = attack_setup(model, params, observed, threat, image_shape, labels, iterations, restarts,
                                            data_range, seed)
    low, high = data_range
    device = labels.device
    shape = (threat.examples, *image_shape)

    best = Reconstruction(torch.empty(0), labels.cpu(), float("inf"))
    for restart in range(restarts):
        generator = torch_generator(seed, "inverting-gradients", "restart", restart)
        images = (low + (high - low) * torch.rand(shape, generator=generator)).to(device).requires_grad_(True)
        optimizer = torch.optim.Adam([images], lr=lr)
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=decay_milestones(iterations), gamma=0.1)
        for _ in range(iterations):
            optimizer.zero_grad(set_to_none=True)
            simulated = threat.simulate(model, params, images, labels)
            loss = cosine_distance(simulated, observed, layerwise) + tv * total_variation(images)
            loss.backward()
            if signed:  # signed gradient: every pixel moves by the step size, whatever its gradient's scale
                images.grad.sign_()
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                images.clamp_(low, high)  # the box constraint: stay in the data range
        score = matching_loss(model, params, observed, threat, images, labels, layerwise)
        if score < best.matching_loss or best.images.numel() == 0:
            best = Reconstruction(images.detach().cpu().clone(), labels.cpu(), score)
    return best
