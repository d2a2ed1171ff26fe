"""Loss-landscape diagnostics: filter normalisation, sharpness, perturbation robustness."""

from __future__ import annotations

import torch

from defenses.blocks.flat import parameters_of
from defenses.fedavg import FedAvg
from defenses.federated.diagnostics import filter_normalized_direction, perturbation_robustness, sharpness


def test_filter_normalized_direction():
    params = {"w": torch.randn(6, 4, 3, 3), "b": torch.randn(6)}
    direction = filter_normalized_direction(params, torch.Generator().manual_seed(0))
    assert torch.equal(direction["b"], torch.zeros(6))  # biases are not perturbed (Li et al. 2018)
    assert torch.allclose(direction["w"].reshape(6, -1).norm(dim=1), params["w"].reshape(6, -1).norm(dim=1), rtol=1e-5)


def test_sharpness_and_robustness_behave(digits_job):
    job = digits_job(rounds=5)
    outcome = FedAvg().train(job)
    model = job.model_factory()
    x, y = job.pool_x[:200], job.pool_y[:200]
    result = sharpness(model, outcome.final_params, x, y, [1e-6, 0.1, 0.5], directions=4, seed=1)
    assert abs(result["mean_rise"][0]) < 1e-4
    assert result["mean_rise"][2] > result["mean_rise"][1] > 0 and result["max_rise"][2] >= result["mean_rise"][2]
    assert sharpness(model, outcome.final_params, x, y, [0.1], 4, 1) == sharpness(model, outcome.final_params, x, y, [0.1], 4, 1)
    robust = perturbation_robustness(model, outcome.final_params, job.test_x, job.test_y, [1e-7, 0.5], repeats=2, seed=1)
    assert robust["accuracy_drop"][0] == 0.0 and robust["accuracy_drop"][1] > 0.1
    untrained = parameters_of(job.model_factory())
    assert "base_loss" in sharpness(model, untrained, x, y, [0.1], 1, 0)
