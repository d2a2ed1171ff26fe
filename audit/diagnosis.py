"""Loss-landscape diagnostics of every trained run: sharpness and weight-perturbation robustness."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from audit.core.atomic import write_json
from audit.core.lazy_modules import lazy_module
from audit.core.safe_names import inside
from audit.core.seeding import derive_seed, numpy_rng
from audit.logs import progress_bar
from audit.planning import Plan
from audit.training import TrainedRuns
from defenses.federated.diagnostics import perturbation_robustness, sharpness

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def diagnose_runs(plan: Plan, trained: TrainedRuns, out: Path, quiet: bool = False) -> dict[str, list[dict]]:
    """Sharpness and weight-perturbation robustness of every run's final model, from the store.

    Written to ``<out>/diagnostics/<experiment>.json`` (one entry per run), recomputed on every
    call: they are cheap next to training and depend on the diagnostics settings, not the run.
    """
    settings = plan.config.diagnostics
    results: dict[str, list[dict]] = {}
    if not settings.enabled:
        return results
    device = plan.config.device
    model = plan.task.model_factory().to(device)
    test_x, test_y = plan.task.test.features.to(device), plan.task.test.labels.to(device)
    keep_test = torch.as_tensor(
        numpy_rng(plan.config.seed, "diagnostics", "test").permutation(len(test_y))[:settings.max_records], device=device)
    for experiment in plan.experiments:
        if experiment.key in trained.diverged:
            continue  # nothing finished to diagnose
        bar = progress_bar(len(trained.run_ids[experiment.key]), f"diagnose {experiment.label}", quiet)
        entries = []
        for r, rid in enumerate(trained.run_ids[experiment.key]):
            params = trained.store.load_params(rid, device=device)
            members = np.concatenate(plan.clients[r])
            chosen = numpy_rng(plan.config.seed, "diagnostics", "train", r).permutation(members)[:settings.max_records]
            train_x = plan.task.pool.features[torch.as_tensor(chosen)].to(device)
            train_y = plan.task.pool.labels[torch.as_tensor(chosen)].to(device)
            seed = derive_seed(plan.config.seed, "diagnostics", experiment.key, r)
            entries.append({
                "run_id": rid,
                "sharpness": sharpness(model, params, train_x, train_y, settings.sharpness_radii,
                                       settings.sharpness_directions, seed),
                "robustness": perturbation_robustness(model, params, test_x[keep_test], test_y[keep_test],
                                                      settings.perturbation_stds, settings.perturbation_repeats, seed),
            })
            bar.update(1)
        bar.close()
        results[experiment.key] = entries
        write_json(inside(out, out / "diagnostics" / f"{experiment.key}.json"), entries)
    return results
