"""The conformance audit speaks loudest where a defense is most broken: a release without noise for
some clients or for all, non-finite noise, fewer uploads than participants, a step of the wrong
length, or code that raises — each ends in a verdict with its reason, or in one line naming the
defense and what it did (exit 2), never in an internal error.

The broken defenses are written as a user would write them: a DP-FedAvg subclass whose ``privatize``
clips and noises plain tensors, keeping DP-FedAvg's claim.
"""

from __future__ import annotations

import json

import pytest
import torch

from attacks.mechanism_audits.conformance import VIOLATES, conformance
from audit.cli import main
from defenses.blocks.clipping import clip_rows
from defenses.fedavg import DPFedAvg

TRIALS = 200
MODULE = "tests.attacks.mechanism_audits.test_conformance_broken"


class _UserDPFedAvg(DPFedAvg):
    """DP-FedAvg as a user rewrites it: clip, then noise of std σS/√n per upload, in plain tensor code;
    :meth:`noise` is where each broken variant differs."""

    def noise(self, shape, ctx, std: float) -> torch.Tensor:
        generator = ctx.server_generator("user-noise")
        return torch.randn(shape, generator=generator, dtype=torch.float64) * std

    def privatize(self, updates, ctx):
        if not isinstance(updates, torch.Tensor):
            return super().privatize(updates, ctx)
        clipped, norms, _ = clip_rows(updates, self.params.clip)
        std = self.params.clip * self.params.noise_multiplier / len(updates) ** 0.5
        return clipped + self.noise(updates.shape, ctx, std).to(updates), {"clip_input_norms": norms}


class NoNoiseForEvenClients(_UserDPFedAvg):
    """The bug the audit once crashed on: clients with an even id add no noise."""

    name = "test-no-noise-for-even-clients"

    def noise(self, shape, ctx, std):
        noise = super().noise(shape, ctx, std)
        noise[torch.as_tensor(ctx.participants % 2 == 0)] = 0.0
        return noise


class NoNoise(_UserDPFedAvg):
    name = "test-no-noise"

    def noise(self, shape, ctx, std):
        return torch.zeros(shape, dtype=torch.float64)


class NaNNoise(_UserDPFedAvg):
    """A noise computed as 0/0 (e.g. a std from an empty batch)."""

    name = "test-nan-noise"

    def noise(self, shape, ctx, std):
        return super().noise(shape, ctx, std) * float("nan")


class InfiniteNoise(_UserDPFedAvg):
    name = "test-infinite-noise"

    def noise(self, shape, ctx, std):
        return super().noise(shape, ctx, std) / 0.0


class DropsTheLastUpload(_UserDPFedAvg):
    """An off-by-one: the last participant's upload never leaves."""

    name = "test-drops-the-last-upload"

    def privatize(self, updates, ctx):
        uploads, diagnostics = super().privatize(updates, ctx)
        return uploads[:-1], diagnostics

    def aggregate(self, uploads, ctx):
        return uploads.sum(0) / len(uploads)


class ShortStep(_UserDPFedAvg):
    """The aggregate loses the model's last parameter."""

    name = "test-short-step"

    def aggregate(self, uploads, ctx):
        return super().aggregate(uploads, ctx)[:-1]


class NegativeStd(_UserDPFedAvg):
    """A sign error in the std: torch refuses to draw."""

    name = "test-negative-std"

    def noise(self, shape, ctx, std):
        return torch.normal(0.0, -std, size=shape, generator=ctx.server_generator("user-noise"), dtype=torch.float64)


class RaisesInPrepare(DPFedAvg):
    name = "test-raises-in-prepare"

    def prepare(self, job, model=None, initial=None):
        raise ValueError("the public batch is missing")


@pytest.mark.parametrize("broken, reason", [
    (NoNoiseForEvenClients, "below the accounted σ"),
    (NoNoise, "below the accounted σ"),
    (NaNNoise, "non-finite values"),
    (InfiniteNoise, "non-finite values"),
    (DropsTheLastUpload, "uploads for"),
    (ShortStep, "aggregate returned a step of"),
])
def test_a_broken_release_is_a_violation_with_its_reason(broken, reason):
    """Each observer the claim covers violates, and the reason says what the code did."""
    result = conformance([broken()], trials=TRIALS)
    entry = result["defenses"][0]
    assert result["status"] == entry["status"] == VIOLATES
    assert entry["adversaries"] and all(c["status"] == VIOLATES for c in entry["adversaries"])
    assert any(reason in c["detail"] for c in entry["adversaries"]), [c["detail"] for c in entry["adversaries"]]


def test_no_noise_for_even_clients_violates_where_each_upload_is_seen():
    """The server and one-upload observers see the even clients' bare updates: σ_eff 0 there."""
    entry = conformance([NoNoiseForEvenClients()], trials=TRIALS)["defenses"][0]
    checks = {c["adversary"]: c for c in entry["adversaries"]}
    assert checks["local"]["status"] == checks["server"]["status"] == VIOLATES
    assert any(f["test"] == "shortfall" for f in checks["local"]["failed_tests"])


@pytest.mark.parametrize("broken", [NoNoise, NaNNoise, DropsTheLastUpload])
def test_the_command_gives_the_verdict_and_exit_1(broken, capsys):
    """Through the command, as a user names a plugin: a verdict, exit 1, no traceback."""
    assert main(["conformance", f"{MODULE}:{broken.__name__}", "--trials", str(TRIALS), "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "VIOLATES" in out and "overall: violates" in out
    assert "Traceback" not in out + err and "internal error" not in out + err


@pytest.mark.parametrize("broken, what", [
    (NegativeStd, "raised RuntimeError in its release probe (a short run of its rounds): normal expects std >= 0"),
    (RaisesInPrepare, "raised ValueError in its release probe (a short run of its rounds): the public batch is missing"),
])
def test_a_defense_whose_code_raises_is_one_line_exit_2(broken, what, capsys):
    assert main(["conformance", f"{MODULE}:{broken.__name__}", "--trials", str(TRIALS), "--quiet", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"dpfl-audit: error: conformance: defense '{broken.name}' {what}")
    assert "internal error" not in err and "Traceback" not in err


def test_an_honest_user_rewrite_conforms():
    """The same plain-tensor rewrite without a bug: not a false alarm."""

    class Honest(_UserDPFedAvg):
        name = "test-honest-user-rewrite"

    result = conformance([Honest()], trials=TRIALS)
    assert result["status"] == "conforms", json.dumps(result["defenses"][0]["adversaries"], indent=1)[:2000]


@pytest.mark.parametrize("broken, test, trials", [
    ("UserHalvedNoise", "interval", TRIALS),
    ("UserNoiseCancelledInPairs", "interval", TRIALS),
    ("UserNoiseReusedEveryRound", "fresh", TRIALS),
    ("UserUniformNoise", "shape", 400),
    ("ClaimsSamplingItDoesNotDo", "participation", TRIALS),
])
def test_bug_classes_beyond_the_noise_level_violate(broken, test, trials):
    """Bugs written as a user writes them, each caught by the test built for its class: noise
    short of the claim (interval), noise reused every round (the fresh-noise test), uniform noise
    of the claimed variance (the shape test: uniform's excess kurtosis is −1.2, a Gaussian's 0) and
    amplification by a sampling the rounds never do (the participation test)."""
    from tests.defenses import broken_dp_fedavg

    entry = conformance([getattr(broken_dp_fedavg, broken)()], trials=trials)["defenses"][0]
    assert entry["status"] == VIOLATES, json.dumps(entry["adversaries"], indent=1)[:3000]
    failed = {f["test"] for c in entry["adversaries"] for f in c["failed_tests"]}
    assert test in failed, failed


def test_the_honest_user_rewrite_passes_the_new_tests():
    """The fixture module's honest rewrite: fresh noise, Gaussian tails, participation as accounted."""
    from tests.defenses.broken_dp_fedavg import UserWrittenHonest

    entry = conformance([UserWrittenHonest()], trials=400)["defenses"][0]
    assert entry["status"] == "conforms", json.dumps(entry["adversaries"], indent=1)[:3000]
    for check in entry["adversaries"]:
        assert check["fresh_noise_p_value"] is not None and check["participation"]["p_value"] > 0


@pytest.mark.parametrize("broken", ["UserLDPFLBiasedCoin", "UserLDPFLValueTrace"])
def test_a_per_weight_ldp_report_beyond_its_epsilon_violates_at_the_local_observer(broken):
    """LDP-FL's per-weight ε-LDP claim (Sun, Qian, Chen 2021, Thm 1) against a user's rewrite of
    its report: a coin drawn at 2ε (likelihood ratio e^{2ε} between a weight's range ends), or a
    report that keeps a trace of the value (no finite ε) — the one-weight neighbours' reports
    give an ε lower bound above the claim for the observer of one client's report."""
    from tests.defenses import broken_ldp_fl

    entry = conformance([getattr(broken_ldp_fl, broken)()], trials=TRIALS)["defenses"][0]
    checks = {c["adversary"]: c for c in entry["adversaries"]}
    assert checks["local"]["status"] == VIOLATES, json.dumps(checks["local"], indent=1)[:3000]
    assert checks["local"]["epsilon_lower_bound"] > 1.0


def test_an_honest_ldp_rewrite_conforms():
    from tests.defenses.broken_ldp_fl import UserLDPFLWrittenHonest

    entry = conformance([UserLDPFLWrittenHonest()], trials=TRIALS)["defenses"][0]
    assert entry["status"] == "conforms", json.dumps(entry["adversaries"], indent=1)[:3000]


def test_the_coin_test_makes_the_per_weight_bound_tight_and_catches_twice_epsilon():
    """LDP-FL at ε = 4: about 10⁵ coins (every coordinate of each trial's target row) certify at
    least 0.9·ε for one client's report;
    the coin drawn at 2ε is a VIOLATION by the coin bound, above the claimed 4."""
    from defenses.ldp_fl import LDPFL, LDPFLParams
    from tests.defenses.broken_ldp_fl import UserLDPFLBiasedCoin

    for defense, honest in ((LDPFL(LDPFLParams(epsilon=4.0)), True), (UserLDPFLBiasedCoin(LDPFLParams(epsilon=4.0)), False)):
        local = next(c for c in conformance([defense], trials=TRIALS)["defenses"][0]["adversaries"] if c["adversary"] == "local")
        coin = local["coin_test"]
        assert coin["influential_trials"] >= 100_000
        if honest:
            assert local["status"] == "conforms" and 3.6 <= coin["epsilon_lower_bound"] <= 4.0, local
        else:
            assert local["status"] == VIOLATES and coin["epsilon_lower_bound"] > 6.0, local
