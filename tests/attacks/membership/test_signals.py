"""The black-box signals against their definitions, including where float64 log-softmax saturates."""

from __future__ import annotations

import math

import numpy as np
import torch

from attacks.signals import logit_scaled_confidence, loss


def test_loss_is_the_cross_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(50, 10))
    labels = rng.integers(0, 10, size=50)
    expected = torch.nn.functional.cross_entropy(torch.as_tensor(logits), torch.as_tensor(labels), reduction="none")
    np.testing.assert_allclose(loss(logits, labels), expected.numpy(), rtol=1e-12)


def test_loss_keeps_confident_records_apart():
    """Logits (a, 0, 0) with label 0: p_y = 1/(1 + 2e^{−a}), so −log p_y = log(1 + 2e^{−a}) ≈ 2e^{−a},
    which float64 log-softmax rounds to 0 for a ≳ 37 — every such record would tie."""
    leads = np.array([40.0, 50.0, 60.0])
    logits = np.stack([leads, np.zeros(3), np.zeros(3)], axis=1)
    labels = np.zeros(3, dtype=np.int64)
    expected = [math.log1p(2 * math.exp(-a)) for a in leads]
    np.testing.assert_allclose(loss(logits, labels), expected, rtol=1e-12)
    assert (np.diff(loss(logits, labels)) < 0).all()
    np.testing.assert_allclose(logit_scaled_confidence(logits, labels), leads - math.log(2), rtol=1e-12)
