"""The canary-clients-at-scale benchmark (benchmarks/canary_scale.py) times the run it says: the
default audit's DP-FedAvg run, and the same run with ⌈K/q⌉ canary clients of which K join a round
at the default's full participation — Dirac rows of the dirac-canaries audit's own design (±U on
one coordinate, U = amplitude × the clip) and dense unit directions — everything else equal."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from defenses.federated.engine import FederatedEngine
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
PER_ROUND = 300


@pytest.fixture(scope="module")
def setting():
    bench = load_script(ROOT / "benchmarks" / "canary_scale.py", "dpfl_bench_canary_scale")
    return bench.default_canary_jobs(per_round=PER_ROUND, dense=True)


def test_the_jobs_differ_only_by_their_canaries(setting):
    jobs = setting["jobs"]
    plain = jobs["plain"]
    assert plain.dirac_canaries is None and plain.update_canaries is None
    assert replace(jobs["dirac"], dirac_canaries=None) == plain
    assert replace(jobs["dense"], update_canaries=None) == plain
    assert setting["rate"] == 1.0 and setting["canaries"] == PER_ROUND  # the default: every client every round


def test_dirac_rows_are_the_audits_design(setting):
    rows = setting["jobs"]["dirac"].dirac_canaries
    assert len(rows) == PER_ROUND and rows.dim == setting["dim"]
    assert len(np.unique(rows.coords.numpy())) == PER_ROUND  # one run's design: one canary per coordinate
    # inserted canaries carry ±U, U = 1000·S (the audit's default amplitude, S the defense's clip)
    clip = setting["defense"].params.clip
    nonzero = rows.values[rows.values != 0].abs()
    assert len(nonzero) > 0 and torch.allclose(nonzero, torch.full_like(nonzero, 1000.0 * clip))


def test_dense_canaries_are_unit_directions(setting):
    directions = setting["jobs"]["dense"].update_canaries
    assert directions.shape == (PER_ROUND, setting["dim"])
    assert torch.allclose(torch.linalg.vector_norm(directions, dim=1), torch.ones(PER_ROUND), atol=1e-5)


@pytest.mark.parametrize("kind", ["dirac", "dense"])
def test_the_canaries_join_every_round(setting, kind):
    job = setting["jobs"][kind]
    outcome = FederatedEngine(setting["defense"], replace(job, training=replace(job.training, rounds=2))).run()
    assert [row["canary_participants"] for row in outcome.metrics] == [len(job.dirac_canaries or job.update_canaries)] * 2
