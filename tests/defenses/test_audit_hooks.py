"""What the audits need of a defense comes from one adapter per defense (defenses.audit_hooks), and
how a client's noise reaches its coordinates is one value (defenses.fedavg.NoiseSupport)."""

from __future__ import annotations

import pytest
import torch

import defenses.catalog  # noqa: F401 - registers every defense
from defenses.audit_hooks import AuditHooks
from defenses.base import DEFENSES, Defense
from defenses.fed_smp import FedSMPParams, FedSMPTopK
from defenses.fedavg import DPFedAvg, NoiseSupport
from defenses.federated.training_job import TrainingConfig


@pytest.mark.parametrize("name", DEFENSES.names())
def test_every_defense_gives_the_audits_an_adapter_bound_to_itself(name):
    defense = DEFENSES.get(name)()
    hooks = defense.audit_hooks()
    assert isinstance(hooks, AuditHooks) and hooks.defense is defense


class _OneShot(Defense):
    name = "one-shot"
    private = True

    def train(self, job, progress=None):
        raise NotImplementedError


def test_a_defense_that_trains_otherwise_has_no_default_probe():
    assert _OneShot().audit_hooks().release_probe(job=None) is None


def test_canaries_carry_the_clip_where_updates_are_clipped_and_the_median_norm_elsewhere():
    honest = torch.tensor([3.0, 1.0, 2.0])
    assert DPFedAvg(DPFedAvg.Params(clip=0.7)).audit_hooks().canary_norm(honest) == pytest.approx(0.7)
    assert AuditHooks(DPFedAvg(DPFedAvg.Params(clip=0.7))).canary_norm(honest) == 2.0  # clips_updates not stated


def test_a_support_leak_is_a_case_of_noise_on_the_kept_coordinates_only():
    with pytest.raises(ValueError):
        NoiseSupport(kept_only=False, leak="a data-dependent support")
    dense, leaky = FedSMPTopK(), FedSMPTopK(FedSMPParams(noise_support="kept"))
    assert dense.noise_support() == NoiseSupport()
    assert leaky.noise_support().kept_only and leaky.noise_support().leak


def test_dirac_rows_go_through_the_papers_client_level_defenses_under_either_sampling():
    """DP-FedAvg's family and the FL-TOP family's DP variants take Dirac rows (Poisson or fixed-size
    sampling), and NbAFL (model canaries on its origin −w_0); the default adapter, FL-CS and DDGauss
    refuse them, each with a reason."""
    from defenses.catalog import DEFENSES

    for sampling in ("poisson", "fixed"):
        training = TrainingConfig(sampling=sampling)
        taken = {name for name in ("dp-fedavg", "dp-fedavg-lus", "dp-fedavg-blur-lus", "fed-smp-randk", "fed-smp-topk",
                                   "dp-fedsam-topk", "fl-basic-dp", "fl-std-dp", "fl-top-dp", "nbafl")
                 if DEFENSES.get(name)().audit_hooks().dirac_canaries_refused(training) is None}
        assert len(taken) == 10, taken
        for name in ("fl-cs-dp", "ddgauss"):
            assert DEFENSES.get(name)().audit_hooks().dirac_canaries_refused(training), name
    assert AuditHooks(DPFedAvg()).dirac_canaries_refused(TrainingConfig(sampling="poisson")) is not None
