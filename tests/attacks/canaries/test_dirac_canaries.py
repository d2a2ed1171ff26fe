"""Dirac canary clients end to end: ``dpfl-audit run`` on a small design must find a DP-FedAvg
whose noise is secretly halved — in a ``privatize`` rewritten with plain tensors, as a user
writes it — in VIOLATION of the claim it keeps, and must not find one in the honest DP-FedAvg (the
canaries' clipping and noise are the defense's own: a canary path that skipped either would make
the honest run violate)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from audit.cli import main

DESIGN = """
name: dirac-e2e
partition: {clients: 20}
training: {rounds: 10, local_steps: 1}
defenses:
  - {name: dp-fedavg, epsilons: [4]}
  - {name: "tests.defenses.broken_dp_fedavg:UserHalvedNoise", label: halved, epsilons: [4]}
  - {name: "tests.defenses.broken_dp_fedavg:OneClientUnclippedAfterFirstRound", label: unclipped, epsilons: [4]}
  - {name: "tests.defenses.broken_dp_fedavg:UserHalvedNoise", label: secagg-halved, epsilons: [4],
     params: {secure_aggregation: true}}
  - {name: "tests.defenses.broken_dp_fedavg:NoiseHalvedFromMidRun", label: secagg-mid-run, epsilons: [4],
     params: {secure_aggregation: true}}
membership: {runs: 2}
attacks:
  - {name: dirac-canaries, params: {coins: 20000, observers: [all iterates, server]}}
diagnostics: {enabled: false}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dirac")
    (folder / "design.yaml").write_text(DESIGN, encoding="utf-8")
    assert main(["run", str(folder / "design.yaml"), "--out", str(folder / "out"), "--quiet"]) in (0, 1)
    return json.loads((folder / "out" / "results.json").read_text(encoding="utf-8"))


def _experiment(results, label):
    return next(e for e in results["experiments"] if e["label"].startswith(label))


def _statuses(experiment, observation):
    record = next(a for a in experiment["attacks"] if a["observation"] == observation)
    return {v["metric"]: v["status"] for v in record["verdicts"]}, record


def test_the_secretly_halved_noise_of_a_user_rewrite_violates_the_claim(results):
    """The rewrite's halved noise is a VIOLATION of the claim, and the released models' canary
    statistic measures that noise: its Gaussian-fit ε (true ε ≈ 8.5 at μ = 2√T/σ) lies above the
    claimed 4, where the honest run's does not. (Its one-run bound, ≈ 4 at 2·10⁴ coins and this
    μ, sits at the claim: the design's power against 2ε is what decides, not this one seed.)"""
    halved = _experiment(results, "halved")
    assert halved["soundness"] == "violation"
    statuses, record = _statuses(halved, "all iterates")
    assert record["adversary"] == "released" and "likelihood ratio" in record["statistic"]
    assert statuses["epsilon_gaussian_fit"] == "estimate above claim", record["verdicts"]
    honest, _ = _statuses(_experiment(results, "dp-fedavg"), "all iterates")
    assert honest["epsilon_gaussian_fit"] != "estimate above claim"


def test_the_halved_noise_exceeds_the_accounted_mechanisms_own_curve(results):
    """The all-iterates counts held to the claim's own mechanism — Gaussian noise of the claimed
    multiplier σ on each change S, every round, composed T = 10 times, whose exact ε at δ (PLD,
    computed here with dp-accounting directly) sits below the RDP claim of 4 — instead of the (ε, δ)
    curve, which caps the one-run bounds below 4 at these 2·10⁴ coins: the rewrite's halved noise is
    a VIOLATION by this rigorous bound (measured ε_LB ≈ 5.1 against 3.70), the honest run's is not
    (≈ 2.4), and the (ε, δ)-curve bounds of both stay below the claim."""
    import dp_accounting

    for label in ("dp-fedavg", "halved"):
        experiment = _experiment(results, label)
        released = next(a for a in experiment["claim"]["adversaries"] if a["adversary"] == "released")
        accountant = dp_accounting.pld.PLDAccountant()
        accountant.compose(dp_accounting.GaussianDpEvent(released["noise_multiplier"]), released["rounds"])
        exact = accountant.get_epsilon(released["delta"])
        statuses, record = _statuses(experiment, "all iterates")
        curve = next(a for a in experiment["attacks"] if a["attack"].endswith("all-iterates-mechanism-curve"))
        (verdict,) = curve["verdicts"]
        assert verdict["claimed"] == pytest.approx(exact, rel=1e-2) and exact < 4.0
        assert all(v["measured"] < 4.0 for v in record["verdicts"] if v["metric"].startswith("epsilon_one_run"))
        if label == "halved":
            assert verdict["status"] == "violation" and verdict["measured"] > exact, verdict
            assert "accounted mechanism's own ε" in verdict["text"]
        else:
            assert verdict["status"] != "violation" and verdict["measured"] < exact, verdict


def test_one_client_unclipped_after_round_one_violates_the_claimed_mechanism(results):
    """One canary a round, from round 2 on, reaches the server unclipped: too few coins to move a
    one-run count, but its upload of ±U where ±S belongs is a VIOLATION of the claimed clip."""
    statuses, record = _statuses(_experiment(results, "unclipped"), "each upload")
    assert statuses["upload_conformance"] == "violation", record["verdicts"]
    violation = next(v for v in record["verdicts"] if v["metric"] == "upload_conformance")
    assert violation["kind"] == "conformance" and "beyond the clip" in violation["text"]
    assert int(violation["text"].split(" in round ")[1].split(",")[0]) >= 2  # the bug starts in round 2


def _parametric(experiment, observation="each upload"):
    statuses, record = _statuses(experiment, observation)
    verdict = next(v for v in record["verdicts"] if v["metric"] == "parametric_gdp")
    ratio = float(re.search(r"θ̂ = μ̂/μ = ([0-9.]+)", record["notes"]).group(1))
    return verdict, ratio


def test_the_each_upload_scores_estimate_the_noise_the_code_draws(results):
    """The server's each-upload scores are Gaussian by construction, so the gated parametric test
    reads them: θ̂ = μ̂/μ estimates the claimed noise std over the drawn one — 1 for the honest
    DP-FedAvg, 2 for the rewrite with half the noise (its standard error ≈ √(1/n₁ + 1/n₀)/μ ≈ 0.01
    here). Half the noise is a VIOLATION by this estimate-based test; the honest run's test finds no
    departure and, resting on a model, does not make the experiment consistent."""
    honest, theta = _parametric(_experiment(results, "dp-fedavg"))
    assert honest["kind"] == "parametric" and honest["status"] == "inconclusive", honest
    assert abs(theta - 1.0) < 0.05 and "gate passed" in _statuses(_experiment(results, "dp-fedavg"), "each upload")[1]["notes"]
    halved, theta = _parametric(_experiment(results, "halved"))
    assert halved["status"] == "violation" and abs(theta - 2.0) < 0.1, halved
    assert "estimate-based" in halved["text"] and halved["measured"] > halved["bound"]


def test_behind_secure_aggregation_the_aggregate_readings_estimate_the_noise_too(results):
    """Under secure aggregation the server sees only the sum: no upload to test, but each step less
    the real clients' noise-free share of it (recomputed from the model the round started from) is
    the canary's clipped contribution plus the sum's noise — Gaussian by construction again. The
    rewrite with half the noise reads θ̂ ≈ 2 there, a VIOLATION; no uploads test runs."""
    experiment = _experiment(results, "secagg-halved")
    verdict, theta = _parametric(experiment, "aggregate, participation known")
    assert verdict["status"] == "violation" and abs(theta - 2.0) < 0.1, verdict
    statuses, _ = _statuses(experiment, "aggregate, participation known")
    assert "upload_conformance" not in statuses and experiment["soundness"] == "violation"


def test_behind_secure_aggregation_a_later_round_bug_is_caught_by_the_parametric_test(results):
    """Half the noise std from round ⌊T/2⌋ on, behind secure aggregation: the released counts barely
    see it (true ε 6.3 at a claimed 4; on the small design with uploads in view, the uploads' test
    was what caught it in 10 of 10 seeds), and here there are no uploads to test. The canaries'
    standardised sums over the 10 rounds have noise variance (5·1 + 5·¼)/10 = 0.625, so
    θ = 1/√0.625 ≈ 1.26 — a VIOLATION of the claimed mechanism by the parametric test (θ₀ ≈ 1.07
    at this claim: its RDP accounting over exact GDP)."""
    experiment = _experiment(results, "secagg-mid-run")
    verdict, theta = _parametric(experiment, "aggregate, participation known")
    assert verdict["status"] == "violation" and abs(theta - 1 / 0.625 ** 0.5) < 0.06, verdict
    assert experiment["soundness"] == "violation"


def test_the_honest_dp_fedavg_does_not_violate(results):
    honest = _experiment(results, "dp-fedavg")
    for observation in ("all iterates", "each upload"):
        statuses, record = _statuses(honest, observation)
        assert "violation" not in statuses.values(), record["verdicts"]
    # its uploads carry the claimed noise and clip, and the audit had the power to say so
    assert _statuses(honest, "each upload")[0]["upload_conformance"] == "consistent"
    # the released models' bound is compared with the released figure, the server's with its own
    released = _statuses(honest, "all iterates")[1]["verdicts"][0]
    server = _statuses(honest, "each upload")[1]["verdicts"][0]
    assert released["claimed"] == pytest.approx(4.0, rel=1e-3) and server["claimed"] > released["claimed"]


def test_a_canary_upload_is_clipped_and_noised_by_the_defense():
    """One round of DP-FedAvg with Dirac canaries of raw value ±1000·S: each canary's upload at
    its coordinate is ±S plus N(0, (σS)²/|P_t|), |P_t| the 4 real clients (canaries add signal
    only) — never ±1000·S, never noiseless."""
    from defenses.blocks.dirac_rows import DiracRows
    from defenses.fedavg import DPFedAvg, DPFedAvgParams
    from defenses.federated.engine import FederatedEngine
    from defenses.federated.training_job import TrainingConfig, TrainingJob

    torch.manual_seed(0)
    x, y = torch.randn(40, 5), torch.randint(0, 6, (40,))
    count, clip, sigma = 30, 0.5, 2.0
    training = TrainingConfig(rounds=1, local_steps=1, batch_size=5, eval_every=1)
    coords = torch.arange(count)
    values = torch.where(torch.arange(count) % 2 == 0, 1000.0 * clip, -1000.0 * clip)
    job = TrainingJob(lambda: torch.nn.Linear(5, 6), x, y, [np.arange(i, 40, 4) for i in range(4)], x, y, training,
                      seed=1, dirac_canaries=DiracRows(coords, values, 36))
    outcome = FederatedEngine(DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma)), job).run()
    uploads = outcome.server_view["dirac/uploads"][0].double()
    residual = (uploads - torch.sign(values).double() * clip).numpy()
    share = clip * sigma / np.sqrt(4)
    assert np.all(np.abs(residual) < 6 * share)  # ±S, not ±1000·S
    assert np.std(residual) > 0.3 * share  # noised


# ---------------------------------------------------------------- fixed-size sampling


def test_under_fixed_size_sampling_the_mirrored_canaries_mechanism_is_within_the_claim():
    """A canary joins each round independently at q = m/N; inserted it uploads +S·e_j, held out
    −S·e_j, with noise σS: round by round (1−q)N(0, σ²) + qN(±1, σ²) in units of S — the
    Poisson-sampled Gaussian that dp-accounting's REPLACE_ONE relation accounts at sensitivity 1.
    The claim accounts m of N without replacement, replace-one, σ/2 per change 2S (RDP). Over a
    grid of (m, N, σ, T) the canaries' exact ε (the PLD of their own pair, composed over T rounds)
    never exceeds the claim's, so no honest run can violate; and the canaries' standardisation is
    the claim's σ per S."""
    import itertools

    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution

    from attacks.canaries.dirac_canaries import per_canary_multiplier
    from defenses.privacy.claims import GaussianRounds, gaussian_adversaries

    ratios = []
    for m, population, sigma, rounds in itertools.product([1, 10], [20, 1000], [0.6, 2.0], [1, 50]):
        reach = GaussianRounds(sigma, sigma / m ** 0.5, "uploads", rounds, m / population, "fixed", population, "", "")
        released = gaussian_adversaries(reach, 1e-5, "rdp", "classic")[0]
        assert per_canary_multiplier(released) == pytest.approx(sigma)
        pair = privacy_loss_distribution.from_gaussian_mechanism(
            sigma, sensitivity=1.0, sampling_prob=m / population, value_discretization_interval=1e-3,
            neighboring_relation=NeighboringRelation.REPLACE_ONE).self_compose(rounds)
        ratios.append(pair.get_epsilon_for_delta(1e-5) / released.epsilon)
    assert max(ratios) <= 1.0, ratios
    # mirrored pairs are worth auditing: at m = 10 of 20 they reach a sixth of the claim or more
    assert min(ratios[8:12]) > 0.15, ratios


FIXED = """
name: dirac-fixed
partition: {clients: 20}
training: {rounds: 6, local_steps: 1, sampling: fixed, clients_per_round: 10}
defenses:
  - {name: dp-fedavg, epsilons: [4]}
  - {name: "tests.defenses.broken_dp_fedavg:UserHalvedNoise", label: halved, epsilons: [4]}
membership: {runs: 2}
attacks:
  - {name: dirac-canaries, params: {coins: 9000, observers: [all iterates, server]}}
diagnostics: {enabled: false}
"""


def test_fixed_size_sampling_is_audited_with_mirrored_pairs(tmp_path):
    """Under fixed-size sampling (m = 10 of 20) the canaries run (no refusal), held out as mirrored
    replace-one pairs: the server's uploads test sees the rewrite's halved noise, the honest run is
    no VIOLATION, and the released figures are compared with the claim's replace-one ε — never
    called consistent, since no power model describes their subsampled mechanism."""
    (tmp_path / "design.yaml").write_text(FIXED, encoding="utf-8")
    assert main(["run", str(tmp_path / "design.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) in (0, 1)
    results = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    honest, halved = _experiment(results, "dp-fedavg"), _experiment(results, "halved")
    assert not honest.get("skipped_attacks") and honest["soundness"] != "violation"
    statuses, record = _statuses(halved, "each upload")
    assert statuses["upload_conformance"] == "violation", record["verdicts"]
    statuses, record = _statuses(honest, "all iterates")
    assert honest["claim"]["relation"] == "replace-one" and "violation" not in statuses.values()
    assert record["verdicts"][0]["claimed"] == pytest.approx(4.0, rel=1e-3)
    assert record["verdicts"][0]["design_relation"] == "replace-one"
    # the released models' canaries met the sampling of 10 of 20 clients: a subsampled Gaussian,
    # whose one-run counts certify far less than the μ-GDP power model promises — never consistent
    bounds = [v for v in record["verdicts"] if v["metric"].startswith("epsilon_one_run")]
    assert bounds and all(v["status"] == "inconclusive" and "no power is stated" in v["text"]
                          and "subsampled at q = 0.5" in v["text"] for v in bounds), bounds
    # the server sees who joined: its per-upload readings are Gaussian, and its power is stated
    _, server = _statuses(honest, "each upload")
    assert all("no power is stated" not in v["text"] for v in server["verdicts"])


NBAFL = """
name: dirac-nbafl
partition: {clients: 20}
training: {rounds: 4, local_steps: 1}
defenses:
  - {name: nbafl, epsilons: [4]}
  - {name: "tests.defenses.broken_families:UserNbAFLHalvedNoise", label: halved, epsilons: [4]}
  - {name: "tests.defenses.broken_families:UserNbAFLClipSkipsOddCoordinates", label: clip-skips-odd, epsilons: [4]}
membership: {runs: 2}
attacks:
  - {name: dirac-canaries, params: {coins: 6000}}
diagnostics: {enabled: false}
"""


def test_nbafl_is_audited_with_mirrored_model_canaries(tmp_path):
    """NbAFL (Wei et al. 2020) clips each client's model and claims replace-one neighbours: its
    canaries are models ±C·e_j, mirrored, through its own clip and uplink noise. The honest run's
    uploads carry σ_U (no VIOLATION anywhere); a user's rewrite with half σ_U, and one whose model
    clip misses the odd coordinates, are VIOLATIONs of the claim they keep."""
    (tmp_path / "design.yaml").write_text(NBAFL, encoding="utf-8")
    assert main(["run", str(tmp_path / "design.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) in (0, 1)
    results = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    honest = _experiment(results, "nbafl")
    assert not honest.get("skipped_attacks") and honest["soundness"] != "violation"
    statuses, record = _statuses(honest, "each upload")
    assert statuses["upload_conformance"] == "consistent", record["verdicts"]
    statuses, record = _statuses(honest, "all iterates")
    assert "violation" not in statuses.values() and record["verdicts"][0]["design_relation"] == "replace-one"
    halved = _experiment(results, "halved")
    statuses, record = _statuses(halved, "each upload")
    assert halved["soundness"] == "violation" and statuses["upload_conformance"] == "violation", record["verdicts"]
    conformance = next(v for v in record["verdicts"] if v["metric"] == "upload_conformance")
    pooled = float(re.search(r"([0-9.]+) pooled", conformance["text"]).group(1))
    assert pooled == pytest.approx(0.5, abs=0.03)  # half σ_U, measured on the held-out canaries' own noise
    skipped = _experiment(results, "clip-skips-odd")
    statuses, record = _statuses(skipped, "each upload")
    assert skipped["soundness"] == "violation" and statuses["upload_conformance"] == "violation", record["verdicts"]


CLOCK = """
name: dirac-clock
partition: {clients: 8}
training: {rounds: 3, local_steps: 1}
defenses:
  - {name: "tests.defenses.broken_dp_fedavg:UserClockSeededNoise", label: clock, epsilons: [4]}
membership: {runs: 2}
attacks:
  - {name: dirac-canaries, params: {coins: 2000, observers: [all iterates, server]}}
diagnostics: {enabled: false}
"""


def test_noise_the_audit_cannot_couple_is_no_measurement_not_a_crash(tmp_path):
    """A user's noise seeded from the clock cannot be reproduced for a canary's probe rows: every
    observer's result says the path could not be isolated and carries no figure — no ε, and no ROC
    of placeholder scores — and the configuration is "no measurement", not consistent and not an
    internal error."""
    (tmp_path / "design.yaml").write_text(CLOCK, encoding="utf-8")
    assert main(["run", str(tmp_path / "design.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    (experiment,) = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))["experiments"]
    assert experiment["soundness"] == "no measurement"
    records = [a for a in experiment["attacks"] if a["attack"].startswith("dirac-canaries")]
    assert {a["observation"] for a in records} == {"all iterates", "each upload"}
    for record in records:
        assert "could not be isolated" in record["notes"] and not record["epsilon_kind"] and not record["verdicts"]
        assert all(value["value"] is None for value in record["metrics"].values()), record["metrics"]
