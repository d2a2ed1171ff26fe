"""Model zoo. Every factory takes ``(input_shape, num_classes, **options)`` and returns an ``nn.Module``.

All models are buffer-free (no BatchNorm running statistics), so a client's whole state is its
parameters and the engine can train many clients at once with ``torch.func``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.registry import Registry
from audit.core.schema import check_options

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")

ModelFactory = Callable[..., "nn.Module"]
MODELS: Registry[ModelFactory] = Registry("model")


def _flat_size(module: nn.Module, input_shape: Sequence[int]) -> int:
    with torch.no_grad():
        return int(math.prod(module(torch.zeros(1, *input_shape)).shape[1:]))


def _image_shape(input_shape: Sequence[int], model: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise UserInputError(f"model.name: '{model}' needs image input (C×H×W), the dataset gives shape {tuple(input_shape)}")
    return int(input_shape[0]), int(input_shape[1]), int(input_shape[2])


@MODELS.register("mlp")
def mlp(input_shape: Sequence[int], num_classes: int, hidden: tuple[int, ...] = (128,)) -> nn.Module:
    """Fully connected network: flatten → [Linear → ReLU]* → Linear."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = int(math.prod(input_shape))
    for size in hidden:
        if int(size) < 1:
            raise UserInputError(f"model.options.hidden: layer sizes must be >= 1, got {list(hidden)}")
        layers += [nn.Linear(width, int(size)), nn.ReLU()]
        width = int(size)
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def mlp_parameter_shapes(input_shape: Sequence[int], num_classes: int,
                         hidden: Sequence[int] = (128,)) -> dict[str, tuple[int, ...]]:
    """The trainable parameters of :func:`mlp` (name → shape, in the model's order) without building
    it, so without torch: ``dpfl-audit list`` states the defenses' claims at the default model's size."""
    shapes: dict[str, tuple[int, ...]] = {}
    width = int(math.prod(input_shape))
    for index, size in enumerate([*map(int, hidden), int(num_classes)]):
        layer = 1 + 2 * index  # nn.Sequential's index: the Flatten first, a ReLU after each hidden layer
        shapes[f"{layer}.weight"], shapes[f"{layer}.bias"] = (size, width), (size,)
        width = size
    return shapes


@MODELS.register("cnn2")
def cnn2(input_shape: Sequence[int], num_classes: int, dropout: bool = True) -> nn.Module:
    """The two-convolution CNN of Reddi et al. 2021 (Cheng et al. 2022's "CNN-2-Layers", §6).

    Conv(C→32, 3×3) → ReLU → Conv(32→64, 3×3) → ReLU → MaxPool 2 → Dropout 0.25 → Flatten →
    FC 128 → ReLU → Dropout 0.5 → FC classes; 1,206,590 parameters on 28×28×1 with 62 classes.
    """
    channels, _, _ = _image_shape(input_shape, "cnn2")
    features = nn.Sequential(
        nn.Conv2d(channels, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25 if dropout else 0.0), nn.Flatten(),
    )
    width = _flat_size(features, input_shape)
    return nn.Sequential(
        *features, nn.Linear(width, 128), nn.ReLU(), nn.Dropout(0.5 if dropout else 0.0), nn.Linear(128, num_classes)
    )


@MODELS.register("cnn-mcmahan")
def cnn_mcmahan(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """The CNN of McMahan et al. 2017 (FedAvg), as Kerkouche et al. 2021 use it (its parameter count
    reproduces every bandwidth cell of their Table 1).

    Conv(C→32, 5×5, pad 2) → ReLU → MaxPool 2 → Conv(32→64, 5×5, pad 2) → ReLU → MaxPool 2 →
    FC 512 → ReLU → FC classes: exactly 1,663,370 parameters on 28×28×1 with 10 classes.
    """
    channels, _, _ = _image_shape(input_shape, "cnn-mcmahan")
    features = nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    )
    width = _flat_size(features, input_shape)
    return nn.Sequential(*features, nn.Linear(width, 512), nn.ReLU(), nn.Linear(512, num_classes))


@MODELS.register("cnn-fedsam")
def cnn_fedsam(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """The EMNIST CNN of DP-FedSAM's public code (Shi et al. 2023, §6.1: two 5×5 convolutions, max
    pooling, a 512-unit dense layer).

    Conv(C→32, 5×5) → MaxPool 2 → ReLU → Conv(32→64, 5×5) → MaxPool 2 → ReLU → FC 512 → ReLU →
    FC classes: 903,614 parameters on 32×32×1 with 62 classes (608,702 on 28×28×1).
    """
    channels, _, _ = _image_shape(input_shape, "cnn-fedsam")
    features = nn.Sequential(
        nn.Conv2d(channels, 32, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(32, 64, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(),
    )
    width = _flat_size(features, input_shape)
    return nn.Sequential(*features, nn.Linear(width, 512), nn.ReLU(), nn.Linear(512, num_classes))


@MODELS.register("cnn-small")
def cnn_small(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """A small CNN for CPU proxies of the papers' experiments (our choice: ≈20–50k parameters).

    Conv(C→16, 5×5, stride 2) → ReLU → Conv(16→32, 5×5, stride 2) → ReLU → FC 64 → ReLU → FC
    classes: 46,730 parameters on 28×28×1 with 10 classes.
    """
    channels, _, _ = _image_shape(input_shape, "cnn-small")
    features = nn.Sequential(nn.Conv2d(channels, 16, 5, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 5, stride=2), nn.ReLU(),
                             nn.Flatten())
    width = _flat_size(features, input_shape)
    return nn.Sequential(*features, nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, num_classes))


@MODELS.register("cnn-tiny")
def cnn_tiny(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """The PyTorch MNIST example CNN (our lighter choice for LDP-FL's "two-layer CNN", whose layers
    Sun et al. 2021 do not give).

    Conv(C→10, 5×5) → MaxPool 2 → ReLU → Conv(10→20, 5×5) → MaxPool 2 → ReLU → FC 50 → ReLU → FC
    classes: 21,840 parameters on 28×28×1 with 10 classes.
    """
    channels, _, _ = _image_shape(input_shape, "cnn-tiny")
    features = nn.Sequential(nn.Conv2d(channels, 10, 5), nn.MaxPool2d(2), nn.ReLU(),
                             nn.Conv2d(10, 20, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten())
    width = _flat_size(features, input_shape)
    return nn.Sequential(*features, nn.Linear(width, 50), nn.ReLU(), nn.Linear(50, num_classes))


@MODELS.register("cnn-udpfl")
def cnn_udpfl(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """UDP-FL's MNIST CNN (Feng et al. 2024, §5.1, and its public code).

    Conv(C→32, 3×3, pad 1) → ReLU → MaxPool 2 → Conv(32→64, 3×3, pad 1) → ReLU → MaxPool 2 →
    FC 128 → ReLU → FC classes: 421,642 parameters on 28×28×1 with 10 classes.
    """
    channels, _, _ = _image_shape(input_shape, "cnn-udpfl")
    features = nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    )
    width = _flat_size(features, input_shape)
    return nn.Sequential(*features, nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, num_classes))


@MODELS.register("lenet")
def lenet(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """The small sigmoid LeNet of DLG (Zhu et al. 2019) and Inverting Gradients (Geiping et al. 2020).

    Three 5×5 convolutions with 12 channels (strides 2, 2, 1, padding 2) and sigmoid activations,
    then one linear layer. Smooth activations make gradient inversion well posed.
    """
    channels, _, _ = _image_shape(input_shape, "lenet")
    body = nn.Sequential(
        nn.Conv2d(channels, 12, 5, padding=2, stride=2), nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid(), nn.Flatten(),
    )
    width = _flat_size(body, input_shape)
    return nn.Sequential(*body, nn.Linear(width, num_classes))


@MODELS.register("resnet18-gn")
def resnet18_gn(input_shape: Sequence[int], num_classes: int, groups: int = 2) -> nn.Module:
    """ResNet-18 (He et al. 2016) with GroupNorm instead of BatchNorm and the CIFAR stem.

    CIFAR stem: a 3×3 stride-1 first convolution and no max-pool. GroupNorm (``groups`` groups:
    2 as in Hsieh et al. 2020; DP-FedSAM's code uses 32) keeps the model buffer-free, which client-level DP needs (no
    running statistics escape clipping and noise). 11,173,962 parameters with 10 classes.
    """
    from torchvision.models import resnet18

    channels, _, _ = _image_shape(input_shape, "resnet18-gn")
    # GroupNorm splits each layer's channels into `groups` equal groups: 0 would divide by zero and a
    # negative count or one that does not divide the narrowest layer (64 channels) fails in training
    if not (isinstance(groups, int) and groups >= 1 and 64 % groups == 0):
        raise UserInputError(f"model.options.groups: {groups!r} does not divide the 64 channels of the narrowest layer; "
                             "allowed: 1, 2, 4, 8, 16, 32, 64")
    model = resnet18(num_classes=num_classes, norm_layer=lambda width: nn.GroupNorm(groups, width))
    model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    for module in model.modules():  # in-place ReLU does not compose with torch.func transforms
        if isinstance(module, nn.ReLU):
            module.inplace = False
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(name: str, input_shape: Sequence[int], num_classes: int, options: dict | None = None) -> nn.Module:
    """Build a registered model (or a user's ``module:callable``) and check it fits the engine."""
    factory = MODELS.get(name, "model.name")
    options = dict(options or {})
    parameters = inspect.signature(factory).parameters
    accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    allowed = [p for p in parameters if p not in ("input_shape", "num_classes")]
    for key in options:
        if key not in parameters and not accepts_kwargs:
            raise UserInputError(f"model.options.{key}: unknown option for model '{name}'; allowed: "
                                 f"{', '.join(allowed) or 'none'}")
    try:
        model = factory(tuple(input_shape), int(num_classes), **check_options(factory, options, "model.options"))
    except UserInputError:
        raise
    except (TypeError, ValueError, RuntimeError) as exc:
        what = " ".join(str(exc).split())
        if not options:  # nothing the user chose but the model and the data: the inputs do not fit it
            raise UserInputError(f"model.name: model '{name}' cannot take inputs of shape {tuple(input_shape)} "
                                 f"(the dataset's): {what}") from exc
        raise UserInputError(f"model.options: model '{name}' rejected its options on inputs of shape "
                             f"{tuple(input_shape)}: {what}") from exc
    if not isinstance(model, nn.Module):
        raise UserInputError(f"model.name: '{name}' returned {type(model).__name__}, not a torch.nn.Module")
    if any(True for _ in model.buffers()):
        raise UserInputError(
            f"model.name: '{name}' has buffers (e.g. BatchNorm running statistics); use GroupNorm/LayerNorm, "
            f"since buffers would bypass clipping and noise"
        )
    return model
