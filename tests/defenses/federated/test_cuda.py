"""The engine on a GPU: DP-FedAvg trained on ``cuda`` agrees with the CPU run,
and the noise the server adds has the claimed standard deviation where the adversary sees it.

Skipped without CUDA: nothing else depends on a GPU. Run on a GPU machine with
``benchmarks/gpu_check.sh`` (or ``PYTHONPATH=. pytest tests/defenses/federated/test_cuda.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from defenses.fedavg import DPFedAvg, DPFedAvgParams
from defenses.federated.training_job import RecordSpec, RoundContext, TrainingConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _on(job, device: str):
    return replace(job, pool_x=job.pool_x.to(device), pool_y=job.pool_y.to(device), test_x=job.test_x.to(device),
                   test_y=job.test_y.to(device), device=device)


@pytest.mark.parametrize("placement", ["aggregate", "client"])
@pytest.mark.parametrize("engine", ["batched", "loop"])
def test_cuda_run_matches_cpu_run(digits_job, placement, engine):
    """Same seed, same schedule, same noise (drawn from the same keyed CPU streams and moved to the
    device): the CUDA run's model, server view and metrics equal the CPU run's up to float rounding."""
    job = replace(digits_job(rounds=3, local_steps=2, momentum=0.9, engine=engine),
                  record=RecordSpec(global_rounds="all", upload_rounds="all"))
    defense = DPFedAvg(DPFedAvgParams(clip=1.0, noise_multiplier=1.0, noise_placement=placement))
    cpu = defense.train(job)
    gpu = DPFedAvg(defense.params).train(_on(job, "cuda"))
    for name, value in cpu.final_params.items():
        assert gpu.final_params[name].device.type == "cuda"
        torch.testing.assert_close(gpu.final_params[name].cpu(), value, rtol=1e-4, atol=1e-5)
    assert set(gpu.server_view) == set(cpu.server_view)
    for key, value in cpu.server_view.items():
        torch.testing.assert_close(gpu.server_view[key].cpu(), value, rtol=1e-4, atol=1e-5)
    for a, b in zip(cpu.metrics, gpu.metrics):
        assert a["participants"] == b["participants"]
        assert math.isclose(a["test_loss"], b["test_loss"], rel_tol=1e-4, abs_tol=1e-5)
    assert cpu.claim.epsilon == gpu.claim.epsilon


def _std_test(samples: torch.Tensor, std: float) -> float:
    """Two-sided χ² p-value that the (mean-zero) samples have standard deviation ``std``."""
    values = samples.double().flatten().cpu().numpy()
    statistic = float((values ** 2).sum() / std ** 2)
    df = values.size
    return 2 * min(stats.chi2.cdf(statistic, df), stats.chi2.sf(statistic, df))


@pytest.mark.parametrize("placement", ["aggregate", "client"])
def test_noise_on_cuda_has_the_claimed_std_in_the_sum(placement):
    """With all updates zero, what the server's sum of uploads holds is the noise alone: its std
    is σS (client placement: each of the n uploads carries σS/√n; aggregate: the trusted
    aggregator adds σS to the sum), computed on the device; and it equals the CPU's draw."""
    clients, dim, sigma, clip = 20, 50_000, 1.3, 0.7
    defense = DPFedAvg(DPFedAvgParams(clip=clip, noise_multiplier=sigma, noise_placement=placement))
    totals = {}
    for device in ("cpu", "cuda"):
        ctx = RoundContext(0, np.arange(clients), np.full(clients, 10), clients, TrainingConfig(), 5, device)
        uploads, _ = defense.privatize(torch.zeros(clients, dim, device=device), ctx)
        step = defense.aggregate(uploads, ctx)
        assert step.device.type == device
        totals[device] = step * clients  # the sum of uploads plus any aggregate noise
    total = totals["cuda"]
    assert abs(float(total.double().mean())) < 5 * sigma * clip / math.sqrt(dim)
    assert _std_test(total, sigma * clip) > 1e-3
    torch.testing.assert_close(total.cpu(), totals["cpu"], rtol=1e-5, atol=1e-6)


def test_benchmark_workload_trains_on_cuda():
    """The CNN layer shapes of the benchmark's workload 2 go through the batched engine on cuda."""
    from audit.core.models import build_model
    from defenses.federated.training_job import TrainingJob

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(200, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (200,), generator=generator)
    clients = [np.arange(i * 20, (i + 1) * 20) for i in range(8)]
    job = TrainingJob(lambda: build_model("lenet", (1, 28, 28), 10), x, y, clients, x[160:], y[160:],
                      TrainingConfig(rounds=2, batch_size=16, lr=0.1), seed=3)
    defense = DPFedAvg(DPFedAvgParams(clip=1.0, noise_multiplier=1.0, noise_placement="aggregate"))
    cpu = defense.train(job)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # cuDNN convolutions default to TF32
        gpu = DPFedAvg(defense.params).train(_on(job, "cuda"))
    for name, value in cpu.final_params.items():
        torch.testing.assert_close(gpu.final_params[name].cpu(), value, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["dp-fedavg", "fedavg", "nbafl", "fl-top-dp", "dp-fedsam", "fed-smp-topk"])
def test_runs_alone_and_together_on_cuda(digits_job, name):
    """The company a run keeps, on a GPU: each run trained alone (its own defense object) and the runs
    trained together (the one object planning binds). The claim and the participants depend on the
    run's data only, so they are equal exactly; the model may differ in its last bits where a batched
    kernel reduces in another order for another batch shape (benchmarks/company_spread.py measures
    that spread for every defense), and must agree to float tolerance."""
    from defenses.base import DEFENSES
    from defenses.blocks.flat import ParamLayout
    from defenses.run_batch import train_together
    from tests.defenses.test_defense_values import _job_for, _runs, _train_alone

    cls = DEFENSES.get(name)
    job = _on(_job_for(cls, digits_job(rounds=2, local_steps=1)), "cuda")
    layout = ParamLayout.of(job.model_factory())
    runs = [run if run.dirac_canaries is None else  # the canary rows on the device, as the pipeline builds them
            replace(run, dirac_canaries=replace(run.dirac_canaries, coords=run.dirac_canaries.coords.cuda(),
                                                values=run.dirac_canaries.values.cuda()))
            for run in _runs(job, cls(None, layout))]
    alone = [_train_alone(cls(None, layout), run) for run in runs]
    together = train_together(cls(None, layout), runs)
    for a, b in zip(alone, together):
        assert a.claim.as_dict() == b.claim.as_dict()
        assert [m["participants"] for m in a.metrics] == [m["participants"] for m in b.metrics]
        for key, value in a.final_params.items():
            torch.testing.assert_close(b.final_params[key], value, rtol=1e-4, atol=1e-5)
