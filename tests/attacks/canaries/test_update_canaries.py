"""Canary clients beyond the final model: the all-iterates statistic (Andrew et al. 2024, §5),
canaries confined to a round range, and canaries that respect per-tensor clipping."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

import attacks.catalog  # noqa: F401  (registers the attacks)
from attacks.base import ATTACKS
from attacks.canaries.canary_audit import CanaryContext, CanaryInjection, CanaryRun, canary_result
from audit.cli import main
from audit.core.models import build_model
from defenses.blocks.flat import ParamLayout
from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.training_job import TrainingConfig


def _unit_rows(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    rows = rng.normal(size=(count, dim))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _synthetic_run(seed: int, signal: float, rounds: int = 20, canaries: int = 400, dim: int = 4000):
    """Global models of a run in which every inserted canary joins exactly one round: each round's
    delta is isotropic noise of norm ≈ 1 plus ``signal`` times the joining canaries' directions."""
    rng = np.random.default_rng(seed)
    directions = _unit_rows(rng, canaries, dim)
    inserted = rng.random(canaries) < 0.5
    joins = rng.integers(0, rounds, size=canaries)
    deltas = rng.normal(scale=1 / np.sqrt(dim), size=(rounds, dim))
    for i in np.flatnonzero(inserted):
        deltas[joins[i]] += signal * directions[i]
    initial = rng.normal(size=dim)
    iterates = initial + np.cumsum(deltas, axis=0)
    run = CanaryRun(CanaryInjection(inserted, directions=torch.as_tensor(directions, dtype=torch.float32)),
                    torch.as_tensor(iterates[-1], dtype=torch.float32), torch.as_tensor(initial, dtype=torch.float32), {},
                    torch.as_tensor(iterates, dtype=torch.float32))
    return run, directions, deltas, inserted


def test_all_iterates_statistic_is_the_largest_cosine_with_a_rounds_model_delta():
    audit = ATTACKS.get("client-canaries")()
    run, directions, deltas, _ = _synthetic_run(0, signal=0.2, rounds=6, canaries=30, dim=500)
    expected = [max(float(u @ d) / (np.linalg.norm(u) * np.linalg.norm(d)) for d in deltas) for u in directions]
    np.testing.assert_allclose(audit.iterate_statistics(run), expected, atol=2e-5)
    final = deltas.sum(axis=0)
    expected_final = [float(u @ final) / (np.linalg.norm(u) * np.linalg.norm(final)) for u in directions]
    np.testing.assert_allclose(audit.statistics(None, run, None), expected_final, atol=2e-5)


def test_all_iterates_sees_what_the_final_model_blends_away_and_nothing_under_the_null():
    """A canary in one of T rounds: its round's delta shows it with signal-to-noise s (noise norm ≈ 1),
    the final change with ≈ s/√T. At s = 0.1, T = 20, d = 4000 the per-round cosine is ≈ 0.1 against
    null cosines of SD 1/√d ≈ 0.016 (their max over 20 rounds ≈ 0.03 ± 0.006): ≈ 10 SDs apart; the
    final cosine ≈ 0.1/√22 ≈ 0.021 against SD 0.016: 1.3 SDs, AUC ≈ Φ(1.3/√2) ≈ 0.82. With s = 0
    neither may see anything."""
    audit = ATTACKS.get("client-canaries")()
    run, _, _, inserted = _synthetic_run(1, signal=0.1)
    every = canary_result("x", "client", audit.iterate_statistics(run)[None, :], inserted[None, :], 1e-5, 0, "")
    final = canary_result("x", "client", audit.statistics(None, run, None)[None, :], inserted[None, :], 1e-5, 0, "")
    assert every.metrics["auc"].low > 0.99
    assert 0.7 < final.metrics["auc"].value < 0.92
    for figure in ("epsilon_one_run", "epsilon_one_run_fdp"):
        assert every.metrics[figure].value > final.metrics[figure].value + 1.0
    null_run, _, _, null_inserted = _synthetic_run(2, signal=0.0)
    for statistics in (audit.iterate_statistics(null_run), audit.statistics(None, null_run, None)):
        null = canary_result("x", "client", statistics[None, :], null_inserted[None, :], 1e-5, 0, "")
        members, others = int(null_inserted.sum()), int((~null_inserted).sum())
        standard_error = np.sqrt((members + others + 1) / (12 * members * others))  # the AUC's under H0 (Mann–Whitney)
        assert abs(null.metrics["auc"].value - 0.5) < 4 * standard_error
        assert null.metrics["epsilon_one_run"].value < 0.3 and null.metrics["epsilon_one_run_fdp"].value < 0.3


def test_a_round_range_confines_the_canaries_and_their_statistic(digits_job):
    job = digits_job(rounds=5, client_rate=1.0)
    defense = DPFedAvg(DPFedAvgParams(clip=0.5, noise_multiplier=1.0))
    dim = ParamLayout.of(job.model_factory()).dim
    outcome = defense.train(replace(job, update_canaries=torch.eye(dim)[:6], canary_rounds=(2, 3)))
    assert [row["canary_participants"] for row in outcome.metrics] == [0, 6, 6, 0, 0]
    # the statistic reads only rounds 2–3: a huge cosine planted in round 5 is not seen
    audit = ATTACKS.get("client-canaries")(ATTACKS.get("client-canaries").Params(round_range=[2, 3]))
    run, directions, deltas, _ = _synthetic_run(3, signal=0.0, rounds=5, canaries=8, dim=200)
    planted = run.iterates.clone()
    planted[4:] += 50.0 * torch.as_tensor(directions[0], dtype=torch.float32)
    expected = max(float(directions[0] @ d) / np.linalg.norm(d) for d in deltas[1:3])
    assert audit.iterate_statistics(replace(run, iterates=planted))[0] == pytest.approx(expected, abs=2e-5)


def _context(defense, layout: ParamLayout) -> CanaryContext:
    empty = torch.zeros(0)
    return CanaryContext("k", defense, TrainingConfig(), empty, empty, empty, empty, 10, layout, 0, 1e-5, 4)


def test_per_tensor_clipping_canaries_carry_the_clip_in_every_tensor():
    """Per-tensor clipping bounds each of L tensors by S, so a client's largest update has norm
    S√L. A canary must use all of it (scaled as one vector it would carry S, a 1/√L share) and stay
    parallel to the direction its statistic reads."""
    layout = ParamLayout.of(build_model("mlp", (1, 8, 8), 10, {"hidden": [32]}))
    slices = list(layout.slices().values())
    clip = 0.7
    defense = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=1.0, clip_mode="per_tensor")).bind(layout)
    for name in ("client-canaries", "gradient-canaries"):
        directions = ATTACKS.get(name)().directions(_context(defense, layout), 0)
        assert torch.allclose(torch.linalg.vector_norm(directions, dim=1), torch.ones(len(directions)), atol=1e-5)
        rows = defense.audit_hooks().canary_rows(directions, torch.ones(3))
        for part in slices:
            assert torch.allclose(torch.linalg.vector_norm(rows[:, part], dim=1), torch.full((len(rows),), clip), rtol=1e-5)
        assert torch.allclose(torch.linalg.vector_norm(rows, dim=1),
                              torch.full((len(rows),), clip * len(slices) ** 0.5), rtol=1e-5)
        cosines = torch.nn.functional.cosine_similarity(rows, directions, dim=1)
        assert torch.allclose(cosines, torch.ones(len(rows)), atol=1e-5)
        clipped, _, _ = defense.clip(rows)  # already at the bound: the defense's clipping leaves it
        assert torch.allclose(clipped, rows, rtol=1e-5)
        if name == "gradient-canaries":  # one signed coordinate per tensor
            for part in slices:
                assert ((directions[:, part] != 0).sum(dim=1) == 1).all()
    flat = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=1.0)).bind(layout)
    directions = ATTACKS.get("client-canaries")().directions(_context(flat, layout), 0)
    assert torch.allclose(torch.linalg.vector_norm(flat.audit_hooks().canary_rows(directions, torch.ones(3)), dim=1),
                          torch.full((len(directions),), clip), rtol=1e-5)


def _write(tmp_path, params: str, defense: str = "dp-fedavg", epsilons: str = "[8]") -> str:
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: digits, max_pool: 200, max_test: 100}\npartition: {clients: 4}\n"
                    "training: {rounds: 4, local_steps: 2, batch_size: 10, lr: 0.1}\nmembership: {runs: 2}\n"
                    "diagnostics: {enabled: false}\n"
                    f"attacks:\n  - name: client-canaries\n    params: {params}\n"
                    f"defenses:\n  - name: {defense}\n    epsilons: {epsilons}\n")
    return str(path)


@pytest.mark.parametrize("params, field", [
    ("{round_range: [3, 1]}", "attacks[0].params.round_range"),
    ("{round_range: [1, 9]}", "attacks[0].params.round_range"),
    ("{round_range: [1]}", "attacks[0].params.round_range"),
    ("{round_range: [1, 2, 3]}", "attacks[0].params.round_range"),
    ("{observation: everything}", "attacks[0].params.observation"),
])
def test_bad_canary_params_are_one_line_errors(tmp_path, capsys, params, field):
    out = tmp_path / "out"
    assert main(["run", _write(tmp_path, params), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    assert not out.exists()


def test_dp_fedavg_reports_the_final_model_and_all_iterates_bounds_side_by_side(tmp_path):
    out = tmp_path / "out"
    assert main(["run", _write(tmp_path, "{round_range: [2, 4]}"), "--out", str(out), "--quiet"]) == 0
    experiment = json.loads((out / "results.json").read_text())["experiments"][0]
    attacks = {a["attack"]: a for a in experiment["attacks"]}
    assert [(a["attack"], a["observation"]) for a in experiment["attacks"]] == [
        ("client-canaries", "final model"), ("client-canaries-all-iterates", "all iterates")]
    for attack in attacks.values():
        assert {"epsilon_one_run", "epsilon_one_run_fdp"} <= set(attack["metrics"])
        assert "rounds 2–4 only" in attack["notes"]
        assert all(v["status"] in ("consistent", "inconclusive") for v in attack["verdicts"])
    html = (out / "report.html").read_text()
    assert "observes: final model" in html and "observes: all iterates" in html
