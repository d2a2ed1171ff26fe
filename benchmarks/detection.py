"""What does the end-to-end Dirac canary audit catch? Detection of broken DP-FedAvg
implementations that keep the honest claim, the honest false-VIOLATION rate, and what the audit
certifies of the other central-DP Gaussian defenses.

Every audit goes through the real command line — ``audit.cli.main(["run", design.yaml, "--out",
folder, "--quiet"])``, training, attack, verdicts and results files — with the ``dirac-canaries``
audit alone (no membership attack) and ``diagnostics: {enabled: false}``, and is read back from
its ``results.json``. The audit (Nasr et al. 2023, "Tight Auditing of Differentially Private
Machine Learning"; Andrew et al. 2024, "One-shot Empirical Privacy Estimation for Federated
Learning") inserts one canary client per model coordinate, each by an independent fair coin, whose
raw update goes through the defense's own clip, noise and sum; its one-run counts (Steinke, Nasr,
Jagielski 2023; and their f-DP analysis, Mahloujifar, Melis, Chaudhuri 2024) are lower bounds,
held to the claim by Holm's weighted procedure at 5 % over the configuration's family.

Measured, per cell (variant × claimed ε, over ``--seeds`` seeds, each seed a fresh audit):

* **VIOLATION rate** — the share of seeds whose audit calls any of its figures a VIOLATION:
  the detection rate of a broken variant, the false-violation rate of the honest ``dp-fedavg``
  (at most 5 % if the audit is sound: the family-wise error of Holm's procedure); split by what
  caught it — an ε lower bound above the claim, or the test of the canaries' uploads against the
  claimed clip and noise (:mod:`audit.core.upload_conformance`, the server's view);
* **median ε_LB / ε** — per seed the best rigorous bound, the largest ``measured`` of the
  ``lower_bound`` verdicts on the released-model observers (``final model``, ``all iterates``),
  over the claim's released ε; its median and range over the seeds;
* **fit above ε** — the seeds where a Gaussian-fit estimate's interval lies wholly above the claim
  (Andrew et al. 2024's estimate: a warning the report prints, not a test and not a VIOLATION);
* beside them the design's power against 2ε (``power.detection`` of the best-powered released
  bound: the yardstick the verdicts use) and the variant's true ε where it can be derived (exact
  μ-GDP composition at full participation: T rounds with noise multipliers σ_t compose to
  μ = √(Σ_t 1/σ_t²); "inf" where an update of unbounded norm reaches the sum).

Designs (``--design``):

* ``small`` — the end-to-end test's design (``tests/attacks/canaries/test_dirac_canaries.py``): 20
  clients, 10 rounds, one local epoch, 2 membership runs, ``coins: 20000`` (28,830 coins: 3 runs of
  one canary per coordinate of the 9,610-parameter MLP), all three observers (the test keeps two);
* ``default`` — the default audit's training (digits, 20 clients, 60 rounds of 3 local epochs,
  the MLP) with ``membership.runs: 2`` and the default 10⁵ coins.

Parts: the matrix (``--skip-matrix`` leaves it out); a row per central-DP Gaussian defense at a
tight ε = 4 over the seeds (``--skip-defenses``): its ε_LB / ε where the Dirac audit runs, else the
reason the audit gives for not running (``skipped_attacks`` in results.json, from
``AuditHooks.dirac_canaries_refused`` or the attack's ``not_applicable``); ``--twins``: each
family's broken twins (``tests/defenses/broken_families.py``: LUS and BLUR+LUS, the top-k and
rand-k masks, the FL-TOP family's subset training, each with a noise, clip or schedule bug, most
written as a user rewrites ``privatize``) at each ``--epsilons`` over the seeds, each audited
against its family's honest claim; and ``--honest-seeds N``,
a mode of its own: the honest ``dp-fedavg`` on the small design over N seeds at each
``--epsilons``, for its false-violation rate (target ≤ 5 % over ≥ 100 seeds).

Run: ``python benchmarks/detection.py [--design small|default] [--seeds 10] [--epsilons 1 2 4 8]``
(the whole matrix; ``--honest-seeds 100`` for the false-violation mode). Prints the tables and
writes ``benchmarks/results/detection-<design>.json`` (``detection-honest.json`` in the honest
mode). The JSON holds no timings, so the same command gives the same file. Measured
figures: ``benchmarks/README.md``, section "What the Dirac canary audit catches".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the audit package, and the broken variants under tests/ named module:Class
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from audit.cli import main as cli_main  # noqa: E402
from audit.core.fdp_one_run import gdp_epsilon  # noqa: E402

BROKEN = "tests.defenses.broken_dp_fedavg"
EPSILONS = (1.0, 2.0, 4.0, 8.0)
#: the claimed ε of the defense rows: tight enough that a design can certify a good share of it
DEFENSE_EPSILON = 4.0
#: the released-model observers (the server's figure of the claim is another, much larger one)
RELEASED = "released"


@dataclass(frozen=True)
class Variant:
    """A DP-FedAvg implementation audited against DP-FedAvg's claim."""

    label: str
    defense: str  # a registry name or module:Class
    bug: str
    #: the factor on μ of the released mechanism, from (rounds, clients); None: unbounded (true ε = inf)
    mu_factor: Callable[[int, int], float] | None


def _mid_run(rounds: int, clients: int) -> float:
    half = rounds // 2  # rounds ⌊T/2⌋ … T−1 carry half the std: a quarter of the variance
    return math.sqrt((half + 4 * (rounds - half)) / rounds)


def _shrunk(rounds: int, clients: int) -> float:
    return math.sqrt((1 + (rounds - 1) / 0.8 ** 2) / rounds)


HONEST = Variant("dp-fedavg", "dp-fedavg", "honest (the claim's own mechanism)", lambda rounds, clients: 1.0)
VARIANTS = (
    Variant("halved-noise", f"{BROKEN}:HalvedNoise", "half the noise std in every round", lambda rounds, clients: 2.0),
    Variant("noise-halved-from-mid-run", f"{BROKEN}:NoiseHalvedFromMidRun", "half the noise std from round ⌊T/2⌋ on", _mid_run),
    Variant("noise-0.8-after-round-1", f"{BROKEN}:NoiseShrunkAfterFirstRound", "0.8 of the noise std from round 2 on", _shrunk),
    Variant("clip-at-3S", f"{BROKEN}:ClipsAtThreeTimesTheBound", "clips to 3·S, noise and claim for S",
            lambda rounds, clients: 3.0),
    # the deployment's |P_t| (all N clients at q = 1): canaries count in no |P_t|
    Variant("noise-over-count", f"{BROKEN}:NoiseOverCountNotItsRoot", "upload noise std Sσ/|P_t|, not Sσ/√|P_t|",
            lambda rounds, clients: math.sqrt(clients)),
    Variant("one-client-unclipped", f"{BROKEN}:OneClientUnclippedAfterFirstRound",
            "one participant a round unclipped from round 2 on", None),
    # written as a user writes them: privatize rewritten with plain tensors, no hook of DP-FedAvg's
    Variant("user-written", f"{BROKEN}:UserWrittenHonest", "honest, privatize rewritten with plain tensors",
            lambda rounds, clients: 1.0),
    Variant("user-halved-noise", f"{BROKEN}:UserHalvedNoise", "the user's rewrite with half the noise std",
            lambda rounds, clients: 2.0),
    Variant("user-pairs-cancel", f"{BROKEN}:UserNoiseCancelledInPairs", "odd participants upload the previous one's "
            "noise negated: the sum carries none", None),
    Variant("user-noise-reused", f"{BROKEN}:UserNoiseReusedEveryRound", "one noise draw per client, reused every round",
            None),
    Variant("user-uniform-noise", f"{BROKEN}:UserUniformNoise", "uniform noise of the accounted variance", None),
    Variant("claims-absent-sampling", f"{BROKEN}:ClaimsSamplingItDoesNotDo", "accounted (and calibrated) at q = 0.25, "
            "every client every round", lambda rounds, clients: 1.0),  # its own σ at q = 1
)

#: the central-DP Gaussian defenses with a client-level claim (LDP-FL's per-weight local DP,
#: UDP-FL's record-level DP-SGD and AE-DPFL's votes are other kinds of claim, and are left out)
CENTRAL_GAUSSIAN = ("dp-fedavg", "dp-fedavg-blur", "dp-fedavg-lus", "dp-fedavg-blur-lus", "dp-fedsam", "dp-fedsam-topk",
                    "fed-smp-randk", "fed-smp-topk", "ddgauss", "fl-basic-dp", "fl-cs-dp", "fl-std-dp", "fl-top-dp", "nbafl")


@dataclass(frozen=True)
class Twin:
    """A family's defense with a bug, audited against the family's honest claim."""

    family: str
    label: str
    defense: str  # module:Class
    bug: str


FAMILIES = "tests.defenses.broken_families"
TWINS = (
    Twin("LUS", "blur-lus-halved-noise", f"{FAMILIES}:BlurLusHalvedNoise", "BLUR+LUS, half the noise std"),
    Twin("LUS", "lus-noise-halved-from-mid-run", f"{FAMILIES}:LusNoiseHalvedFromMidRun",
         "LUS, half the noise std from round ⌊T/2⌋ on"),
    Twin("LUS", "lus-user-rescaled-after-clip", f"{FAMILIES}:UserLusRescaledAfterClip",
         "LUS rewritten: the clipped update divided by the kept share"),
    Twin("masks", "randk-halved-noise", f"{FAMILIES}:RandKHalvedNoise", "rand-k, half the noise std"),
    Twin("masks", "randk-user-unbiased-after-clip", f"{FAMILIES}:UserRandKUnbiasedAfterClip",
         "rand-k rewritten: kept coordinates scaled by d/k after the clip"),
    Twin("masks", "topk-user-halved-noise", f"{FAMILIES}:UserTopKHalvedNoise", "top-k rewritten, half the noise std"),
    Twin("subset training", "fl-top-dp-user-halved-noise", f"{FAMILIES}:UserFLTopHalvedNoise",
         "FL-TOP-DP rewritten, half the noise std"),
    Twin("subset training", "fl-std-dp-user-halved-noise", f"{FAMILIES}:UserFLStdHalvedNoise",
         "FL-STD-DP rewritten, half the noise std"),
    Twin("subset training", "fl-std-dp-user-clip-skips-odd", f"{FAMILIES}:UserFLStdClipSkipsOddCoordinates",
         "FL-STD-DP rewritten, odd coordinates unclipped"),
    Twin("DP-FedAvg", "dp-fedavg-user-clip-skips-odd", f"{FAMILIES}:UserClipSkipsOddCoordinates",
         "DP-FedAvg rewritten, odd coordinates unclipped"),
    Twin("NbAFL", "nbafl-user-halved-noise", f"{FAMILIES}:UserNbAFLHalvedNoise", "NbAFL rewritten, half σ_U"),
    Twin("NbAFL", "nbafl-user-clip-skips-odd", f"{FAMILIES}:UserNbAFLClipSkipsOddCoordinates",
         "NbAFL rewritten, odd coordinates of the model unclipped"),
)


# ---------------------------------------------------------------------------- designs


def design_config(design: str, seed: int, defenses: list[dict[str, Any]]) -> dict[str, Any]:
    """The audit configuration (over the default audit) of one seed: ``defenses`` as config entries,
    the dirac-canaries audit alone, no diagnostics."""
    if design == "small":  # the end-to-end test's design, all three observers
        base: dict[str, Any] = {"partition": {"clients": 20}, "training": {"rounds": 10, "local_steps": 1}}
        attack: dict[str, Any] = {"name": "dirac-canaries", "params": {"coins": 20000}}
    elif design == "default":  # the default audit's training and its 10⁵ coins
        base, attack = {}, {"name": "dirac-canaries"}
    else:
        raise ValueError(f"design: {design!r}; allowed: small, default")
    return {"name": f"detection-{design}", "seed": seed, **base, "defenses": defenses,
            "membership": {"runs": 2}, "attacks": [attack], "diagnostics": {"enabled": False}}


def entry(variant: Variant, epsilons: Sequence[float]) -> dict[str, Any]:
    return {"name": variant.defense, "label": variant.label, "epsilons": [float(e) for e in epsilons]}


def run_audit(config: dict[str, Any], folder: Path) -> tuple[dict | None, str]:
    """``dpfl-audit run`` on ``config`` into ``folder``; (results.json, "") or (None, why it failed).
    A folder from an earlier call is resumed: its finished runs are reused."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "design.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    said = io.StringIO()
    # the command's summary and its one-line errors go to the buffer: the tables stay readable
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = cli_main(["run", str(path), "--out", str(folder / "out"), "--quiet"])
    if code != 0:
        return None, f"dpfl-audit run exited {code}: {' '.join(said.getvalue().split())[-400:]}"
    return json.loads((folder / "out" / "results.json").read_text(encoding="utf-8")), ""


# ---------------------------------------------------------------------------- one audit's figures


def _dirac_attacks(experiment: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in experiment.get("attacks", []) if str(a.get("attack", "")).startswith("dirac-canaries")]


def true_epsilon(variant: Variant, experiment: dict[str, Any], clients: int) -> float | None:
    """The variant's true ε at the experiment's calibrated σ by exact μ-GDP composition (Dong, Roth &
    Su 2022), μ = factor·√T/σ; only at full participation (q = 1), where a round is the plain
    Gaussian mechanism; None where it cannot be derived here."""
    training = experiment.get("training", {})
    sigma = experiment.get("params", {}).get("noise_multiplier")
    claim = experiment.get("claim") or {}
    if variant.mu_factor is None:
        return math.inf
    if not sigma or training.get("client_rate") != 1.0 or training.get("sampling") != "poisson" or not claim.get("delta"):
        return None
    rounds = int(training["rounds"])
    return float(gdp_epsilon(variant.mu_factor(rounds, clients) * math.sqrt(rounds) / sigma, float(claim["delta"])))


def audit_figures(experiment: dict[str, Any]) -> dict[str, Any]:
    """What one audit (one experiment of results.json) says: whether any Dirac canary figure is a
    VIOLATION and which observers gave one, the best rigorous released-model bound over the
    released claim, the power against 2ε and the most the design can certify (of the
    best-powered released bound), and why the audit did not run where it did not."""
    attacks = _dirac_attacks(experiment)
    skipped = [s["reason"] for s in experiment.get("skipped_attacks", [])
               if str(s.get("attack", "")).startswith("dirac-canaries")]
    violating = sorted({a["observation"] for a in attacks for v in a["verdicts"] if v["status"] == "violation"})
    # what caught it: an ε lower bound above the claim, or the uploads' test against the claimed mechanism
    caught = {kind: any(v["status"] == "violation" and v.get("kind") == kind for a in attacks for v in a["verdicts"])
              for kind in ("lower_bound", "conformance")}
    # a warning, not a test: a Gaussian-fit interval wholly above the claim (Andrew et al. 2024)
    fit_above = any(v["status"] == "estimate above claim" for a in attacks for v in a["verdicts"])
    bounds = [v for a in attacks if a.get("adversary") == RELEASED for v in a["verdicts"]
              if v.get("kind") == "lower_bound" and v.get("measured") is not None and math.isfinite(v["measured"])]
    best = max(bounds, key=lambda v: v["measured"], default=None)
    powered = max((v for v in bounds if v.get("power")), key=lambda v: v["power"].get("detection") or 0.0, default=None)
    claimed = best["claimed"] if best is not None else None
    return {
        "ran": bool(attacks),
        "skipped": skipped[0] if skipped and not attacks else "",
        "violation": bool(violating),
        "violating_observers": violating,
        "violation_by_bound": caught["lower_bound"],
        "violation_by_mechanism_test": caught["conformance"],
        "estimate_above_claim": fit_above,
        "best_released_lower_bound": best["measured"] if best is not None else None,
        "best_metric": best["metric"] if best is not None else None,
        "best_observer": next(a["observation"] for a in attacks if any(v is best for v in a["verdicts"]))
        if best is not None else None,
        "claimed": claimed,
        "ratio": best["measured"] / claimed if best is not None and claimed else None,
        "power_2eps": powered["power"].get("detection") if powered is not None else None,
        "tight_ratio": powered["power"]["tight_bound"] / powered["claimed"]
        if powered is not None and powered["power"].get("tight_bound") is not None and powered["claimed"] else None,
        "soundness": experiment.get("soundness"),
    }


def _label_of(experiment: dict[str, Any]) -> str:
    """The entry's label: the experiment's label without its " (ε=…)"."""
    label = str(experiment["label"])
    return label.rsplit(" (ε=", 1)[0] if experiment.get("target_epsilon") is not None else label


def seed_records(results: dict[str, Any], seed: int, variants: Iterable[Variant]) -> list[dict[str, Any]]:
    """One record per (variant, ε) audited in a seed's results.json."""
    by_label = {v.label: v for v in variants}
    clients = int(results.get("config", {}).get("partition", {}).get("clients", 20))
    out = []
    for experiment in results["experiments"]:
        variant = by_label.get(_label_of(experiment))
        if variant is None:
            continue
        truth = true_epsilon(variant, experiment, clients)
        out.append({"variant": variant.label, "defense": variant.defense, "epsilon": experiment["target_epsilon"],
                    "seed": seed, "status": experiment.get("status"), "true_epsilon": truth,
                    **audit_figures(experiment)})
    return out


# ---------------------------------------------------------------------------- cells and tables


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cells(records: list[dict[str, Any]], variants: Sequence[Variant]) -> list[dict[str, Any]]:
    """The matrix: per (variant, ε) the VIOLATION count and rate over the seeds whose audit ran,
    and the median (and range) of the best released ε_LB / ε; in the order of ``variants``, then ε."""
    out = []
    for variant in variants:
        for epsilon in sorted({r["epsilon"] for r in records if r["variant"] == variant.label}):
            mine = [r for r in records if r["variant"] == variant.label and r["epsilon"] == epsilon]
            ran = [r for r in mine if r["ran"]]
            ratios = [r["ratio"] for r in ran if r["ratio"] is not None]
            powers = [r["power_2eps"] for r in ran if r["power_2eps"] is not None]
            truths = [r["true_epsilon"] for r in mine if r["true_epsilon"] is not None]
            violations = sum(r["violation"] for r in ran)
            by_bound = sum(r.get("violation_by_bound", False) for r in ran)
            by_mechanism = sum(r.get("violation_by_mechanism_test", False) for r in ran)
            above = sum(r["estimate_above_claim"] for r in ran)
            out.append({
                "variant": variant.label, "defense": variant.defense, "bug": variant.bug, "epsilon": epsilon,
                "seeds": len(mine), "audits": len(ran), "violations": violations,
                "violation_rate": violations / len(ran) if ran else None,
                "violations_by_bound": by_bound, "violations_by_mechanism_test": by_mechanism,
                "estimates_above_claim": above,
                "median_ratio": _median(ratios), "min_ratio": min(ratios, default=None), "max_ratio": max(ratios, default=None),
                "median_power_2eps": _median(powers),
                # σ is calibrated to the claim alone, so every seed has the same true ε
                "true_epsilon": truths[0] if truths else None,
                "violating_observers": {o: sum(o in r["violating_observers"] for r in ran)
                                        for o in sorted({o for r in ran for o in r["violating_observers"]})},
            })
    return out


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    return "inf" if math.isinf(value) else f"{value:.{digits}g}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The matrix as text: one line per cell."""
    head = ("variant", "ε", "true ε", "VIOLATION", "by ε_LB", "by uploads test", "ε_LB/ε median [range]", "power 2ε",
            "fit above ε", "violating observers")
    lines = []
    for c in rows:
        ratio = "–" if c["median_ratio"] is None else \
            f"{c['median_ratio']:.3f} [{c['min_ratio']:.3f}, {c['max_ratio']:.3f}]"
        violations = f"{c['violations']}/{c['audits']} ({_percent(c['violation_rate'])})"
        observers = ", ".join(f"{o} {n}" for o, n in c["violating_observers"].items()) or "–"
        lines.append((c["variant"], f"{c['epsilon']:g}", _number(c["true_epsilon"]), violations,
                      f"{c['violations_by_bound']}/{c['audits']}", f"{c['violations_by_mechanism_test']}/{c['audits']}", ratio,
                      _percent(c["median_power_2eps"]), f"{c['estimates_above_claim']}/{c['audits']}", observers))
    return _columns(head, lines)


def format_defense_rows(rows: list[dict[str, Any]]) -> str:
    """The defense rows as text: the Dirac audit's figures where it ran, else why not."""
    head = ("defense", "ε", "Dirac audit", "ε_LB/ε", "VIOLATION", "power 2ε", "tight ε_LB/ε", "reason")
    lines = []
    for r in rows:
        state = "error" if r.get("error") else ("ran" if r["ran"] else "not run")
        lines.append((r["defense"], f"{r['epsilon']:g}", state, _number(r.get("ratio")),
                      "–" if not r["ran"] else ("yes" if r["violation"] else "no"), _percent(r.get("power_2eps")),
                      _number(r.get("tight_ratio")), r.get("error") or r.get("skipped") or ""))
    return _columns(head, lines)


def _columns(head: Sequence[str], lines: list[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(head, *lines)]
    widths[-1] = 0  # the last column is free text: no padding
    return "\n".join("  ".join(f"{str(x):<{w}}" for x, w in zip(line, widths)).rstrip() for line in (head, *lines))


# ---------------------------------------------------------------------------- the parts


def run_matrix(design: str, seeds: Sequence[int], epsilons: Sequence[float], variants: Sequence[Variant],
               work: Path, log: Callable[[str], None], tag: str = "matrix") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All variants × ε of one seed in one configuration (each experiment is its own Holm family,
    so grouping them changes no verdict, and a seed's membership design is shared); returns the
    records and the seeds that failed with why."""
    records, failures = [], []
    for seed in seeds:
        started = time.perf_counter()
        results, error = run_audit(design_config(design, seed, [entry(v, epsilons) for v in variants]),
                                   work / f"{design}-{tag}-seed{seed}")
        if results is None:
            failures.append({"seed": seed, "error": error})
            log(f"seed {seed}: {error}")
            continue
        records.extend(seed_records(results, seed, variants))
        log(f"seed {seed}: {len(variants) * len(epsilons)} audits in {time.perf_counter() - started:.0f} s")
    return records, failures


def run_alone(design: str, seed: int, label: str, defense: str, epsilon: float, work: Path) -> dict[str, Any]:
    """One defense (a registry name or module:Class) at one ε in a configuration of its own (the
    design's neighbouring relation follows its claim, and one defense's refusal of the
    configuration stops no other): its audit figures, or the error that stopped it."""
    variant = Variant(label, defense, "", lambda rounds, clients: 1.0)
    results, error = run_audit(design_config(design, seed, [entry(variant, [epsilon])]),
                               work / f"{design}-alone-{label}-eps{epsilon:g}-seed{seed}")
    if results is None:
        return {"defense": label, "epsilon": epsilon, "seed": seed, "ran": False, "error": error}
    experiment = results["experiments"][0]
    return {"defense": label, "epsilon": epsilon, "seed": seed, "status": experiment.get("status"),
            **audit_figures(experiment)}


def run_defense_rows(design: str, seeds: Sequence[int], defenses: Sequence[str], work: Path,
                     log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each central-DP Gaussian defense, honest, at ε = 4, per seed."""
    rows = []
    for seed in seeds:
        for name in defenses:
            started = time.perf_counter()
            rows.append(run_alone(design, seed, name, name, DEFENSE_EPSILON, work))
            log(f"{name} seed {seed}: {time.perf_counter() - started:.0f} s")
    return rows


def run_twins(design: str, seeds: Sequence[int], epsilons: Sequence[float], twins: Sequence[Twin], work: Path,
              log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each family's broken twins at each ε, per seed."""
    rows = []
    for seed in seeds:
        for twin in twins:
            for epsilon in epsilons:
                started = time.perf_counter()
                row = run_alone(design, seed, twin.label, twin.defense, float(epsilon), work)
                rows.append({**row, "family": twin.family, "bug": twin.bug})
                log(f"{twin.label} ε={epsilon:g} seed {seed}: {time.perf_counter() - started:.0f} s")
    return rows


def summarise_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (defense or twin, ε) over the seeds: audits run, VIOLATIONs (by a bound, by the uploads
    test), the median and range of the best released ε_LB / ε, the median power against 2ε, and
    why an audit did not run."""
    out = []
    for key in dict.fromkeys((r["defense"], r["epsilon"]) for r in rows):
        mine = [r for r in rows if (r["defense"], r["epsilon"]) == key]
        ran = [r for r in mine if r.get("ran")]
        ratios = [r["ratio"] for r in ran if r.get("ratio") is not None]
        powers = [r["power_2eps"] for r in ran if r.get("power_2eps") is not None]
        out.append({"defense": key[0], "epsilon": key[1], "family": mine[0].get("family", ""), "seeds": len(mine),
                    "audits": len(ran), "violations": sum(bool(r["violation"]) for r in ran),
                    "violations_by_bound": sum(bool(r.get("violation_by_bound")) for r in ran),
                    "violations_by_mechanism_test": sum(bool(r.get("violation_by_mechanism_test")) for r in ran),
                    "median_ratio": _median(ratios), "min_ratio": min(ratios, default=None),
                    "max_ratio": max(ratios, default=None), "median_power_2eps": _median(powers),
                    "reason": next((r.get("error") or r.get("skipped") for r in mine if not r.get("ran")), "") or ""})
    return out


def format_summary(rows: list[dict[str, Any]]) -> str:
    """The defense or twin rows as text, one line per (defense, ε)."""
    head = ("defense", "ε", "audits", "VIOLATION", "by ε_LB", "by uploads test", "ε_LB/ε median [range]", "power 2ε",
            "why not run")
    lines = []
    for r in rows:
        ratio = "–" if r["median_ratio"] is None else \
            f"{r['median_ratio']:.3f} [{r['min_ratio']:.3f}, {r['max_ratio']:.3f}]"
        lines.append((r["defense"], f"{r['epsilon']:g}", f"{r['audits']}/{r['seeds']}", f"{r['violations']}/{r['audits']}",
                      f"{r['violations_by_bound']}/{r['audits']}", f"{r['violations_by_mechanism_test']}/{r['audits']}",
                      ratio, _percent(r["median_power_2eps"]), r["reason"]))
    return _columns(head, lines)


def _strict(value: Any) -> Any:
    """``value`` with every infinite float as the string "inf" (strict JSON has no Infinity)."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", choices=("small", "default"), default="small")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per cell of the matrix (0, 1, …)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (to extend an earlier run)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS), help="claimed ε of the matrix")
    parser.add_argument("--variants", nargs="+", choices=[v.label for v in VARIANTS], default=None,
                        help="broken variants of the matrix (default: all); the honest dp-fedavg is always in")
    parser.add_argument("--skip-matrix", action="store_true", help="leave out the matrix")
    parser.add_argument("--skip-defenses", action="store_true", help="leave out the rows of the central-DP Gaussian defenses")
    parser.add_argument("--twins", nargs="*", choices=[t.label for t in TWINS], default=None,
                        help="the families' broken twins (alone: all) at each --epsilons over the seeds")
    parser.add_argument("--defenses", nargs="+", default=list(CENTRAL_GAUSSIAN), help="the defense rows (registry names)")
    parser.add_argument("--honest-seeds", type=int, nargs="?", const=20, default=0, metavar="N",
                        help="only the honest dp-fedavg on the small design over N seeds (alone: 20; the target "
                             "≤ 5 %% false violations wants ≥ 100), at each --epsilons")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON to write (default benchmarks/results/detection-<design>.json, or detection-honest.json)")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the audits' folders here (a rerun resumes them); default: a temporary folder")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared machine more threads run slower, and the figures "
                             "are per thread count)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.honest_seeds < 0:
        parser.error("--seeds must be ≥ 1 and --honest-seeds ≥ 0")
    torch.set_num_threads(args.threads)
    honest_mode = args.honest_seeds > 0
    design = "small" if honest_mode else args.design
    out = args.out or ROOT / "benchmarks" / "results" / (f"detection-{'honest' if honest_mode else design}.json")
    variants = [HONEST] if honest_mode else \
        [HONEST, *[v for v in VARIANTS if args.variants is None or v.label in args.variants]]
    first = args.first_seed
    seeds = list(range(first, first + (args.honest_seeds if honest_mode else args.seeds)))

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "detection", "design": design, "mode": "honest" if honest_mode else "matrix",
        "command": ["benchmarks/detection.py", *(argv if argv is not None else sys.argv[1:])],
        "torch_threads": args.threads,
        "config": design_config(design, seeds[0], [entry(v, args.epsilons) for v in variants]),
        "seeds": seeds, "epsilons": [float(e) for e in args.epsilons],
        "variants": [{"label": v.label, "defense": v.defense, "bug": v.bug} for v in variants],
    }
    with tempfile.TemporaryDirectory(prefix="dpfl-detection-") as scratch:
        work = args.work or Path(scratch)
        if honest_mode or not args.skip_matrix:
            records, failures = run_matrix(design, seeds, args.epsilons, variants, work, log,
                                           "honest" if honest_mode else "matrix")
            report.update(cells=cells(records, variants), audits=records, failures=failures)
            print(format_table(report["cells"]), flush=True)
        if not honest_mode and not args.skip_defenses:
            rows = run_defense_rows(design, seeds, args.defenses, work, log)
            report["defense_rows"] = rows
            report["defense_summary"] = summarise_rows(rows)
            print(flush=True)
            print(format_defense_rows(rows), flush=True)  # seed by seed, then over the seeds
            print(flush=True)
            print(format_summary(report["defense_summary"]), flush=True)
        if not honest_mode and args.twins is not None:
            twins = [t for t in TWINS if not args.twins or t.label in args.twins]
            rows = run_twins(design, seeds, args.epsilons, twins, work, log)
            report["twin_rows"] = rows
            report["twin_summary"] = summarise_rows(rows)
            print(flush=True)
            print(format_summary(report["twin_summary"]), flush=True)
    log(f"({time.perf_counter() - started:.0f} s)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_strict(report), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
