"""Model zoo: exact parameter counts, shapes, buffer-free, user factories."""

from __future__ import annotations

import pytest
import torch

from audit.core.errors import UserInputError
from audit.core.models import MODELS, build_model, count_parameters


@pytest.mark.parametrize("name,shape,classes,expected", [
    ("cnn-mcmahan", (1, 28, 28), 10, 1_663_370),   # McMahan et al. 2017's CNN, as Kerkouche et al. 2021 train it
    ("cnn2", (1, 28, 28), 62, 1_206_590),          # Reddi et al. 2021's CNN, as Cheng et al. 2022 train it
    ("cnn-fedsam", (1, 32, 32), 62, 903_614),      # the CNN of DP-FedSAM's official code (Shi et al. 2023)
    ("cnn-fedsam", (1, 28, 28), 62, 608_702),
    ("cnn-small", (1, 28, 28), 10, 46_730),
    ("cnn-udpfl", (1, 28, 28), 10, 421_642),
    ("cnn-tiny", (1, 28, 28), 10, 21_840),
    ("resnet18-gn", (3, 32, 32), 10, 11_173_962),
    ("lenet", (3, 32, 32), 100, 85_036),           # DLG's LeNet: 768 features before the FC layer
    ("mlp", (1, 8, 8), 10, 64 * 128 + 128 + 128 * 10 + 10),
])
def test_parameter_counts(name, shape, classes, expected):
    model = build_model(name, shape, classes)
    assert count_parameters(model) == expected
    assert model(torch.zeros(2, *shape)).shape == (2, classes)
    assert not list(model.buffers())


def test_registry_names():
    assert set(MODELS.names()) == {"mlp", "cnn2", "cnn-mcmahan", "cnn-fedsam", "cnn-small", "cnn-tiny", "cnn-udpfl",
                                   "lenet", "resnet18-gn"}


def test_bad_options_and_shapes():
    with pytest.raises(UserInputError, match="model.options.width.*allowed: hidden"):
        build_model("mlp", (1, 8, 8), 10, {"width": 3})
    with pytest.raises(UserInputError, match="image input"):
        build_model("cnn2", (10,), 2)


def test_user_factory_by_module_reference(tmp_path):
    source = tmp_path / "my_models.py"
    source.write_text("import torch\ndef tiny(input_shape, num_classes):\n"
                      "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, num_classes))\n"
                      "def with_bn(input_shape, num_classes):\n"
                      "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(64), "
                      "torch.nn.Linear(64, num_classes))\n")
    model = build_model(f"{source}:tiny", (1, 8, 8), 10)
    assert count_parameters(model) == 650
    with pytest.raises(UserInputError, match="buffers"):
        build_model(f"{source}:with_bn", (1, 8, 8), 10)
    with pytest.raises(UserInputError, match="no callable 'missing'"):
        build_model(f"{source}:missing", (1, 8, 8), 10)
