"""The conformance audit (issue 14, item 2): every registered defense releases the noise its claim
accounts for, and the check has power — a defense whose noise is short of its claim is rejected by
the same code the CLI runs."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from attacks.conformance import (
    CONFORMS,
    NO_PROBE,
    NOT_APPLICABLE,
    UNCHECKED,
    VIOLATES,
    audit_probe,
    conformance,
    measure,
    multiplier_interval,
)
from audit.cli import main
from defenses.base import DEFENSES
from defenses.catalog import DEFENSES as REGISTERED
from defenses.claims import AdversaryClaim
from defenses.fed_smp import FedSMPParams, FedSMPRandK
from defenses.fedavg import DPFedAvg
from defenses.release_probe import ReleaseProbe

TRIALS = 240


class MaskedNoiseClaimingSigma(FedSMPRandK):
    """The masked noise main had (noise on kept coordinates only) with the claim main made (σ on the sum)."""

    name = "masked-noise-claiming-sigma"

    def __init__(self, params=None, layout=None):
        super().__init__(params or FedSMPParams(keep_fraction=0.25, noise_support="kept"), layout)

    def noise_reach(self, training, num_clients, rounds=None):
        reach = DPFedAvg.noise_reach(self, training, num_clients, rounds)
        return dataclasses.replace(reach, aggregate=self.effective_noise_multiplier(), why_not="")


class UnclippedClaimingSigma(DPFedAvg):
    """Forgets to clip: an update's effect on the sum is unbounded, the noise is not."""

    name = "unclipped-claiming-sigma"

    def clip(self, updates):
        norms = torch.linalg.vector_norm(updates, dim=1, dtype=torch.float64)
        return updates, norms, torch.zeros(len(updates), dtype=torch.bool)


#: the package's defenses (other tests register deliberately broken ones, named test-*)
SHIPPED = [name for name in REGISTERED.names() if not name.startswith("test-")]


@pytest.fixture(scope="module")
def everything():
    return conformance([DEFENSES.get(name)() for name in SHIPPED], trials=TRIALS, seed=0)


def test_every_registered_defense_conforms(everything):
    by_name = {entry["defense"]: entry for entry in everything["defenses"]}
    assert set(by_name) == set(SHIPPED) and "dp-fedavg" in by_name
    for name, entry in by_name.items():
        private = REGISTERED.get(name).private
        assert entry["status"] not in (NO_PROBE, UNCHECKED), f"{name}: a private defense must be checkable"
        assert entry["status"] == (CONFORMS if private else NOT_APPLICABLE), f"{name}: {entry}"
        for check in entry["adversaries"]:
            if check["claimed_noise_multiplier"] is not None:  # a Gaussian claim: the measured σ_eff covers it
                assert check["within_interval"] or check["interval"][0] > check["claimed_noise_multiplier"], (name, check)
    # the server of DP-FedAvg without secure aggregation sees one upload: σ/√m, and it was measured so
    server = next(c for c in by_name["dp-fedavg"]["adversaries"] if c["adversary"] == "server")
    assert server["claimed_noise_multiplier"] == pytest.approx(1 / math.sqrt(8))
    assert everything["status"] == CONFORMS


@pytest.mark.parametrize("broken", [MaskedNoiseClaimingSigma, UnclippedClaimingSigma])
def test_a_defense_short_of_its_claim_is_rejected(broken):
    result = conformance([broken()], trials=TRIALS, seed=0)
    entry = result["defenses"][0]
    assert result["status"] == entry["status"] == VIOLATES
    released = next(c for c in entry["adversaries"] if c["adversary"] == "released")
    assert released["status"] == VIOLATES and released["interval"][1] < released["claimed_noise_multiplier"]


def test_the_paper_variant_conforms_with_its_honest_claim():
    """The same masked noise, accounted with the σ/√m a coordinate kept by one client carries, conforms."""
    entry = conformance([FedSMPRandK(FedSMPParams(keep_fraction=0.25, noise_support="kept"))], trials=TRIALS)["defenses"][0]
    assert entry["status"] == CONFORMS


# --------------------------------------------------------------------------- the statistics, by simulation


def test_multiplier_interval_covers_at_its_level():
    """n·σ̂²/σ² ~ χ²_n: over 4,000 replicates the 90 % interval covers σ in 90 ± 1.5 % of them."""
    rng = np.random.default_rng(0)
    sigma, n = 1.7, 60
    covered = sum(low <= sigma <= high for low, high in
                  (multiplier_interval(rng.normal(0, sigma, n), 0.90)[1] for _ in range(4000)))
    assert abs(covered / 4000 - 0.90) < 0.015


def _gaussian_probe(sigma: float, clip: float = 1.0, dim: int = 6, masked: float = 1.0) -> ReleaseProbe:
    """A synthetic round of known noise: the clipped target row plus N(0, (σ·clip)²) per coordinate, except
    on coordinates where ``masked`` scales the noise down (a known defect)."""
    def views(contributions: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
        row = contributions[0].double()
        row = row * min(1.0, clip / max(float(row.norm()), 1e-300))
        noise = torch.as_tensor(np.random.default_rng(seed).normal(0.0, sigma * clip, dim))
        noise[0] *= masked
        return {"released": row + noise}

    class Stub:
        name = "synthetic"

    return ReleaseProbe(dim, 3, clip, views, "synthetic", Stub())  # type: ignore[arg-type]


def test_measure_on_a_known_gaussian_round():
    """A round of known σ: the interval covers it in most of 100 replicates (a 95 % interval: 95 ± 6 %),
    and the ε lower bound never exceeds the exact one-round ε (μ = 1/σ)."""
    sigma, trials = 2.0, 120
    covered, bounds = 0, []
    for replicate in range(100):
        rng = np.random.default_rng(replicate)
        zero = rng.normal(0, sigma, (trials, 4))
        moved = zero + np.array([1.0, 0, 0, 0])  # coupled: the same noise plus the target's unit effect
        count, multiplier, interval, bound = measure(zero, moved, 0.95, 1e-5)
        covered += interval[0] <= sigma <= interval[1] if interval else 0
        bounds.append(bound)
    assert covered >= 89
    assert max(bounds) < 0.5  # one-round ε of μ = 0.5 GDP at δ = 1e-5 is ≈ 2.1; the bound stays far below


def test_audit_probe_power_and_null():
    """Through audit_probe: a round with the noise its claim says conforms; one with 30 % of it on the
    target's coordinate is rejected."""
    claim = AdversaryClaim("released", 1.0, 1e-5, "zero-out", "synthetic", noise_multiplier=2.0, round_epsilon=2.3)
    honest = audit_probe(_gaussian_probe(2.0), [claim], 300, 0, 0.99, 1e-5)[0]
    short = audit_probe(_gaussian_probe(2.0, masked=0.3), [claim], 300, 0, 0.99, 1e-5)[0]
    assert honest.status == CONFORMS and short.status == VIOLATES


# --------------------------------------------------------------------------- the command


def test_cli_json_and_exit_codes(capsys):
    assert main(["conformance", "dp-fedavg", "--trials", "150", "--quiet", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["defenses"][0]["defense"] == "dp-fedavg" and document["status"] == CONFORMS
    # a defense given as module:callable goes through the same code, and a violation exits 1
    assert main(["conformance", "tests.attacks.test_conformance:MaskedNoiseClaimingSigma", "--param", "noise_support=kept",
                 "--param", "keep_fraction=0.25", "--trials", "150", "--quiet"]) == 1
    assert "VIOLATES" in capsys.readouterr().out


@pytest.mark.parametrize("argv,field", [
    (["conformance", "no-such-defense"], "unknown defense"),
    (["conformance"], "name at least one defense"),
    (["conformance", "dp-fedavg", "--param", "keep_fraction=0.5"], "keep_fraction: unknown field"),
    (["conformance", "dp-fedavg", "--param", "clip=-1"], "clip: must be > 0"),
    (["conformance", "dp-fedavg", "--param", "clip"], "--param"),
    (["conformance", "dp-fedavg", "--trials", "5"], "--trials"),
    (["conformance", "--all", "dp-fedavg"], "not both"),
    (["conformance", "dp-fedavg", "--param", "fed-smp-randk.keep_fraction=0.5"], "names a defense not checked"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, field, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and field in captured.err and len(captured.err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
