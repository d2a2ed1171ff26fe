"""The conformance audit: every registered defense releases the noise its claim accounts for, in every
round of a short run, with the target at every participant position and participation sampled as
the defense samples it — and the check has power: a defense whose noise is short of its claim (in
one round, at one position, by a population-sized divisor, by a wider clip, by masking) is rejected
by the same code the CLI runs. Expected figures come from the sampling law and the mechanism, not
from the code under test."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from attacks.mechanism_audits.conformance import (
    CLIENT_RATE,
    CLIENTS,
    CONFORMS,
    NO_PROBE,
    NOT_APPLICABLE,
    ROUNDS,
    UNCHECKED,
    VIOLATES,
    audit_probe,
    conformance,
    probe_setup,
)
from attacks.mechanism_audits.conformance_statistics import (
    POOLED,
    epsilon_ceiling,
    measure,
    multiplier_interval,
    shortfall_test,
)
from audit.cli import main
from defenses.base import DEFENSES
from defenses.blocks.clipping import clip_rows
from defenses.catalog import DEFENSES as REGISTERED
from defenses.fed_smp import FedSMPParams, FedSMPRandK
from defenses.fedavg import DPFedAvg
from defenses.federated.release_probe import ReleaseProbe
from defenses.privacy.claims import AdversaryClaim

TRIALS = 240
#: trials of the broken variants' runs (one defense each: a family of 72 σ tests)
BROKEN_TRIALS = 400


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


class LastParticipantUnclipped(DPFedAvg):
    """Clips every update but the last participant's: in the rounds where the target comes last its
    effect on the sum is unbounded, the noise is not."""

    name = "last-participant-unclipped"

    def clip(self, updates):
        clipped, norms, was_clipped = super().clip(updates)
        clipped[-1] = updates[-1]
        return clipped, norms, was_clipped


class NoiseShrinksAfterFirstRound(DPFedAvg):
    """From the second round on, each upload carries ``factor`` (0.8) of the noise the claim accounts for."""

    name = "noise-shrinks-after-first-round"
    factor = 0.8

    def scaled(self, round_index: int) -> bool:
        return round_index >= 1

    def privatize(self, updates, ctx):
        uploads, diagnostics = super().privatize(updates, ctx)
        if not self.scaled(ctx.round):
            return uploads, diagnostics
        clipped = self.clip(updates)[0]
        return clipped + self.factor * (uploads - clipped), diagnostics


class NoiseCutInThirdRound(NoiseShrinksAfterFirstRound):
    """Half the noise in the third round only (a schedule bug late in the run)."""

    name = "noise-cut-in-third-round"
    factor = 0.5

    def scaled(self, round_index: int) -> bool:
        return round_index == 2


class PopulationScaledNoise(DPFedAvg):
    """Each upload carries N(0, (σC)²/N) for the population N instead of (σC)²/|P_t|: the sum's noise is
    σC·√(|P_t|/N), short of σC whenever not everyone takes part."""

    name = "population-scaled-noise"

    def privatize(self, updates, ctx):
        uploads, diagnostics = super().privatize(updates, ctx)
        clipped = self.clip(updates)[0]
        return clipped + math.sqrt(len(ctx.participants) / ctx.num_clients) * (uploads - clipped), diagnostics


class ClipsAtThreeTimesTheClaim(DPFedAvg):
    """Clips to 3C while its noise and claim are for C: every noise multiplier is a third of the claim's."""

    name = "clips-at-three-times-the-claim"

    def clip(self, updates):
        return clip_rows(updates, 3 * self.params.clip)


#: deliberately broken DP-FedAvg variants that keep DP-FedAvg's claim but release less noise
BROKEN = [LastParticipantUnclipped, NoiseShrinksAfterFirstRound, NoiseCutInThirdRound, PopulationScaledNoise,
          ClipsAtThreeTimesTheClaim]

#: the package's defenses (other tests register deliberately broken ones, named test-*)
SHIPPED = [name for name in REGISTERED.names() if not name.startswith("test-")]


# --------------------------------------------------------------------------- the sampling law, by hand


def _participants_moment(power: float, clients: int = CLIENTS, rate: float = CLIENT_RATE) -> float:
    """E[|P|^power] for |P| = 1 + Binomial(N − 1, q): a Poisson sample conditioned on the target taking part."""
    k = np.arange(clients)
    return float(np.sum(stats.binom.pmf(k, clients - 1, rate) * (1.0 + k) ** power))


def _last_share(clients: int = CLIENTS, rate: float = CLIENT_RATE) -> float:
    """P(the target comes last): the target is client i uniformly, and none of the N − 1 − i clients with
    larger ids is sampled (each with probability q)."""
    return float(np.mean([(1 - rate) ** (clients - 1 - i) for i in range(clients)]))


def _mixture_band(check: dict, weights: dict[str, float], sds: float = 5.0) -> None:
    """Each candidate's pooled σ̂² against E σ_t² for a scale mixture r_t ~ N(0, σ_t²): σ̂² is a mean of
    n values r_t² of mean E σ_t² and variance 3 E σ_t⁴ − (E σ_t²)²."""
    mean, fourth = weights["mean"], weights["fourth"]
    for candidate in check["candidates"]:
        pooled = candidate["scopes"][0]
        n = pooled["influential_trials"]
        sd = math.sqrt((3 * fourth - mean ** 2) / n)
        assert abs(pooled["noise_multiplier"] ** 2 - mean) < sds * sd, (candidate["input"], pooled, mean, sd)


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
            assert not check["failed_tests"], (name, check)
            if check["claimed_noise_multiplier"] is not None:  # a Gaussian claim: the measured σ_eff covers it
                assert check["within_interval"] or check["interval"][0] > check["claimed_noise_multiplier"], (name, check)
    assert everything["status"] == CONFORMS
    # every round of the run was probed: each Gaussian check of a run-based probe has a scope per round
    fedavg = by_name["dp-fedavg"]
    assert fedavg["probed"] == everything["participation"]
    for check in fedavg["adversaries"]:
        for candidate in check["candidates"]:
            assert [s["scope"] for s in candidate["scopes"]] == [POOLED] + [f"round {r + 1}" for r in range(ROUNDS)]
            assert sum(s["influential_trials"] for s in candidate["scopes"][1:]) == candidate["influential_trials"] == TRIALS
    # DP-FedAvg's released aggregate carries σC on the clipped sum whatever |P_t|: σ_t = σ = 1 in every trial
    released = next(c for c in fedavg["adversaries"] if c["adversary"] == "released")
    _mixture_band(released, {"mean": 1.0, "fourth": 1.0})
    # the server without secure aggregation sees one upload, σC/√|P_t|: the claim bounds |P_t| by the
    # population (Poisson), σ/√N; the trials measure the mixture E[1/|P|] with the target taking part
    server = next(c for c in fedavg["adversaries"] if c["adversary"] == "server")
    assert server["claimed_noise_multiplier"] == pytest.approx(1 / math.sqrt(CLIENTS))
    assert server["interval"][0] > server["claimed_noise_multiplier"]  # conservative, as the law says
    _mixture_band(server, {"mean": _participants_moment(-1), "fourth": _participants_moment(-2)})
    # DDGauss analyses exactly m clients a round: probed with fixed-size sampling at the same rate
    assert "fixed-size sampling, 6 of 12" in by_name["ddgauss"]["probed"]


def test_the_family_counts_only_tests_that_run(everything):
    """K = the σ tests (χ² interval, KS and the shape test, per candidate, per round and pooled; the
    fresh-noise, participation and coin tests once per observer) + the ε tests that can fire; an ε test is
    run exactly where its ceiling exceeds the one-round ε, and the level is 1 − α/K."""
    sigma = epsilon = 0
    for entry in everything["defenses"]:
        for check in entry["adversaries"]:
            candidates = len(check["candidates"])
            scopes = len(check["candidates"][0]["scopes"]) if candidates else 0
            gaussian = check["claimed_noise_multiplier"] is not None
            # the fresh-noise test where rounds are several; the participation test where q < 1 is accounted
            fresh = gaussian and scopes > 1
            participation = check["participation"] is not None
            assert not participation or check["participation"]["accounted_rate"] < 1
            # the coin test of a per-weight claim (replace-one, a one-round ε), once per observer
            coin = check["coin_test"] is not None
            assert coin == (entry["defense"] == "ldp-fl")
            assert check["sigma_tests"] == candidates * 3 * scopes * gaussian + fresh + participation + coin
            sigma += check["sigma_tests"]
            test = check["epsilon_test"]
            assert test["ceiling"] == pytest.approx(everything["epsilon_ceiling"])
            if check["claimed_round_epsilon"] is None:
                assert not test["run"]
            elif test["run"]:
                assert test["ceiling"] > check["claimed_round_epsilon"]
                epsilon += candidates
            else:  # could never fire: not run, not counted, and said so
                assert test["ceiling"] <= check["claimed_round_epsilon"] and "why_not" in test
                assert check["epsilon_lower_bound"] is None and "ε test not run" in check["detail"]
    assert (everything["sigma_tests"], everything["epsilon_tests"]) == (sigma, epsilon)
    assert everything["family_size"] == sigma + epsilon
    assert everything["level"] == pytest.approx(1 - everything["alpha"] / (sigma + epsilon))
    # at these trials no Gaussian round of DP-FedAvg (one-round ε 4.73 and more) can be shown, pure ε-LDP (1) can
    by_name = {entry["defense"]: entry for entry in everything["defenses"]}
    assert not any(c["epsilon_test"]["run"] for c in by_name["dp-fedavg"]["adversaries"])
    assert all(c["epsilon_test"]["run"] for c in by_name["ldp-fl"]["adversaries"])


def test_epsilon_ceiling_is_the_perfect_count_bound():
    """All held-out counts perfect (n₊ = n₋ = n/4 positives and negatives): the one-sided Clopper–Pearson
    bounds at level a = (1 − level)/2 are TPR ≥ a^(1/n₊) and FPR ≤ 1 − a^(1/n₋), so
    ε_max = log((a^(1/n₊) − δ)/(1 − a^(1/n₋))): about 3.4 at 1,000 trials and 99.93 %, below the 4.73 of
    one Gaussian round of σ = 1 — the test cannot fire there."""
    for trials, level, delta in ((1000, 1 - 0.05 / 72, 1e-5), (240, 0.99, 1e-5), (4000, 0.999, 1e-5)):
        a, n = (1 - level) / 2, trials // 4
        expected = math.log((a ** (1 / n) - delta) / (1 - a ** (1 / n)))
        assert epsilon_ceiling(trials, level, delta) == pytest.approx(expected, rel=1e-9)
    assert epsilon_ceiling(1000, 1 - 0.05 / 72, 1e-5) < 4.73


def test_engine_probe_draws_as_the_sampler():
    """A trial's participants follow the engine's Poisson sampler conditioned on the target: |P| − 1 is
    Binomial(N − 1, q), the target takes every position (last with the probability the law gives), and
    the rounds of the run are distinct contexts; fixed-size sampling gives exactly m with the target."""
    setup = probe_setup(0, 1e-5, CLIENTS, CLIENT_RATE, ROUNDS)
    probe = DPFedAvg().audit_hooks().release_probe(setup.job)
    assert probe.rounds == ROUNDS and probe.contributors == CLIENTS
    draws = [probe.trial(1000 + t, t % ROUNDS) for t in range(4000)]
    sizes = np.array([len(d.participants) for d in draws])
    assert all(d.participants[d.target] in d.participants and d.round == t % ROUNDS for t, d in enumerate(draws))
    assert abs(sizes.mean() - _participants_moment(1)) < 5 * math.sqrt((CLIENTS - 1) * CLIENT_RATE * (1 - CLIENT_RATE) / 4000)
    last = np.mean([d.target == len(d.participants) - 1 for d in draws])
    share = _last_share()
    assert abs(last - share) < 5 * math.sqrt(share * (1 - share) / 4000)
    positions = {d.target for d in draws}
    assert set(range(9)) <= positions  # first, last and in between (all twelve take part once in 2,048 draws)
    assert all(np.array_equal(probe.trial(s, 1).participants, probe.trial(s, 1).participants) for s in range(20))
    assert len({tuple(probe.trial(s, 1).participants) for s in range(20)}) > 10  # the seed draws the sample
    fixed = probe_setup(0, 1e-5, CLIENTS, CLIENT_RATE, ROUNDS)
    fixed.job.training = dataclasses.replace(fixed.training, sampling="fixed")
    fixed_probe = DPFedAvg().audit_hooks().release_probe(fixed.job)
    draws = [fixed_probe.trial(t, 0) for t in range(500)]
    assert {len(d.participants) for d in draws} == {round(CLIENT_RATE * CLIENTS)}
    assert {int(d.participants[d.target]) for d in draws} == set(range(CLIENTS))


@pytest.mark.parametrize("broken", BROKEN + [MaskedNoiseClaimingSigma, UnclippedClaimingSigma])
def test_a_defense_short_of_its_claim_is_rejected(broken, capsys):
    """Through the command (a defense given as module:callable goes through the same code): exit 1, the
    released aggregate violates, and what was measured is what the mechanism gives."""
    reference = f"tests.attacks.mechanism_audits.test_conformance:{broken.__name__}"
    params = ["--param", "noise_support=kept", "--param", "keep_fraction=0.25"] if broken is MaskedNoiseClaimingSigma else []
    assert main(["conformance", reference, *params, "--trials", str(BROKEN_TRIALS), "--quiet", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    entry = document["defenses"][0]
    assert document["status"] == entry["status"] == VIOLATES
    checks = {c["adversary"]: c for c in entry["adversaries"]}
    released = checks["released"]
    assert released["status"] == VIOLATES and released["failed_tests"]
    assert released["claimed_noise_multiplier"] == 1.0
    scopes = {(c["input"], s["scope"]): s for c in released["candidates"] for s in c["scopes"]}
    if broken is LastParticipantUnclipped:
        # a share P(last) of the trials has r_t ≈ 0 (effect 1000·C against noise σC): the half-normal's
        # CDF is exceeded by about that share just above 0
        share = _last_share()
        pooled = [s for (_, scope), s in scopes.items() if scope == POOLED]
        assert all(abs(s["ks_statistic"] - share) < 5 * math.sqrt(share * (1 - share) / s["influential_trials"]) + 0.02
                   for s in pooled)
        assert any(f["test"] == "shortfall" for f in released["failed_tests"])
        assert checks["local"]["status"] == VIOLATES  # the target's own upload, unclipped when it comes last
    elif broken in (NoiseShrinksAfterFirstRound, NoiseCutInThirdRound):
        # each round's interval covers that round's σ (at the family's level), and only scaled rounds reject
        for (name, scope), s in scopes.items():
            if scope != POOLED:
                truth = broken.factor if broken().scaled(int(scope.split()[1]) - 1) else 1.0
                assert s["interval"][0] <= truth <= s["interval"][1], (name, scope, s)
        rejected = {f["scope"] for f in released["failed_tests"]}
        assert rejected <= {POOLED} | {f"round {r + 1}" for r in range(ROUNDS) if broken().scaled(r)}
        if broken is NoiseCutInThirdRound:
            assert f"round {ROUNDS}" in rejected
    elif broken is PopulationScaledNoise:
        # the sum's noise is σ√(|P|/N): σ_t² = |P|/N, a mixture of mean E|P|/N
        _mixture_band(released, {"mean": _participants_moment(1) / CLIENTS, "fourth": _participants_moment(2) / CLIENTS ** 2})
        # one upload carries σ/√N: exactly the (worst-case) claim, so the local observer conforms
        local = checks["local"]
        assert local["status"] == CONFORMS and local["within_interval"]
    elif broken is ClipsAtThreeTimesTheClaim:
        # every change is 3C against σC of noise: σ_t = 1/3 for the sum, 1/(3√|P|) for one upload
        _mixture_band(released, {"mean": 1 / 9, "fourth": 1 / 81})
        _mixture_band(checks["local"], {"mean": _participants_moment(-1) / 9, "fourth": _participants_moment(-2) / 81})
        assert checks["local"]["status"] == VIOLATES
    else:
        assert released["interval"][1] < released["claimed_noise_multiplier"]


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


def test_the_sigma_tests_stay_valid_under_random_participation():
    """The null is σ_t ≥ σ in every trial. At the boundary (σ_t = σ, the released aggregate) the KS test
    rejects at its level and the interval lies below σ at half of it (one side of a two-sided interval);
    for one upload of |P_t| = 1 + Binomial(N − 1, q) clients, σ_t = σ/√|P_t| against the claim σ/√N, both
    reject less often. A 30 % share of trials with a tenth of the noise is caught by KS far more often than
    by the interval."""
    rng = np.random.default_rng(1)
    level, n, replicates = 0.9, 300, 2000
    alpha = 1 - level
    se = math.sqrt(alpha * (1 - alpha) / replicates)

    def rejections(draw, claimed):
        below = short = 0
        for _ in range(replicates):
            ratios = draw()
            below += multiplier_interval(ratios, level)[1][1] < claimed
            short += shortfall_test(ratios, claimed)[1] < alpha
        return below / replicates, short / replicates

    below, short = rejections(lambda: rng.normal(0, 1.0, n), 1.0)
    assert abs(below - alpha / 2) < 4 * se and abs(short - alpha) < 4 * se
    mixture = lambda: rng.normal(0, 1.0, n) / np.sqrt(1 + rng.binomial(CLIENTS - 1, CLIENT_RATE, n))  # noqa: E731
    below, short = rejections(mixture, 1 / math.sqrt(CLIENTS))
    assert below < alpha / 2 and short < alpha
    share = lambda: rng.normal(0, 1.0, n) * np.where(rng.random(n) < 0.3, 0.1, 1.0)  # noqa: E731
    below, short = rejections(share, 1.0)
    assert short > 0.99 and short > below


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
        result = measure(zero, moved, 0.95, 1e-5)
        interval = result.pooled.interval
        covered += interval[0] <= sigma <= interval[1] if interval else 0
        bounds.append(result.epsilon_lower_bound)
    assert covered >= 89
    assert max(bounds) < 0.5  # one-round ε of μ = 0.5 GDP at δ = 1e-5 is ≈ 2.1; the bound stays far below


def test_audit_probe_power_and_null():
    """Through audit_probe: a round with the noise its claim says conforms; one with 30 % of it on the
    target's coordinate is rejected. The check is a family of seven tests (two candidate inputs × the χ²
    interval, the KS test and the shape test, and the ε test; one round: no fresh-noise test, no
    sampling: no participation test), each at 1 − 0.01/7."""
    level = 1 - 0.01 / 7
    claim = AdversaryClaim("released", 1.0, 1e-5, "zero-out", "synthetic", noise_multiplier=2.0, round_epsilon=2.2)
    honest = audit_probe(_gaussian_probe(2.0), [claim], 300, 0, level, 1e-5)[0]
    short = audit_probe(_gaussian_probe(2.0, masked=0.3), [claim], 300, 0, level, 1e-5)[0]
    assert honest.status == CONFORMS and short.status == VIOLATES
    assert honest.sigma_tests == 6 and len(honest.candidates) == 2
    assert honest.epsilon_test and honest.epsilon_ceiling > 2.2  # 300 trials at this level can show ε_LB up to 2.29


# --------------------------------------------------------------------------- the command


def test_cli_json_and_exit_codes(capsys):
    assert main(["conformance", "dp-fedavg", "--trials", "150", "--quiet", "--json"]) == 0
    first = capsys.readouterr().out
    document = json.loads(first)
    assert document["defenses"][0]["defense"] == "dp-fedavg" and document["status"] == CONFORMS
    assert main(["conformance", "dp-fedavg", "--trials", "150", "--quiet", "--json"]) == 0
    assert capsys.readouterr().out == first  # same seed, same document
    # a violation exits 1 and says so
    assert main(["conformance", "tests.attacks.mechanism_audits.test_conformance:MaskedNoiseClaimingSigma",
                 "--param", "noise_support=kept", "--param", "keep_fraction=0.25", "--trials", "150", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATES" in out and "ε tests" in out


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
