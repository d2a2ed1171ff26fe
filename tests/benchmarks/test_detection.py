"""The detection benchmark's bookkeeping (``benchmarks/detection.py``), without training: a
synthetic results.json read into records and cells — a VIOLATION from any observer counts, the
ratio is the best *released-model* lower bound over the released claim (never the server's bound
against its own, much larger, figure), the median and the counts per cell — the table printed from
them, the designs the benchmark hands to ``dpfl-audit run`` resolved by the config loader, and the
broken variants acting on Dirac canary rows as on dense rows."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "detection.py"


@pytest.fixture(scope="module")
def detection():
    return load_script(SCRIPT, "detection_benchmark")


def _verdict(metric, measured, claimed, status="inconclusive", kind="lower_bound", power=None):
    return {"metric": metric, "kind": kind, "measured": measured, "claimed": claimed, "status": status,
            **({"power": power} if power is not None else {})}


def _experiment(label, epsilon, final, iterates, server, statuses=("inconclusive", "inconclusive", "inconclusive"),
                fit="inconclusive"):
    """An experiment of results.json with the three Dirac observers; ``final``/``iterates``/``server``
    are the measured one-run bounds (the f-DP one 0.01 above), ``statuses`` their verdicts."""
    claimed, server_claim = epsilon * 0.99995, 4064.0
    power = {"detection": 0.9, "tight_bound": 0.55 * claimed}

    def attack(name, observation, adversary, measured, claim, status):
        return {"attack": name, "observation": observation, "adversary": adversary, "verdicts": [
            _verdict("epsilon_one_run", measured, claim, status, power=power),
            _verdict("epsilon_one_run_fdp", measured + 0.01, claim, power={"detection": 0.5, "tight_bound": 0.5 * claim}),
            _verdict("epsilon_gaussian_fit", 100.0, claim, fit, kind="estimate"),  # an estimate is never a bound
        ]}

    return {"key": f"{label}-eps{epsilon:g}", "label": f"{label} (ε={epsilon:g})", "target_epsilon": epsilon,
            "status": "completed", "soundness": "violation" if "violation" in statuses else "inconclusive",
            "params": {"noise_multiplier": 3.660707480580407},
            "training": {"rounds": 10, "client_rate": 1.0, "sampling": "poisson"},
            "claim": {"epsilon": claimed, "delta": 1e-5}, "skipped_attacks": [],
            "attacks": [attack("dirac-canaries", "final model", "released", final, claimed, statuses[0]),
                        attack("dirac-canaries-all-iterates", "all iterates", "released", iterates, claimed, statuses[1]),
                        attack("dirac-canaries-each-upload", "each upload", "server", server, server_claim, statuses[2])]}


def _results(*experiments):
    return {"config": {"partition": {"clients": 20}}, "experiments": list(experiments)}


def test_cells_count_violations_and_take_the_best_released_bound(detection):
    halved = next(v for v in detection.VARIANTS if v.label == "halved-noise")
    variants = [detection.HONEST, halved]
    records = []
    # honest: no violation; the server's bound (8.5) is larger but held to its own figure — not counted
    for seed, (final, iterates) in enumerate([(1.9, 1.5), (1.7, 2.1), (2.0, 1.0)]):
        fit = "estimate above claim" if seed == 1 else "inconclusive"  # a warning, not a VIOLATION
        records += detection.seed_records(_results(_experiment("dp-fedavg", 4.0, final, iterates, 8.5, fit=fit)), seed, variants)
    # halved: a violation by the final model in seed 0, by the server alone in seed 1, none in seed 2
    statuses = [("violation", "inconclusive", "inconclusive"), ("inconclusive",) * 2 + ("violation",), ("inconclusive",) * 3]
    for seed, status in enumerate(statuses):
        experiment = _experiment("halved-noise", 4.0, 4.5 + seed, 3.0, 9.0, status)
        records += detection.seed_records(_results(experiment, {"label": "fedavg", "target_epsilon": None}), seed, variants)
    assert len(records) == 6
    honest, broken = detection.cells(records, variants)

    assert (honest["violations"], honest["audits"], honest["violation_rate"]) == (0, 3, 0.0)
    assert honest["estimates_above_claim"] == 1
    # best released bound per seed: 1.91, 2.11, 2.01 (the f-DP one, 0.01 above) over the claim 3.9998
    assert honest["median_ratio"] == pytest.approx(2.01 / (4 * 0.99995))
    assert honest["max_ratio"] == pytest.approx(2.11 / (4 * 0.99995))
    assert honest["true_epsilon"] == pytest.approx(3.698, abs=2e-3)  # exact GDP at the calibrated σ
    assert honest["median_power_2eps"] == pytest.approx(0.9)

    assert (broken["violations"], broken["audits"]) == (2, 3) and broken["violation_rate"] == pytest.approx(2 / 3)
    assert broken["estimates_above_claim"] == 0
    assert broken["violating_observers"] == {"each upload": 1, "final model": 1}
    assert broken["median_ratio"] == pytest.approx(5.51 / (4 * 0.99995))
    assert broken["true_epsilon"] == pytest.approx(8.36, abs=0.01)  # μ doubled

    table = detection.format_table([honest, broken]).splitlines()
    assert table[0].split()[:4] == ["variant", "ε", "true", "ε"]
    assert "0/3 (0%)" in table[1] and "0.503 [0.478, 0.528]" in table[1] and " 1/3 " in table[1]
    assert table[2].startswith("halved-noise") and "2/3 (67%)" in table[2] and "8.36" in table[2]
    assert table[2].endswith("each upload 1, final model 1")


def test_a_refused_audit_is_a_row_with_its_reason(detection):
    reason = "it transforms each dense upload before clipping or after the noise"
    refused = {"label": "fed-smp-randk (ε=4)", "target_epsilon": 4.0, "attacks": [], "status": "completed",
               "skipped_attacks": [{"attack": "dirac-canaries", "reason": reason}]}
    figures = detection.audit_figures(refused)
    assert not figures["ran"] and figures["skipped"] == reason and figures["ratio"] is None
    ran = detection.audit_figures(_experiment("dp-fedavg", 4.0, 1.9, 1.5, 8.5))
    assert ran["ran"] and ran["best_observer"] == "final model" and ran["tight_ratio"] == pytest.approx(0.55)
    rows = [{"defense": "dp-fedavg", "epsilon": 4.0, **ran}, {"defense": "fed-smp-randk", "epsilon": 4.0, **figures},
            {"defense": "nbafl", "epsilon": 4.0, "ran": False, "error": "dpfl-audit run exited 2: ..."}]
    lines = detection.format_defense_rows(rows).splitlines()
    assert lines[1].split()[:5] == ["dp-fedavg", "4", "ran", "0.478", "no"]
    assert lines[2].split()[:4] == ["fed-smp-randk", "4", "not", "run"] and lines[2].endswith(reason)
    assert lines[3].split()[:3] == ["nbafl", "4", "error"]


def test_the_designs_resolve_to_the_dirac_audit_alone(detection, tmp_path):
    import yaml

    from audit.config import load_config

    for design, rounds, coins in (("small", 10, 20000), ("default", 60, 100_000)):
        entries = [detection.entry(v, [1, 4]) for v in (detection.HONEST, *detection.VARIANTS)]
        path = tmp_path / f"{design}.yaml"
        path.write_text(yaml.safe_dump(detection.design_config(design, 3, entries), allow_unicode=True), encoding="utf-8")
        config = load_config(path)
        assert config.seed == 3 and config.training.rounds == rounds and config.partition.clients == 20
        assert config.membership.runs == 2 and not config.diagnostics.enabled
        assert [a.name for a in config.attacks] == ["dirac-canaries"]
        assert dict(config.attacks[0].params or {}).get("coins", 100_000) == coins  # the attack's default: 10⁵
        assert [d.name for d in config.defenses][:2] == ["dp-fedavg", "tests.defenses.broken_dp_fedavg:HalvedNoise"]
        assert config.defenses[1].epsilons == [1.0, 4.0]
    with pytest.raises(ValueError):
        detection.design_config("large", 0, [])


def test_the_broken_variants_do_what_their_names_say():
    from defenses.fedavg import DPFedAvg, DPFedAvgParams
    from tests.defenses import broken_dp_fedavg as broken

    params = DPFedAvgParams(clip=0.5, noise_multiplier=2.0)
    dense = broken.ClipsAtThreeTimesTheBound(params).clip(torch.full((2, 4), 10.0))[0]
    assert torch.linalg.vector_norm(dense, dim=1).tolist() == pytest.approx([1.5, 1.5])

    def ctx(round_index, count=25):
        return SimpleNamespace(round=round_index, participant_count=count, training=SimpleNamespace(rounds=10))

    honest = DPFedAvg(params).upload_noise_std(ctx(0))
    assert honest == pytest.approx(0.5 * 2.0 / 5)
    mid = broken.NoiseHalvedFromMidRun(params)
    assert [mid.upload_noise_std(ctx(t)) / honest for t in (0, 4, 5, 9)] == pytest.approx([1, 1, 0.5, 0.5])
    shrunk = broken.NoiseShrunkAfterFirstRound(params)
    assert [shrunk.upload_noise_std(ctx(t)) / honest for t in (0, 1, 9)] == pytest.approx([1, 0.8, 0.8])
    assert broken.NoiseOverCountNotItsRoot(params).upload_noise_std(ctx(3)) == pytest.approx(honest / math.sqrt(25))
