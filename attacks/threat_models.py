"""Threat models of gradient inversion: what the server observes from a client's batch.

Pure functions from a client's batch to its upload: :func:`single_gradient` (one batch gradient:
FedSGD, the threat model of DLG, Zhu et al. 2019, and Inverting Gradients, Geiping et al. 2020),
:func:`fedavg_upload` (the model delta after local SGD steps; Geiping et al. 2020, §6),
:func:`noisy_upload` (ℓ2 clipping to C plus N(0, (σC)²) per coordinate: the DP threat model
of DP-FedAvg, McMahan et al. 2018; the clip is flat over the whole upload, or per parameter tensor
as DP-FedSAM's public code and ``dp-fedavg``'s ``clip_mode: per_tensor`` do) and :func:`secure_sum`
(the server sees only the sum of K uploads). :class:`ThreatModel` composes them and also gives the attacker's *differentiable
simulation* of the same upload on dummy data (:meth:`ThreatModel.simulate`), so every attack
matches like with like: gradient vs dummy gradient, update vs simulated update.

Uploads are dicts of tensors keyed by parameter name (the layout of ``model.named_parameters``);
everything runs in float32 on the device of the parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import torch_generator
from defenses.blocks.clipping import clip_rows, clip_rows_per_tensor, tensor_slices
from defenses.blocks.local_training import Params
from defenses.blocks.noise import gaussian_rows

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")
    nn = lazy_module("torch.nn")


UPLOADS = ("gradient", "update")
CLIP_MODES = ("flat", "per_tensor")


# --------------------------------------------------------------------------- the loss a client differentiates


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of a batch; ``labels`` are class indices or rows of probabilities.

    Probability rows are what DLG optimises as dummy labels (softmax of free logits).
    """
    if labels.is_floating_point():
        return -(labels * F.log_softmax(logits, dim=1)).sum(1).mean()
    return F.cross_entropy(logits, labels)


def _leaves(params: Params) -> Params:
    """Fresh leaf copies that require grad, so autograd can differentiate with respect to them."""
    return {name: value.detach().requires_grad_(True) for name, value in params.items()}


def _gradient(model: nn.Module, params: Params, images: torch.Tensor, labels: torch.Tensor,
              create_graph: bool) -> Params:
    loss = cross_entropy(torch.func.functional_call(model, params, (images,)), labels)
    grads = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph)
    return dict(zip(params, grads))


# --------------------------------------------------------------------------- threat models (pure functions)


def single_gradient(model: nn.Module, params: Params, images: torch.Tensor, labels: torch.Tensor,
                    create_graph: bool = False) -> Params:
    """The gradient of the batch's mean cross-entropy with respect to every parameter.

    With ``create_graph`` the result stays differentiable in ``images`` (and in soft ``labels``):
    that is the attacker's simulation; without it the result is detached: what a client sends
    (FedSGD, the threat model of DLG and Inverting Gradients).
    """
    gradient = _gradient(model, _leaves(params), images, labels, create_graph)
    return gradient if create_graph else {name: g.detach() for name, g in gradient.items()}


def local_batches(examples: int, local_batch: int | None, local_steps: int) -> list[slice]:
    """The mini-batches of local training: consecutive slices of ``local_batch`` examples
    (the last one of a pass may be smaller), cycling over the client's data in order.

    No shuffling, so the attacker's simulation sees the same split of its dummy batch into
    steps (which dummy sits in which mini-batch is then part of what it reconstructs).
    """
    size = examples if local_batch is None else min(int(local_batch), examples)
    starts = list(range(0, examples, size))
    return [slice(starts[s % len(starts)], min(starts[s % len(starts)] + size, examples)) for s in range(local_steps)]


def fedavg_upload(model: nn.Module, params: Params, images: torch.Tensor, labels: torch.Tensor,
                  local_steps: int = 1, local_batch: int | None = None, lr: float = 0.1,
                  create_graph: bool = False) -> Params:
    """A FedAvg client's model delta θ_S − θ_0 after ``local_steps`` SGD steps of learning rate η.

    θ_{s+1} = θ_s − η ∇_θ L(θ_s; batch_s), batches from :func:`local_batches`. With
    ``create_graph`` the steps are unrolled in one autograd graph (each gradient itself
    differentiable, ``torch.func.functional_call`` on the stepped parameters), so the delta is a
    differentiable function of the dummy images: the attacker's simulation (Geiping et al. 2020,
    §6 "federated averaging"). With one step the delta is exactly −η × :func:`single_gradient`.
    """
    start = _leaves(params)
    current = start
    for batch in local_batches(images.shape[0], local_batch, local_steps):
        grads = _gradient(model, current, images[batch], labels[batch], create_graph)
        current = {name: value - lr * grads[name] for name, value in current.items()}
        if not create_graph:  # the client's own training: no graph across steps
            current = _leaves(current)
    delta = {name: current[name] - start[name] for name in start}
    return delta if create_graph else {name: d.detach() for name, d in delta.items()}


def _flat(upload: Params) -> torch.Tensor:
    return torch.cat([value.reshape(-1) for value in upload.values()])


def _unflat(vector: torch.Tensor, like: Params) -> Params:
    out, start = {}, 0
    for name, value in like.items():
        out[name] = vector[start:start + value.numel()].view_as(value)
        start += value.numel()
    return out


def upload_norm(upload: Params) -> float:
    """ℓ2 norm of the whole upload (all parameters as one vector)."""
    return float(torch.linalg.vector_norm(_flat(upload).to(torch.float64)))


def clip_upload(upload: Params, clip: float, clip_mode: str = "flat") -> Params:
    """ℓ2 clipping: flat over all parameters, u · min(1, C/‖u‖₂) (McMahan et al. 2018), or with
    ``clip_mode="per_tensor"`` every parameter tensor u_l · min(1, C/‖u_l‖₂) separately — the
    defense's own :func:`defenses.blocks.clipping.clip_rows_per_tensor`, each entry of ``upload`` one tensor.

    Differentiable in ``upload`` (the attacker simulates it; it is deterministic).
    """
    row = _flat(upload)[None, :]
    if clip_mode == "flat":
        clipped, _, _ = clip_rows(row, clip)
    elif clip_mode == "per_tensor":
        clipped, _, _ = clip_rows_per_tensor(row, clip, tensor_slices([value.numel() for value in upload.values()]))
    else:
        raise ValueError(f"clip_mode must be one of {', '.join(CLIP_MODES)}, got {clip_mode!r}")
    return _unflat(clipped[0], upload)


def noisy_upload(upload: Params, clip: float, noise: float, generator: torch.Generator,
                 clip_mode: str = "flat") -> Params:
    """The DP threat model: the upload clipped to ℓ2 norm C (:func:`clip_upload`, flat or per
    tensor), plus N(0, (σC)²) on every coordinate.

    ``noise`` is the noise multiplier σ (the Gaussian mechanism of DP-SGD / DP-FedAvg applied
    to this one upload); the noise comes from ``generator`` (:func:`audit.core.seeding.torch_generator`).
    Per-tensor clipping leaves the noise std σC per coordinate, as DP-FedAvg draws it.
    """
    clipped = clip_upload({name: value.detach() for name, value in upload.items()}, clip, clip_mode)
    flat = _flat(clipped)
    if noise > 0:
        flat = flat + gaussian_rows(1, flat.numel(), noise * clip, [generator], flat.device)[0]
    return _unflat(flat.clone(), clipped)


def secure_sum(uploads: Sequence[Params]) -> Params:
    """What secure aggregation reveals: the coordinate-wise sum of the clients' uploads."""
    if not uploads:
        raise ValueError("secure_sum needs at least one upload")
    return {name: torch.stack([u[name] for u in uploads]).sum(0) for name in uploads[0]}


@dataclass(frozen=True)
class ThreatModel:
    """What the server observes from the attacked clients, composed from the functions above.

    Each of ``clients`` clients holds ``batch_size`` examples (consecutive slices of the batch)
    and uploads its gradient (``upload="gradient"``) or its FedAvg model delta (``"update"``:
    ``local_steps`` steps of ``local_batch`` examples, learning rate ``lr``); with ``clip`` the
    upload is clipped (``clip_mode``: flat or per parameter tensor) and noised
    (:func:`noisy_upload`, ``noise`` = σ); with ``clients`` > 1 the
    server sees only the sum (:func:`secure_sum`) and the attack reconstructs all
    ``clients × batch_size`` images.
    """

    upload: Literal["gradient", "update"] = "gradient"
    batch_size: int = 1
    clients: int = 1
    local_steps: int = 1
    local_batch: int | None = None
    lr: float = 0.1
    clip: float | None = None
    noise: float = 0.0
    clip_mode: Literal["flat", "per_tensor"] = "flat"

    def __post_init__(self) -> None:
        if self.upload not in UPLOADS:
            raise UserInputError(f"threat.upload: unknown upload '{self.upload}'; allowed: {', '.join(UPLOADS)}")
        for name in ("batch_size", "clients", "local_steps"):
            if int(getattr(self, name)) < 1:
                raise UserInputError(f"threat.{name}: must be >= 1, got {getattr(self, name)}")
        if self.local_batch is not None and int(self.local_batch) < 1:
            raise UserInputError(f"threat.local_batch: must be >= 1, got {self.local_batch}")
        if not self.lr > 0:
            raise UserInputError(f"threat.lr: must be > 0, got {self.lr}")
        if self.clip is not None and not self.clip > 0:
            raise UserInputError(f"threat.clip: must be > 0, got {self.clip}")
        if self.noise < 0:
            raise UserInputError(f"threat.noise: must be >= 0, got {self.noise}")
        if self.noise > 0 and self.clip is None:
            raise UserInputError("threat.noise: needs a clip norm (the noise std is σ·C)")
        if self.clip_mode not in CLIP_MODES:
            raise UserInputError(f"threat.clip_mode: unknown mode '{self.clip_mode}'; allowed: {', '.join(CLIP_MODES)}")

    @property
    def examples(self) -> int:
        """How many images the attack reconstructs (all clients together)."""
        return self.batch_size * self.clients

    def describe(self) -> str:
        what = "gradient" if self.upload == "gradient" else \
            f"FedAvg update ({self.local_steps} local steps, lr {self.lr:g}, batch {self.local_batch or self.batch_size})"
        text = f"{what} of {self.batch_size} image{'s' if self.batch_size > 1 else ''}"
        if self.clip is not None:
            per_tensor = " per parameter tensor" if self.clip_mode == "per_tensor" else ""
            text += f", clipped{per_tensor} to {self.clip:g}" + (f", Gaussian noise σ = {self.noise:g}" if self.noise > 0 else "")
        if self.clients > 1:
            text += f", secure sum of {self.clients} clients"
        return text

    def _client_upload(self, model: nn.Module, params: Params, images: torch.Tensor, labels: torch.Tensor,
                       create_graph: bool) -> Params:
        if self.upload == "gradient":
            return single_gradient(model, params, images, labels, create_graph)
        return fedavg_upload(model, params, images, labels, self.local_steps, self.local_batch, self.lr, create_graph)

    def _check(self, images: torch.Tensor) -> None:
        if images.shape[0] != self.examples:
            raise ValueError(f"the threat model expects {self.examples} images ({self.clients} clients × "
                             f"{self.batch_size}), got {images.shape[0]}")

    def observe(self, model: nn.Module, params: Params, images: torch.Tensor, labels: torch.Tensor,
                seed: int = 0) -> Params:
        """What the server sees. Client k's noise comes from the stream (seed, "threat", "client", k)."""
        self._check(images)
        uploads = []
        for k in range(self.clients):
            part = slice(k * self.batch_size, (k + 1) * self.batch_size)
            upload = self._client_upload(model, params, images[part], labels[part], create_graph=False)
            if self.clip is not None:
                upload = noisy_upload(upload, self.clip, self.noise, torch_generator(seed, "threat", "client", k),
                                      self.clip_mode)
            uploads.append(upload)
        return secure_sum(uploads)

    def simulate(self, model: nn.Module, params: Params, images: torch.Tensor, labels: torch.Tensor) -> Params:
        """The attacker's differentiable copy of :meth:`observe` on dummy data.

        Clipping is simulated (it is deterministic); the noise is not — it is unknown and has
        mean zero, so the noiseless upload is the attacker's best prediction of the observation.
        """
        self._check(images)
        uploads = []
        for k in range(self.clients):
            part = slice(k * self.batch_size, (k + 1) * self.batch_size)
            upload = self._client_upload(model, params, images[part], labels[part], create_graph=True)
            uploads.append(clip_upload(upload, self.clip, self.clip_mode) if self.clip is not None else upload)
        return secure_sum(uploads) if len(uploads) > 1 else uploads[0]

    def example_sum_factor(self) -> float:
        """f such that f × (observed last-layer bias) ≈ Σ over all examples of ∂ℓ/∂b.

        A gradient is a batch mean (× batch size); a FedAvg delta is −η × the sum of its
        steps' batch means, and with every example seen equally often that is
        −η (S/n) Σ_examples ∂ℓ/∂b (× −n/(ηS)). Sums over clients add up. The clip factor is
        unknown to the attacker and ignored (only the sign survives for batch 1).
        """
        if self.upload == "gradient":
            return float(self.batch_size)
        return -float(self.batch_size) / (self.lr * self.local_steps)
