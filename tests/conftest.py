"""Shared fixtures: small real tasks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from filelock import FileLock
from hypothesis import settings
from threadpoolctl import threadpool_limits

from audit.core.datasets import load_dataset
from audit.core.models import build_model
from audit.partitions import partition

# the suite runs in pytest-xdist workers (pyproject's addopts): the cores are shared between them,
# and a worker with more torch threads than its share only waits on the others
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(_THREADS)
# ... and so do the processes a test starts (the notebook's kernel, the CLI, Flower's and Ray's
# workers), which read their thread count from the environment: one of them with two OpenMP threads
# while the other worker holds a core ran the notebook's smoke audit in 404 s instead of 54 s
# (a worker sets its share even when the controller, which loads this file too, set another)
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    if "PYTEST_XDIST_WORKER" in os.environ or _name not in os.environ:
        os.environ[_name] = str(_THREADS)
threadpool_limits(_THREADS)  # numpy's and scipy's BLAS in this process, already loaded

#: the files that take longest (seconds of one worker, profiled on the 2-core machine, 2026-12-04),
#: handed to the workers first (pyproject's ``--no-loadscope-reorder`` keeps this order): the
#: default order, most tests first, left the few long end-to-end tests to the end, where one worker
#: ran them while the other had nothing left. The smoke preset's reader comes early too, so that
#: the shared smoke runs are ready before most of their readers start.
LONGEST_FIRST = (
    "tests/attacks/test_coverage.py",  # 250
    "tests/attacks/canaries/test_dirac_canaries.py",  # 200
    "tests/audit/test_pipeline.py",  # 160
    "tests/test_docs.py",  # 140
    "tests/audit/test_flower_app.py",  # 95
    "tests/reports/test_gate_false_alarms.py",  # 85
    "tests/reports/test_check.py",  # 70, the smoke preset's runs
    "tests/audit/test_flower_audit.py",  # 60
    "tests/attacks/mechanism_audits/test_conformance.py",  # 60
    "tests/defenses/privacy/test_accounting.py",  # 60
    "tests/attacks/mechanism_audits/test_conformance_broken.py",  # 50
    "tests/test_notebook.py",  # 45
    "tests/test_ci_templates.py",  # 40
    "tests/benchmarks/test_null_validity.py",  # 35
)


def pytest_collection_modifyitems(config, items):
    """Longest files first (:data:`LONGEST_FIRST`), every other file after them in its own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # a node id starts with its file's path from the root folder: "tests/…/test_x.py::test_y"
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: other orders kept


# property tests draw the same examples on every run: a failure is reproducible, and CI is not a lottery
settings.register_profile("deterministic", derandomize=True)
settings.load_profile("deterministic")

@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of tiny models (``pytestmark = pytest.mark.usefixtures(
    "one_torch_thread")``): a second thread only adds synchronisation, which on a loaded machine
    costs more than the matrix products themselves. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def digits():
    return load_dataset("digits")


@pytest.fixture
def digits_job(digits):
    """A small DP-FedAvg-sized job on digits: 8 clients of uneven size, MLP."""
    from defenses.federated.training_job import TrainingConfig, TrainingJob

    def make(**training) -> TrainingJob:
        rng = np.random.default_rng(0)
        order = rng.permutation(len(digits.train))
        test, pool = order[:200], order[200:600]
        pool_x, pool_y = digits.train.features[pool], digits.train.labels[pool]
        clients = partition(pool_y.numpy(), "dirichlet", 8, seed=3, alpha=2.0, min_client_size=5)
        defaults = dict(rounds=3, local_steps=2, batch_size=8, lr=0.1)
        defaults.update(training)
        return TrainingJob(lambda: build_model("mlp", (1, 8, 8), 10, {"hidden": [32]}), pool_x, pool_y, clients,
                           digits.train.features[test], digits.train.labels[test], TrainingConfig(**defaults), seed=11)

    return make


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """The smoke preset, named with markup, run twice into two fresh directories.

    Built once for the whole suite: the first pytest-xdist worker to ask runs the two audits in
    the folder the workers share (under a file lock), and every worker reads its own copy of them,
    so that a test which writes into one cannot disturb another worker's."""
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:  # the workers' base folders are siblings: build beside them
        shared = shared.parent
    shared = shared / "smoke-runs"
    with FileLock(f"{shared}.lock"):
        if not (shared / "built").is_file():
            _run_smoke_twice(shared)
            (shared / "built").write_text("the two audits below finished\n")
    base = tmp_path_factory.mktemp("smoke")
    outs = [base / "first", base / "second"]
    for out in outs:
        shutil.copytree(shared / out.name, out)
    return shared / "smoke.yaml", outs


def _run_smoke_twice(folder: Path) -> None:
    from audit.cli import main
    from tests.helpers import HOSTILE

    shutil.rmtree(folder, ignore_errors=True)  # what a worker that failed half-way left
    folder.mkdir(parents=True)
    config = folder / "smoke.yaml"
    config.write_text(f"preset: smoke\nname: '{HOSTILE}'\n")
    for name in ("first", "second"):
        assert main(["run", str(config), "--out", str(folder / name), "--quiet"]) == 0
