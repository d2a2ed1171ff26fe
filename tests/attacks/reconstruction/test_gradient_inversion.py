"""Gradient inversion: image metrics, threat models, label recovery, DLG / iDLG / Inverting
Gradients on an untrained LeNet, and the ``dpfl-audit invert`` command.

Every optimisation runs single-threaded (intra-op threads only slow these tiny tensors down on
a shared machine) with fixed seeds, so the numbers are reproducible.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from attacks.reconstruction.dlg import dlg, idlg
from attacks.reconstruction.gradient_matching import cosine_distance, l2_distance, total_variation
from attacks.reconstruction.image_quality import (
    image_grid_png,
    image_quality,
    match_reconstructions,
    mse_per_image,
    png_base64,
    psnr_per_image,
    ssim_per_image,
)
from attacks.reconstruction.inversion import attack_batch, untrained_model
from attacks.reconstruction.label_recovery import count_labels, idlg_label, recover_labels
from attacks.threat_models import (
    ThreatModel,
    clip_upload,
    fedavg_upload,
    noisy_upload,
    secure_sum,
    single_gradient,
    upload_norm,
)
from audit.cli import main
from audit.core.datasets import load_dataset
from audit.core.seeding import torch_generator

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is the fastest



@pytest.fixture(scope="module")
def faces():
    return load_dataset("lfw-faces")


@pytest.fixture(scope="module")
def lenet(faces):
    model = untrained_model("lenet", faces.input_shape, faces.num_classes, seed=0)
    return model, {name: value.detach() for name, value in model.named_parameters()}


def random_ssim(truth: torch.Tensor, seed: int = 0) -> float:
    """SSIM of uniform noise against the truth: the baseline an attack must clearly beat."""
    noise = torch.rand(truth.shape, generator=torch.Generator().manual_seed(seed))
    return float(np.mean(ssim_per_image(truth, noise)))


# ------------------------------------------------------------------ image metrics


def test_identical_images_score_perfectly():
    images = torch.rand(3, 1, 25, 25, generator=torch.Generator().manual_seed(1))
    np.testing.assert_allclose(ssim_per_image(images, images), 1.0)
    assert (mse_per_image(images, images) == 0).all()
    assert np.isposinf(psnr_per_image(images, images)).all()  # 10·log10(range²/0), documented as +inf
    colour = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    np.testing.assert_allclose(ssim_per_image(colour, colour), 1.0)


def test_noise_of_known_variance():
    generator = torch.Generator().manual_seed(3)
    sigma, shape = 0.05, (4, 1, 32, 32)
    truth = torch.full(shape, 0.5, dtype=torch.float64)
    noisy = truth + sigma * torch.randn(shape, generator=generator, dtype=torch.float64)  # within [0, 1]: no clipping
    count = math.prod(shape[1:])
    mse = mse_per_image(truth, noisy)
    # the mean of n squared N(0, σ²) values has standard deviation σ²·√(2/n): allow 5 of them
    assert np.all(np.abs(mse - sigma ** 2) <= 5 * sigma ** 2 * math.sqrt(2 / count))
    np.testing.assert_allclose(psnr_per_image(truth, noisy), 10 * np.log10(1.0 / mse), rtol=1e-12)
    # data_range is the width of the range, not guessed from the dtype: twice the range, +20·log10(2) dB
    np.testing.assert_allclose(psnr_per_image(truth, noisy, data_range=2.0) - psnr_per_image(truth, noisy),
                               20 * math.log10(2.0), rtol=1e-9)
    # a constant image (σ_x = 0, equal means): SSIM = C2 / (σ² + C2) with C2 = (0.03·range)², ≈ 0.265
    c2 = (0.03 * 1.0) ** 2
    np.testing.assert_allclose(ssim_per_image(truth, noisy), c2 / (sigma ** 2 + c2), atol=0.03)


def test_hungarian_matching_restores_a_permuted_batch(faces):
    truth = faces.train.features[[3, 60, 120, 150, 190]]
    permutation = np.array([2, 4, 0, 1, 3])
    shuffled = truth[permutation] + 0.01 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(4))
    order = match_reconstructions(truth, shuffled)
    assert np.array_equal(permutation[order], np.arange(5))  # shuffled[order[i]] is truth[i]
    quality = image_quality(truth, shuffled)
    assert quality["order"] == order.tolist() and quality["mean_ssim"] > 0.95
    unmatched = image_quality(truth, shuffled, match=False)
    assert unmatched["mean_ssim"] < quality["mean_ssim"] and unmatched["mean_mse"] > 10 * quality["mean_mse"]


def test_image_grid_png_is_deterministic_and_laid_out(faces):
    from PIL import Image

    truth = faces.train.features[:3]
    reconstruction = torch.zeros_like(truth)
    png = image_grid_png(truth, reconstruction)
    assert png == image_grid_png(truth, reconstruction) and png.startswith(b"\x89PNG")
    picture = np.asarray(Image.open(io.BytesIO(png)))
    scale, gap = 96 // 25, 2
    assert picture.shape == (2 * 25 * scale + 3 * gap, 3 * 25 * scale + 4 * gap)
    first = np.round(truth[0, 0].numpy() * 255).astype(np.uint8).repeat(scale, 0).repeat(scale, 1)
    assert np.array_equal(picture[gap:gap + 25 * scale, gap:gap + 25 * scale], first)
    assert (picture[2 * gap + 25 * scale:2 * gap + 50 * scale, gap:gap + 25 * scale] == 0).all()
    import base64

    assert base64.b64decode(png_base64(png)) == png


# ------------------------------------------------------------------ threat models


def test_fedavg_one_step_is_minus_lr_times_the_gradient(faces, lenet):
    model, params = lenet
    x, y = faces.train.features[[5, 150]], faces.train.labels[[5, 150]]
    gradient = single_gradient(model, params, x, y)
    delta = fedavg_upload(model, params, x, y, local_steps=1, lr=0.05)
    for name in params:
        torch.testing.assert_close(delta[name], -0.05 * gradient[name], rtol=1e-5, atol=1e-8)
    # the attacker's unrolled simulation of 3 steps of 1 example equals the client's own training
    threat = ThreatModel("update", batch_size=2, local_steps=3, local_batch=1, lr=0.05)
    observed = threat.observe(model, params, x, y)
    dummy = x.clone().requires_grad_(True)
    simulated = threat.simulate(model, params, dummy, y)
    for name in params:
        torch.testing.assert_close(simulated[name].detach(), observed[name], rtol=1e-4, atol=1e-7)
    # ... and is differentiable in the dummy images through all three steps
    (image_gradient,) = torch.autograd.grad(l2_distance(simulated, {n: 0 * v for n, v in observed.items()}), dummy)
    assert image_gradient.abs().sum() > 0


def test_noisy_upload_clips_to_c_and_adds_sigma_c_noise(faces, lenet):
    model, params = lenet
    gradient = single_gradient(model, params, faces.train.features[:4], faces.train.labels[:4])
    clip, sigma = 0.5, 2.0
    assert upload_norm(gradient) > clip
    clipped = clip_upload(gradient, clip)
    assert upload_norm(clipped) <= clip * (1 + 1e-6)
    assert cosine_distance(clipped, gradient, layerwise=False) < 1e-6  # a rescaling, direction kept
    inside = clip_upload(gradient, 10 * upload_norm(gradient))  # within the ball: untouched
    assert all(torch.equal(inside[n], gradient[n]) for n in gradient)
    noisy = noisy_upload(gradient, clip, sigma, torch_generator(0, "test", "noise"))
    assert all(torch.equal(noisy_upload(gradient, clip, 0.0, torch_generator(0))[n], clipped[n]) for n in gradient)
    noise = torch.cat([(noisy[n] - clipped[n]).flatten() for n in gradient]).double()
    d = noise.numel()
    # sample std of d normals: relative standard error 1/√(2d); sample mean: σC/√d; 5 standard errors each
    assert abs(float(noise.std()) / (sigma * clip) - 1) <= 5 / math.sqrt(2 * d)
    assert abs(float(noise.mean())) <= 5 * sigma * clip / math.sqrt(d)
    again = noisy_upload(gradient, clip, sigma, torch_generator(0, "test", "noise"))
    assert all(torch.equal(again[n], noisy[n]) for n in gradient)  # same stream, same noise


def test_secure_sum_is_the_sum_of_the_clients_uploads(faces, lenet):
    model, params = lenet
    x, y = faces.train.features[[1, 2, 101, 102, 150, 160]], faces.train.labels[[1, 2, 101, 102, 150, 160]]
    threat = ThreatModel("gradient", batch_size=2, clients=3, clip=0.3)
    parts = [clip_upload(single_gradient(model, params, x[i:i + 2], y[i:i + 2]), 0.3) for i in (0, 2, 4)]
    observed = threat.observe(model, params, x, y)
    expected = secure_sum(parts)
    for name in params:
        torch.testing.assert_close(observed[name], expected[name])
        torch.testing.assert_close(expected[name], parts[0][name] + parts[1][name] + parts[2][name])
    simulated = threat.simulate(model, params, x, y)  # without noise the simulation is the observation
    for name in params:
        torch.testing.assert_close(simulated[name].detach(), observed[name])


def test_threat_model_rejects_bad_settings():
    from audit.core.errors import UserInputError

    with pytest.raises(UserInputError, match="threat.noise: needs a clip"):
        ThreatModel(noise=1.0)
    with pytest.raises(UserInputError, match="threat.batch_size"):
        ThreatModel(batch_size=0)
    with pytest.raises(UserInputError, match="threat.upload"):
        ThreatModel(upload="weights")


def test_matching_losses_and_prior():
    a = {"w": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([0.0, 2.0]), "b": torch.tensor([0.0])}
    assert float(l2_distance(a, b)) == pytest.approx(5.0)
    assert float(cosine_distance(a, a, layerwise=False)) == pytest.approx(0.0, abs=1e-7)
    assert float(cosine_distance(a, b, layerwise=False)) == pytest.approx(1.0)
    assert float(cosine_distance(a, {"w": -a["w"], "b": a["b"]}, layerwise=False)) == pytest.approx(2.0)
    flat = torch.ones(1, 1, 4, 4)
    stripes = torch.tensor([0.0, 1.0, 0.0, 1.0]).repeat(1, 1, 4, 1)  # columns alternate
    assert float(total_variation(flat)) == 0.0 and float(total_variation(stripes)) == pytest.approx(1.0)


# ------------------------------------------------------------------ label recovery


def test_idlg_recovers_every_single_label(faces, lenet):
    model, params = lenet
    digits = load_dataset("digits")
    digit_model = untrained_model("lenet", digits.input_shape, digits.num_classes, seed=1)
    digit_params = {n: v.detach() for n, v in digit_model.named_parameters()}
    cases = [(model, params, faces, i) for i in (0, 7, 42, 99, 100, 130, 175, 199)]
    cases += [(digit_model, digit_params, digits, i) for i in range(0, 400, 20)]  # all 10 classes
    for net, weights, data, i in cases:
        x, y = data.train.features[i:i + 1], data.train.labels[i:i + 1]
        for threat in (ThreatModel(), ThreatModel("update", lr=0.1), ThreatModel(clip=0.1)):
            observed = threat.observe(net, weights, x, y)
            assert recover_labels(net, weights, observed, threat, data.input_shape).tolist() == y.tolist()
    assert idlg_label(torch.tensor([[0.3, 0.2], [-0.4, -0.1], [0.05, 0.0]])) == 1


def test_label_counts_of_a_batch(lenet, faces):
    # n_i = N p̄_i − G_i: with the true p̄ the counts are exact, whatever the order
    probabilities = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    labels = torch.tensor([2, 0, 2, 1, 2])
    counts = torch.bincount(labels, minlength=3).double()
    assert count_labels(5 * probabilities - counts, 5, probabilities).tolist() == [0, 1, 2, 2, 2]
    model, params = lenet
    digits = load_dataset("digits")
    net = untrained_model("lenet", digits.input_shape, digits.num_classes, seed=2)
    weights = {n: v.detach() for n, v in net.named_parameters()}
    threat = ThreatModel(batch_size=8)
    for start in (0, 8, 16):
        y = digits.train.labels[start:start + 8]
        observed = threat.observe(net, weights, digits.train.features[start:start + 8], y)
        assert recover_labels(net, weights, observed, threat, digits.input_shape).tolist() == sorted(y.tolist())


# ------------------------------------------------------------------ the attacks


def test_dlg_reconstructs_a_single_image_with_its_label(faces, lenet):
    model, params = lenet
    x, y = faces.train.features[[42]], faces.train.labels[[42]]
    threat = ThreatModel()
    result = dlg(model, params, threat.observe(model, params, x, y), threat, faces.input_shape, iterations=40, seed=0)
    ssim = float(ssim_per_image(x, result.images)[0])
    assert result.labels.tolist() == y.tolist()
    assert ssim > random_ssim(x) + 0.5 and result.images.min() >= 0 and result.images.max() <= 1


def test_idlg_and_same_seed_same_result(faces, lenet):
    model, params = lenet
    x, y = faces.train.features[[150]], faces.train.labels[[150]]
    threat = ThreatModel()
    observed = threat.observe(model, params, x, y)
    first = idlg(model, params, observed, threat, faces.input_shape, iterations=40, seed=3)
    again = idlg(model, params, observed, threat, faces.input_shape, iterations=40, seed=3)
    assert torch.equal(first.images, again.images) and first.matching_loss == again.matching_loss
    assert first.labels.tolist() == y.tolist() and float(ssim_per_image(x, first.images)[0]) > 0.9


def test_inverting_gradients_attacks_a_fedavg_update(faces, lenet):
    model, params = lenet
    x, y = faces.train.features[[60]], faces.train.labels[[60]]
    threat = ThreatModel("update", local_steps=2, lr=0.01)
    outcome = attack_batch("inverting-gradients", model, params, x, y, threat, iterations=300, seed=0)
    assert outcome["label_accuracy"] == 1.0 and outcome["ssim"][0] > 0.8


def run_invert(capsys, *args) -> dict:
    assert main(["invert", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_invert_command_inverting_gradients_with_and_without_noise(capsys, tmp_path):
    common = ["--attack", "inverting-gradients", "--dataset", "lfw-faces", "--model", "lenet", "--batch-size", "1",
              "--images", "3", "--iterations", "500", "--seed", "0"]
    clean = run_invert(capsys, *common, "--out", str(tmp_path / "clean"))
    assert {"ssim", "psnr", "mse", "label_accuracy", "per_image", "attack", "grid"} <= set(clean)
    assert clean["ssim"] >= 0.9 and clean["label_accuracy"] == 1.0 and clean["mse"] < 0.01
    assert len(clean["per_image"]["ssim"]) == 3 and (tmp_path / "clean" / "grid.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "clean" / "results.json").read_text())["ssim"] == clean["ssim"]
    noisy = run_invert(capsys, *common, "--clip", "1", "--noise", "1", "--out", str(tmp_path / "noisy"))
    assert noisy["ssim"] <= 0.2 and noisy["psnr"] < clean["psnr"] - 10


@pytest.mark.parametrize(("args", "names"), [
    (["--attack", "dgl"], ["--attack", "inverting-gradients"]),
    (["--attack", "dlg", "--dataset", "faces"], ["--dataset", "lfw-faces"]),
    (["--attack", "dlg", "--model", "lenett"], ["--model", "lenet"]),
    (["--attack", "dlg", "--batch-size", "0"], ["--batch-size", "[1, 256]"]),
    (["--attack", "dlg", "--noise", "1"], ["--noise", "--clip"]),
    (["--attack", "dlg", "--clip", "-1"], ["--clip"]),
    (["--attack", "dlg", "--images", "3", "--batch-size", "2"], ["--images"]),
    (["--attack", "dlg", "--dataset", "diabetes"], ["--dataset", "not an image dataset"]),
])
def test_invert_bad_input_exits_2_with_one_line(capsys, tmp_path, args, names):
    out = tmp_path / "out"
    assert main(["invert", *args, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpfl-audit: error: --") and captured.out == ""
    assert all(name in lines[0] for name in names)
    assert not out.exists()
