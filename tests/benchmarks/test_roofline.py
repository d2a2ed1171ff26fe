"""The roofline's FLOP and byte counting (benchmarks/roofline.py): the analytical
LeNet count is the textbook formula and equals torch's FlopCounterMode, for one model and for
clients batched with vmap as the engine runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from audit.core.models import build_model
from defenses.blocks import grouped_network
from defenses.blocks.local_training import LocalObjective
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def roofline():
    return load_script(ROOT / "benchmarks" / "roofline.py", "dpfl_bench_roofline")


def test_lenet_analytical_count_is_the_conv_formula(roofline):
    model = build_model("lenet", (1, 28, 28), 10)
    count = roofline.analytical_flops(model, (1, 28, 28))

    def conv(cin, cout, k, hout, wout):  # 2·C_in·C_out·k²·H_out·W_out per example
        return 2 * cin * cout * k * k * hout * wout

    layers = [conv(1, 12, 5, 14, 14), conv(12, 12, 5, 7, 7), conv(12, 12, 5, 7, 7), 2 * 12 * 7 * 7 * 10]
    assert count["layers_forward"] == layers
    assert count["forward_per_example"] == sum(layers) == 834_960
    # backward: weight gradients of every layer + input gradients of all but the first
    assert count["backward_per_example"] == 2 * sum(layers) - layers[0]


@pytest.mark.parametrize("name, shape", [("lenet", (1, 28, 28)), ("mlp", (1, 8, 8))])
def test_analytical_count_equals_flop_counter(roofline, name, shape):
    model = build_model(name, shape, 10)
    assert roofline.counted_step_flops(model, shape, batch=3) == roofline.analytical_flops(model, shape)["per_example"]


def test_vmapped_clients_count_as_many_single_steps(roofline):
    """The engine's batched gradient (clients as one network of grouped convolutions, bmm) counts what
    the clients' separate steps would: the channel padding on the CPU is not counted."""
    shape, clients, batch = (1, 28, 28), 3, 4
    model = build_model("lenet", shape, 10)
    params = {n: p.detach().unsqueeze(0).repeat(clients, *[1] * p.dim()) for n, p in model.named_parameters()}
    x = torch.rand(clients, batch, *shape)
    y = torch.zeros(clients, batch, dtype=torch.int64)
    counter = roofline.flop_counter()
    with counter:
        LocalObjective().batched_gradient(model, params, params, x, y, torch.ones(clients, batch))
    assert counter.get_total_flops() == clients * batch * roofline.analytical_flops(model, shape)["per_example"]
    assert grouped_network.applies(model, x)  # the path counted is the grouped network's
    padded = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: roofline._conv_backward_flop})
    with padded:  # without the counter's unpadding: the 16-channel groups' multiply-adds
        LocalObjective().batched_gradient(model, params, params, x, y, torch.ones(clients, batch))
    assert padded.get_total_flops() > counter.get_total_flops()


def test_torch_counts_a_grouped_weight_gradient_once_per_group(roofline):
    """Why roofline.flop_counter corrects torch's formula: torch counts the weight gradient of a
    convolution with g groups g times (if a torch release fixes it, this test says so)."""
    groups, batch = 3, 4
    x = torch.rand(batch, groups * 12, 14, 14)
    w = torch.rand(groups * 12, 12, 5, 5, requires_grad=True)
    x1, w1 = torch.rand(batch, 12, 14, 14), torch.rand(12, 12, 5, 5, requires_grad=True)

    def count(counter, x, w, g) -> int:
        with counter:
            torch.autograd.grad(torch.nn.functional.conv2d(x, w, stride=2, padding=2, groups=g).sum(), [w])
        return counter.get_flop_counts()["Global"][torch.ops.aten.convolution_backward]

    single = count(FlopCounterMode(display=False), x1, w1, 1)
    assert count(FlopCounterMode(display=False), x, w, groups) == groups * groups * single  # g× too many
    assert count(roofline.flop_counter(), x, w, groups) == groups * single


def test_bytes_model_and_bound(roofline):
    model = build_model("lenet", (1, 28, 28), 10)
    traffic = roofline.bytes_model(model, (1, 28, 28), 16)
    # per example: conv and sigmoid outputs 2·(12·14·14 + 12·7·7 + 12·7·7) + 10 logits (Flatten is a view)
    assert traffic["intermediate_elements"] == 2 * (2352 + 588 + 588) + 10
    assert traffic["parameters"] == 13_426
    expected = 4 * (4 * 784 + 5 * traffic["intermediate_elements"] + 6 * 13_426 / 16)
    assert traffic["bytes_per_example"] == pytest.approx(expected)
    assert roofline.roofline_bound(2.0, 100e9, 10e9) == pytest.approx(
        {"bound_flops": 20e9, "bound_by": "memory", "ridge_intensity": 10.0, "memory_bound_flops": 20e9})
    assert roofline.roofline_bound(50.0, 100e9, 10e9)["bound_by"] == "compute"
