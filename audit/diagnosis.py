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
from audit.stage_cache import StageCache, config_without, key_of
from audit.training import TrainedRuns
from defenses.federated.diagnostics import perturbation_robustness, sharpness

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def diagnose_runs(plan: Plan, trained: TrainedRuns, out: Path, quiet: bool = False,
                  cache: StageCache | None = None) -> dict[str, list[dict]]:
    """Sharpness and weight-perturbation robustness of every run's final model, from the store.

    Written to ``<out>/diagnostics/<experiment>.json`` (one entry per run). With ``cache``
    (:mod:`audit.stage_cache`), an experiment whose runs, data, code and config (the attacks
    aside) are those of its entry is read back, and its file left as it is.
    """
    settings = plan.config.diagnostics
    results: dict[str, list[dict]] = {}
    if not settings.enabled:
        return results
    cache = cache or StageCache(out, enabled=False)
    device = plan.config.device
    model = plan.task.model_factory().to(device)
    test_x, test_y = plan.task.test.features.to(device), plan.task.test.labels.to(device)
    keep_test = torch.as_tensor(
        numpy_rng(plan.config.seed, "diagnostics", "test").permutation(len(test_y))[:settings.max_records], device=device)
    for experiment in plan.experiments:
        if experiment.key in trained.diverged:
            continue  # nothing finished to diagnose
        file = inside(out, out / "diagnostics" / f"{experiment.key}.json")
        slot, key = f"diagnostics/{experiment.key}", None
        if cache.enabled:
            key = key_of({"stage": "diagnostics", "code": cache.code, "data": cache.data_digest(plan.task),
                          "config": config_without(plan.config, "name", "attacks"), "experiment": experiment.key,
                          "runs": cache.runs_digest(trained.store.path(rid) for rid in trained.run_ids[experiment.key])})
            cached = cache.lookup(slot, key, {})
            if cached is not None:
                results[experiment.key] = cached
                continue
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
        write_json(file, entries)
        if key is not None:
            cache.store(slot, key, entries, [file], {})
    return results
