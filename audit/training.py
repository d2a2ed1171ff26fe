"""The training stage: every run of a plan not yet in the run store — the membership runs (here,
in groups trained together, or in worker processes: :mod:`audit.executors`), then each canary
audit's own runs (:mod:`audit.canary_runs`) — and the record of what was trained,
:class:`TrainedRuns`, which the attacks and the results read."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from audit.canary_runs import train_canary_runs
from audit.executors import train_in_processes, train_in_ray
from audit.logs import progress_bar
from audit.planning import Plan, PlannedExperiment
from audit.run_training import run_groups, train_membership_runs
from audit.store import RunStore, run_id
from defenses.privacy.claims import PrivacyClaim
from reports.document import Diverged, Skipped

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedRuns:
    """The runs of a plan as the training stage left them in ``store``.

    ``run_ids``: experiment key → its membership runs, in run order (those before a divergence);
    ``canary_ids``: experiment key → canary audit label → that audit's runs (audits that ran);
    ``diverged``: experiment key → the lowest-index membership run whose training diverged (the
    experiment is a diverged result: nothing of it is attacked); ``skipped``: experiment key → the
    canary audits that have no runs, and why; ``seconds``: experiment key → training time."""

    store: RunStore
    run_ids: Mapping[str, tuple[str, ...]]
    canary_ids: Mapping[str, Mapping[str, tuple[str, ...]]]
    diverged: Mapping[str, Diverged]
    skipped: Mapping[str, tuple[Skipped, ...]]
    seconds: Mapping[str, float]

    def claim(self, experiment: PlannedExperiment) -> PrivacyClaim:
        """The claim of the trained runs (some depend on the run's clients, e.g. NbAFL's smallest client)."""
        ids = self.run_ids.get(experiment.key)
        return PrivacyClaim.from_dict(self.store.load_manifest(ids[0])["claim"]) if ids else experiment.claim


def train_runs(plan: Plan, store: RunStore, quiet: bool = False, executor: str = "local",
               workers: int | None = None, batch_runs: int | None = None,
               ray_address: str | None = None) -> TrainedRuns:
    """Train every run of every experiment not yet in the store — the membership runs (here, in
    groups trained together, or in worker processes: :mod:`audit.executors`), then each canary
    audit's own runs; returns what was trained."""
    config = plan.config
    run_ids: dict[str, tuple[str, ...]] = {}
    canary_ids: dict[str, dict[str, tuple[str, ...]]] = {}
    diverged: dict[str, Diverged] = {}
    skipped: dict[str, tuple[Skipped, ...]] = {}
    seconds: dict[str, float] = {}
    if executor == "process":
        train_in_processes(plan, store, workers, quiet, batch_runs)
    elif executor == "ray":
        train_in_ray(plan, store, workers, quiet, ray_address, batch_runs)
    for experiment in plan.experiments:
        ids = tuple(run_id(plan, experiment, r) for r in range(config.membership.runs))
        started = time.perf_counter()
        LOG.info("training %s: %d membership runs (%d stored already)", experiment.label, len(ids),
                 sum(store.is_complete(rid) for rid in ids))
        bar = progress_bar(config.membership.runs, f"train {experiment.label}", quiet)
        groups = run_groups(plan, store, experiment, batch_runs)
        bar.update(config.membership.runs - sum(len(g) for g in groups))  # resumed from the store
        # groups go in run order, so the first group with a diverged run holds the lowest-index one
        # (every earlier run is stored and finite): a rerun records the same run and round
        first = None
        for group in groups:
            LOG.debug("%s: runs %s train together", experiment.label, ", ".join(str(r) for r in group))
            bar.set_postfix_str(f"{len(group)} together", refresh=False)
            first = train_membership_runs(plan, store, experiment, group)
            bar.update(len(group))
            if first is not None:
                break  # the experiment is a diverged result: its remaining runs need not train
        bar.close()
        if first is not None:
            diverged[experiment.key] = first
            run_ids[experiment.key] = ids[:first.run]  # the runs that finished before it
            LOG.warning(f"{experiment.label!r} run {first.run} diverged at round {first.round} "
                 f"({first.what}); its attacks are skipped")
        else:
            run_ids[experiment.key] = ids
            audits = {audit.label: train_canary_runs(plan, store, experiment, audit, quiet) for audit in plan.canary_audits}
            canary_ids[experiment.key] = {label: runs for label, runs in audits.items() if not isinstance(runs, Skipped)}
            skipped[experiment.key] = tuple(reason for reason in audits.values() if isinstance(reason, Skipped))
        seconds[experiment.key] = time.perf_counter() - started
        LOG.info("trained %s in %.1f s", experiment.label, seconds[experiment.key])
    return TrainedRuns(store, run_ids, canary_ids, diverged, skipped, seconds)
