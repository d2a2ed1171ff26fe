"""What the server sees of an upload (attacks/server_view.py) and the replays built on it:
DP-FedAvg's per-tensor clipping in gradient inversion and property inference, each upload's
noise share and the noise of the aggregate the server sees under secure aggregation.

Expected values come from the definitions: a tensor u_l is clipped to u_l·min(1, S/‖u_l‖₂); each
of the m uploads of a round carries N(0, S²σ²/m) per coordinate, so their sum carries N(0, S²σ²).
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attacks.inference.property_inference import flat_gradient, privatised_upload
from attacks.reconstruction.gradient_inversion import GradientInversion, ReconstructionParams
from attacks.server_view import UploadView, upload_view
from attacks.threat_models import ThreatModel, single_gradient
from audit.core.datasets import load_dataset
from audit.core.models import build_model
from audit.core.seeding import torch_generator
from defenses.blocks.flat import ParamLayout
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.training_job import TrainingConfig


@pytest.fixture(scope="module")
def digits_mlp():
    """A seeded MLP on digits, its parameters as the run store loads them (sorted by name, not in
    the model's order) and a batch of 8 records."""
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("mlp", data.input_shape, 10, {"hidden": [32]})
    params = {name: value.detach().clone() for name, value in sorted(model.named_parameters())}
    return model, params, data.train.features[:8], data.train.labels[:8]


def _norms(upload: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(torch.linalg.vector_norm(value.double())) for name, value in upload.items()}


def _between_tensor_norms(gradient: dict[str, torch.Tensor]) -> float:
    """A clip S below some tensors' norms and above the others' (so per-tensor and flat clipping differ)."""
    norms = sorted(_norms(gradient).values())
    assert norms[0] < norms[-1]
    return float(np.sqrt(norms[len(norms) // 2 - 1] * norms[len(norms) // 2]))


def test_per_tensor_view_clips_every_tensor_to_s_and_keeps_the_others():
    view = upload_view(DPFedAvg(DPFedAvgParams(clip=1.0, clip_mode="per_tensor")), TrainingConfig(), 4)
    assert view.clip_mode == "per_tensor" and view.clip == 1.0
    # three tensors of 2 numbers with norms 5, 0.8 and 0.9; S = 1
    rows = torch.tensor([[3.0, 4.0, 0.48, 0.64, 0.54, 0.72]])
    clipped = view.clip_rows(rows, [2, 2, 2])
    torch.testing.assert_close(clipped[0, :2], torch.tensor([0.6, 0.8]))  # (3, 4)/5: norm exactly S
    assert torch.equal(clipped[0, 2:], rows[0, 2:])  # inside the ball: kept bit for bit
    # the flat clip scales every tensor by S/‖u‖ = 1/√(25 + 0.64 + 0.81)
    flat = upload_view(DPFedAvg(DPFedAvgParams(clip=1.0)), TrainingConfig(), 4)
    assert flat.clip_mode == "flat"
    torch.testing.assert_close(flat.clip_rows(rows, [2, 2, 2]), rows / math.sqrt(26.45))
    with pytest.raises(ValueError, match="add up to"):
        view.clip_rows(rows, [2, 2])


def test_per_tensor_replay_is_the_defenses_own_clip(digits_mlp):
    """The replay clips every parameter tensor as DPFedAvg.clip does, whatever order the attacker
    flattens its upload in (the store's sorted names here, not the model's layout order)."""
    model, params, x, y = digits_mlp
    layout = ParamLayout.of(model)
    gradient = single_gradient(model, params, x, y)
    assert list(gradient) != list(layout.names)  # the orders really differ
    clip = _between_tensor_norms(gradient)
    defense = DPFedAvg(DPFedAvgParams(clip=clip, clip_mode="per_tensor")).bind(layout)
    view = upload_view(defense, TrainingConfig(), 4)
    sizes = [value.numel() for value in gradient.values()]
    replayed = view.clip_rows(torch.cat([g.reshape(-1) for g in gradient.values()])[None, :], sizes)[0]
    by_name = dict(zip(gradient, torch.split(replayed, sizes)))
    own = layout.unflatten(defense.clip(layout.flatten(gradient)[None, :])[0][0])
    raw = _norms(gradient)
    for name, value in gradient.items():
        torch.testing.assert_close(by_name[name], own[name].reshape(-1), rtol=0, atol=0)
        norm = float(torch.linalg.vector_norm(by_name[name].double()))
        if raw[name] > clip:
            assert norm == pytest.approx(clip, rel=1e-6)
        else:
            assert torch.equal(by_name[name], value.reshape(-1))
    with pytest.raises(ValueError, match="not the defense's parameter tensors"):
        view.clip_rows(torch.zeros(1, 6), [3, 3])


def test_property_inference_replays_per_tensor_clipping(digits_mlp):
    model, params, x, y = digits_mlp
    gradient = single_gradient(model, params, x, y)
    clip = _between_tensor_norms(gradient)
    view = upload_view(DPFedAvg(DPFedAvgParams(clip=clip, clip_mode="per_tensor")), TrainingConfig(), 4)
    sizes = [value.numel() for value in params.values()]
    upload = privatised_upload(flat_gradient(model, params), replace(view, noise=0.0), sizes, torch_generator(0))(x, y)
    raw = _norms(gradient)
    assert max(raw.values()) > clip > min(raw.values())
    for (name, value), part in zip(gradient.items(), torch.split(upload, sizes)):
        expected = value.reshape(-1) * min(1.0, clip / raw[name])
        torch.testing.assert_close(part, expected, rtol=1e-6, atol=1e-9)


def test_gradient_inversion_replays_per_tensor_clipping(digits_mlp):
    model, params, x, y = digits_mlp
    defense = DPFedAvg(DPFedAvgParams(clip=0.1, noise_multiplier=1.0, clip_mode="per_tensor"))
    run = SimpleNamespace(defense=defense, training=TrainingConfig(client_rate=0.5), clients=[np.arange(4)] * 8)
    threat = GradientInversion(ReconstructionParams(threat="gradient", batch_size=8)).threat(run)
    assert threat.clip_mode == "per_tensor" and "clipped per parameter tensor to 0.1" in threat.describe()
    gradient = single_gradient(model, params, x, y)
    clip = _between_tensor_norms(gradient)
    noiseless = replace(threat, clip=clip, noise=0.0)
    observed, simulated = noiseless.observe(model, params, x, y), noiseless.simulate(model, params, x, y)
    raw = _norms(gradient)
    for name, value in gradient.items():
        torch.testing.assert_close(observed[name], value * min(1.0, clip / raw[name]), rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(simulated[name].detach(), observed[name])
    flat = ThreatModel("gradient", batch_size=8, clip=clip).observe(model, params, x, y)
    assert not all(torch.allclose(flat[name], observed[name]) for name in gradient)


@pytest.mark.parametrize("clip_mode", ["flat", "per_tensor"])
def test_each_upload_carries_its_share_and_the_aggregate_s_sigma(clip_mode):
    """Per-upload noise std S·σ/√m in either clip mode; the sum of the m uploads the server sees
    under secure aggregation has std √m·S·σ/√m = S·σ."""
    clip, sigma, d = 0.5, 2.0, 200_000
    training = TrainingConfig(client_rate=0.25)  # m = 10 of 40 clients
    view = upload_view(DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma, clip_mode=clip_mode,
                                               secure_aggregation=True)), training, 40)
    assert (view.clients, view.summed_by) == (10, "secure aggregation")
    assert view.observed_noise == pytest.approx(clip * sigma)
    generator = torch_generator(0, "test", "aggregate")
    upload = privatised_upload(lambda x, y: torch.zeros(d), view, [d // 2, d // 2], generator)
    one = upload(None, None).double()
    total = sum(upload(None, None).double() for _ in range(view.clients))
    tolerance = 5 / math.sqrt(2 * d)  # relative standard error of a sample std: 1/√(2d)
    assert abs(float(one.std()) / (clip * sigma / math.sqrt(10)) - 1) <= tolerance
    assert abs(float(total.std()) / (clip * sigma) - 1) <= tolerance
    alone = upload_view(DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma, clip_mode=clip_mode)), training, 40)
    assert (alone.clients, alone.observation()) == (1, "each upload")
    assert alone.observed_noise == pytest.approx(clip * sigma / math.sqrt(10))


def test_aggregate_noise_placement_is_observed_as_the_sum():
    view = upload_view(DPFedAvg(DPFedAvgParams(noise_placement="aggregate")), TrainingConfig(client_rate=0.5), 8)
    assert view.clients == 4 and view.observation().startswith("the aggregate of 4 uploads (a trusted aggregator")
    assert UploadView(None, 0.0, 1).observed_noise == 0.0
    with pytest.raises(ValueError, match="clip_mode"):
        UploadView(1.0, 0.0, 1, "per_layer")
