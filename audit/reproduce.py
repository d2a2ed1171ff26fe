"""``dpfl-audit reproduce STUDY``: rerun a paper's comparison on a CPU proxy and check its claims.

A :class:`Study` (one per paper, in :mod:`audit.reproductions`) names the proxy task, the
defenses ("arms") the paper compares, the target ε values or fixed noise, the seeds, the paper's
own table and the qualitative claims. Each (arm, ε, seed) is one federated run on the *whole*
candidate pool (no membership halving: this is about utility), stored in the run store, so an
interrupted reproduction resumes. The output is ``reproduction.md`` (our numbers beside the
paper's, and every claim checked in words at every ε it speaks of — holds / does not hold /
undecided, by how much, with a paired interval over the seeds; the rule is
:func:`audit.study.judge`'s), ``reproduction.json`` and ``reproduction.csv``. Absolute numbers
are not comparable with the paper's (other data, model and scale); the claims are the point, and
a claim that does not reproduce is reported as such.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

import defenses.catalog  # noqa: F401  (registers the defenses)
from audit import provenance
from audit.config import AuditConfig
from audit.core.atomic import write_json, write_text
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.output_folder import claim
from audit.core.schema import from_mapping, to_mapping
from audit.core.seeding import derive_seed, numpy_rng
from audit.core.vocabulary import Observer
from audit.logs import progress_bar
from audit.planning import check_device
from audit.reproductions import STUDIES
from audit.store import RunStore
from audit.study import Arm, ClaimCheck, RunResult, Study, StudyResults
from audit.tasks import Task, build_task, run_clients
from defenses.base import DEFENSES, AccountingSettings, Defense
from defenses.blocks.flat import ParamLayout
from defenses.federated.diagnostics import sharpness
from defenses.federated.training_job import TrainingConfig, TrainingDiverged, TrainingJob
from defenses.privacy.claims import PrivacyClaim

if TYPE_CHECKING:
    import pandas as pd
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    pd = lazy_module("pandas")
    torch = lazy_module("torch")

REPRODUCE_FORMAT = 2  # 2: fully keyed noise streams, sound defaults, claims per observer


def _fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Runner:
    def __init__(self, study: Study, out: Path, quiet: bool):
        self.study = study
        self.out = out
        self.quiet = quiet
        self.config: AuditConfig = from_mapping(AuditConfig, study.config)
        check_device(self.config.device)
        self.task: Task = build_task(self.config)
        self.layout = ParamLayout.of(self.task.model_factory())
        self.store = RunStore(out)
        self.accounting = AccountingSettings(self.config.accounting.accountant, self.config.accounting.conversion)
        labels = self.task.pool.labels.numpy()
        everything = np.ones(len(labels), dtype=bool)
        self.clients = [run_clients(labels, everything, self.config.partition, self.config.seed, seed)
                        for seed in range(study.seeds)]

    def defense(self, arm: Arm, training: TrainingConfig, epsilon: float | None) -> Defense:
        cls = DEFENSES.get(arm.defense, f"arm {arm.key}")
        defense = cls(from_mapping(cls.Params, arm.params, f"arms.{arm.key}.params"), self.layout)
        defense.validate(training, self.config.partition.clients)
        if epsilon is None:
            return defense
        return defense.calibrate(epsilon, self.study.delta, training, self.config.partition.clients, self.accounting)

    def training(self, arm: Arm, rounds: int | None = None) -> TrainingConfig:
        mapping = {**to_mapping(self.config.training), **arm.training}
        if rounds is not None:
            mapping["rounds"] = rounds
        return from_mapping(TrainingConfig, mapping, f"arms.{arm.key}.training")

    def job(self, training: TrainingConfig, seed: int) -> TrainingJob:
        device = self.config.device
        return TrainingJob(self.task.model_factory, self.task.pool.features.to(device), self.task.pool.labels.to(device),
                           self.clients[seed], self.task.test.features.to(device), self.task.test.labels.to(device),
                           training, seed=derive_seed(self.config.seed, "reproduce", seed), delta=self.study.delta,
                           accounting=self.accounting, device=device)

    def run(self, arm: Arm, epsilon: float | None, seed: int) -> RunResult:
        training = self.training(arm)
        defense = self.defense(arm, training, epsilon)
        run_id = f"{arm.key}-eps{epsilon}-s{seed}-" + _fingerprint(REPRODUCE_FORMAT, to_mapping(self.config), asdict(arm),
                                                                  epsilon, seed, self.study.delta)
        if not self.store.is_complete(run_id):
            started = time.perf_counter()
            try:
                outcome = defense.train(self.job(training, seed))
            except TrainingDiverged as failure:
                return self.diverged(arm, epsilon, seed, defense, training, failure)
            seconds = time.perf_counter() - started
            manifest = {"run_id": run_id, "study": self.study.name, "arm": asdict(arm), "epsilon_target": epsilon,
                        "seed": seed, "params": to_mapping(asdict(defense.params)), "claim": outcome.claim.as_dict(),
                        "timings": {"train_seconds": seconds}, "versions": provenance.versions()}
            if self.study.sharpness_radius is not None:
                members = np.concatenate(self.clients[seed])
                chosen = torch.as_tensor(numpy_rng(seed, "reproduce", "sharpness").permutation(members)[:1000])
                landscape = sharpness(self.task.model_factory(), outcome.final_params, self.task.pool.features[chosen],
                                      self.task.pool.labels[chosen], [self.study.sharpness_radius], 4,
                                      derive_seed(self.config.seed, "sharpness", seed))
                manifest["sharpness"] = landscape["mean_rise"][0]
            self.store.save_run(run_id, manifest, outcome.final_params, np.arange(len(self.task.pool)), outcome.metrics)
        manifest = self.store.load_manifest(run_id)
        metrics = self.store.load_metrics(run_id)
        evaluated = [m for m in metrics if m.get("test_accuracy") is not None]
        norms = [m["update_norm_median"] for m in metrics if "update_norm_median" in m]
        fractions = [m["clip_fraction"] for m in metrics if "clip_fraction" in m]
        claim = PrivacyClaim.from_dict(manifest["claim"])
        server = claim.against(Observer.SERVER)
        return RunResult(
            arm=arm.key, epsilon_target=epsilon, seed=seed,
            epsilon=float(claim.epsilon),
            final_accuracy=float(evaluated[-1]["test_accuracy"]) if evaluated else math.nan,
            best_accuracy=float(max(m["test_accuracy"] for m in evaluated)) if evaluated else math.nan,
            train_accuracy=float(evaluated[-1].get("train_accuracy", math.nan)) if evaluated else math.nan,
            accuracy_by_round={int(m["round"]): float(m["test_accuracy"]) for m in evaluated},
            epsilon_by_round={int(m["round"]): float(m["epsilon"]) for m in metrics if m.get("epsilon") is not None},
            update_norm_first=float(norms[0]) if norms else math.nan,
            update_norm_last=float(norms[-1]) if norms else math.nan,
            update_norm_mean=float(np.mean(norms)) if norms else math.nan,
            clip_fraction=float(np.mean(fractions)) if fractions else math.nan,
            sharpness=manifest.get("sharpness"),
            seconds=float(manifest["timings"]["train_seconds"]),
            epsilon_alternatives=dict(claim.alternatives),
            epsilon_server=server.epsilon if server is not None and server.covered else None,
        )

    def diverged(self, arm: Arm, epsilon: float | None, seed: int, defense: Defense, training: TrainingConfig,
                 failure: TrainingDiverged) -> RunResult:
        """A run whose training diverged: a result with no utility (NaN), not stored — a rerun
        trains it again and it diverges at the same round."""
        tqdm.write(f"dpfl-audit: warning: {arm.key!r} (ε target {epsilon}) seed {seed} diverged at round "
                   f"{failure.round} ({failure.what})", file=sys.stderr)
        claim = defense.privacy_claim(training, self.config.partition.clients, training.rounds, self.study.delta,
                                      self.accounting)
        nan = math.nan
        return RunResult(arm=arm.key, epsilon_target=epsilon, seed=seed, epsilon=float(claim.epsilon),
                         final_accuracy=nan, best_accuracy=nan, train_accuracy=nan, accuracy_by_round={},
                         epsilon_by_round={}, update_norm_first=nan, update_norm_last=nan, update_norm_mean=nan,
                         clip_fraction=nan, sharpness=None, seconds=0.0)

    def reduction(self, first: Arm, second: Arm) -> ClaimCheck:
        """Train two arms for a few rounds with the same seed; they must give the same bits."""
        training = self.training(first, self.study.reduction_rounds)
        job = self.job(training, 0)
        a = self.defense(first, training, None).train(job).final_params
        b = self.defense(second, self.training(second, self.study.reduction_rounds), None).train(job).final_params
        same = all(torch.equal(a[n], b[n]) for n in a)
        largest = max(float((a[n] - b[n]).abs().max()) for n in a)
        return ClaimCheck(f"{first.label} reproduces {second.label} exactly", same,
                          f"holds: bit-identical models after {self.study.reduction_rounds} rounds" if same
                          else f"does not hold: largest parameter difference {largest:.3g}")


def _mean_std(values: np.ndarray, scale: float = 100.0) -> str:
    values = values[~np.isnan(values)]
    if not len(values):
        return "–"
    if len(values) == 1:
        return f"{scale * values[0]:.2f}"
    return f"{scale * values.mean():.2f} ± {scale * values.std(ddof=1):.2f}"


def _epsilon_set(values: list[float | None]) -> str:
    """Distinct ε values in increasing order; None (JSON's infinity) and inf print as ∞."""
    finite = sorted({round(v, 12) for v in values if v is not None and math.isfinite(v)})
    text = [f"{v:.3g}" for v in finite]
    if any(v is None or (not math.isnan(v) and math.isinf(v)) for v in values):
        text.append("∞")
    return ", ".join(text) or "–"


def render(study: Study, results: StudyResults, claims: list[ClaimCheck], elapsed: float, dataset_note: str,
           proxy: dict | None = None) -> str:
    arms = study.arms
    lines = [f"# Reproduction: {study.title}", "", f"Paper: {study.paper}", "",
             f"Proxy: {dataset_note}; {len(arms)} configurations × {len(study.epsilons)} ε × {study.seeds} seeds, "
             f"{elapsed / 60:.1f} min on this machine. Accuracy in %, mean ± std over seeds.", ""]
    lines += [f"- {note}" for note in study.notes] + [""]
    columns = study.table_columns or [(f"ε={e:g}" if e is not None else "accuracy", "final", e) for e in study.epsilons]
    header = ["configuration"] + [c[0] for c in columns] + ["claimed ε (released models)", "against the server"] + \
        [f"{name} ε" for name in study.alternative_epsilons] + ["pre-clip norm (first → last)",
                                                                "clip fraction", "train − test gap"]
    if study.sharpness_radius is not None:
        header.append(f"sharpness (r={study.sharpness_radius})")
    lines.append("## Our numbers")
    lines.append("")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for arm in arms:
        cells = [arm.label]
        for _, kind, value in columns:
            if kind == "at":
                cells.append(_mean_std(results.at_epsilon(arm.key, value)))
            elif kind == "best":
                cells.append(_mean_std(results.values(arm.key, value, "best_accuracy")))
            else:
                cells.append(_mean_std(results.values(arm.key, value, "final_accuracy")))
        cells.append(_epsilon_set(results.values(arm.key, None, "epsilon").tolist()))
        servers = [r.epsilon_server for r in results.runs if r.arm == arm.key]
        private = any(r.epsilon_target is not None or math.isfinite(r.epsilon) for r in results.runs if r.arm == arm.key)
        cells.append(_epsilon_set(servers) if private else "–")
        for name in study.alternative_epsilons:
            cells.append(_epsilon_set([r.epsilon_alternatives.get(name, math.nan) for r in results.runs if r.arm == arm.key]))
        first = results.values(arm.key, None, "update_norm_first")
        last = results.values(arm.key, None, "update_norm_last")
        cells.append(f"{np.nanmean(first):.4g} → {np.nanmean(last):.4g}" if len(first) and not np.isnan(first).all() else "–")
        clip = results.values(arm.key, None, "clip_fraction")
        cells.append(f"{np.nanmean(clip):.2f}" if len(clip) and not np.isnan(clip).all() else "–")
        gap = results.values(arm.key, None, "train_accuracy") - results.values(arm.key, None, "final_accuracy")
        cells.append(_mean_std(gap))  # in points
        if study.sharpness_radius is not None:
            values = np.array([r.sharpness for r in results.runs if r.arm == arm.key and r.sharpness is not None], dtype=float)
            cells.append(f"{values.mean():.4f}" if len(values) else "–")
        lines.append("| " + " | ".join(cells) + " |")
    if study.extra_tables is not None:
        lines += ["", study.extra_tables(results, proxy).strip()]
    lines += ["", "## The paper's numbers", "", study.paper_tables.strip(), "", "## Claims", ""]
    for check in claims:
        mark = {True: "HOLDS", False: "DOES NOT HOLD", None: "UNDECIDED" if check.evaluated else "NOT EVALUATED"}[check.holds]
        lines.append(f"- **{mark}** — {check.claim}: {check.detail}.")
    lines.append("")
    return "\n".join(lines)


def reproduce(study: Study, out: Path, quiet: bool = False) -> dict[str, Any]:
    """Run (or resume) every run of the study and write its tables; returns paths and claim verdicts."""
    started = time.perf_counter()
    runner = Runner(study, out, quiet)  # loads the data, validates every arm before anything runs
    for arm in study.arms:
        runner.defense(arm, runner.training(arm), None)
    out = claim(out)  # created and locked once every arm is validated (audit.core.output_folder)
    def targets(arm: Arm) -> list[float | None]:
        return study.epsilons if DEFENSES.get(arm.defense, f"arm {arm.key}").private else [None]

    plan = [(arm, epsilon, seed) for arm in study.arms for epsilon in targets(arm) for seed in range(study.seeds)]
    bar = progress_bar(len(plan), f"reproduce {study.name}", quiet)
    runs = []
    for arm, epsilon, seed in plan:
        bar.set_postfix_str(f"{arm.key} ε={epsilon} seed {seed}", refresh=False)
        runs.append(runner.run(arm, epsilon, seed))
        bar.update(1)
    bar.close()
    results = StudyResults(runs)
    proxy = {"dim": runner.layout.dim, "clients": runner.config.partition.clients,
             "client_rate": runner.config.training.client_rate}
    study.proxy.clear()
    study.proxy.update(proxy)  # studies' claims read it through the Study they built
    checks = [runner.reduction(a, b) for a, b in study.reductions] + study.claims(results)
    elapsed = time.perf_counter() - started
    dataset_note = f"{runner.config.dataset.name} ({runner.task.dataset.source}), pool {len(runner.task.pool)}, " \
                   f"test {len(runner.task.test)}, {runner.config.partition.clients} {runner.config.partition.name} clients, " \
                   f"model {runner.config.model.name} ({runner.layout.dim} parameters)"
    markdown = render(study, results, checks, elapsed, dataset_note, proxy)
    write_text(out / "reproduction.md", markdown)
    write_json(out / "reproduction.json", {
        "study": study.name, "title": study.title, "paper": study.paper, "config": study.config, "notes": study.notes,
        "runs": [asdict(r) for r in runs], "claims": [asdict(c) for c in checks], "seconds": elapsed,
        "versions": provenance.versions()})
    frame = pd.DataFrame([{k: v for k, v in asdict(r).items()
                           if k not in ("accuracy_by_round", "epsilon_by_round")} for r in runs])
    write_text(out / "reproduction.csv", frame.to_csv(index=False, lineterminator="\n"))
    return {"markdown": markdown, "claims": checks, "paths": {"md": str(out / "reproduction.md"),
                                                              "json": str(out / "reproduction.json"),
                                                              "csv": str(out / "reproduction.csv")}}


def study_names() -> list[str]:
    return sorted(STUDIES)


def make_study(name: str, quick: bool, dataset: str, data_root: str | None, seeds: int | None) -> Study:
    if name not in STUDIES:
        raise UserInputError(f"study: unknown study '{name}'; allowed: {', '.join(sorted(STUDIES))}")
    study = STUDIES[name](quick=quick, dataset=dataset, data_root=data_root)
    if seeds is not None:
        if seeds < 1:
            raise UserInputError(f"--seeds: must be >= 1, got {seeds}")
        study.seeds = seeds
    return study
