"""Audit a Flower deployment's central-DP claim: canary clients, the server's view, our claim.

Flower's DP-FedAvg wrappers — ``DifferentialPrivacyServerSideFixedClipping`` and
``DifferentialPrivacyClientSideFixedClipping`` (``flwr.server.strategy``; McMahan, Ramage,
Talwar, Zhang 2018, "Learning Differentially Private Recurrent Language Models", Alg. 1) — clip
every sampled client's model update to L2 norm S, let the inner strategy (``FedAvg``) average
them, and add N(0, (σ·S/m)²) to every coordinate of the average, m being ``num_sampled_clients``
(``flwr.supercore.differential_privacy.compute_stdv``). Flower states σ and S but no ε. This
module turns such a deployment into an audited system:

1. **Canary clients** (:func:`audit.flower_canaries.canary_mod`, a client-side Flower *Mod*): the
   nodes named in :class:`audit.flower_canaries.CanaryClients` never train. Canary i is *inserted*
   with probability ½ (its coin from the seeded stream ``(seed, "flower-canaries", "inserted")``);
   when sampled, an inserted canary uploads the received global model plus c·u_i, u_i a fixed random unit direction of the
   parameter space (stream ``(seed, "flower-canaries", "direction", i)``) and c = ``scale``·S with
   ``scale`` > 1, so that Flower's clipping scales the update to exactly S·u_i. A held-out canary
   is sampled and counted like any client too — so the sampling and the average's denominator are
   the same in both worlds — but uploads a tiny update η·S·v_i (η = 10⁻³, v_i a unit direction
   independent of u_i). The neutral upload would be zero (the *zero-out* neighbour of Kairouz et
   al. 2021, "Practical and private (deep) learning without sampling or shuffling", §2), but
   Flower's clip divides by the update's norm and fails on a zero update (flwr 1.42,
   ``clip_inputs_inplace``: ZeroDivisionError). So the two runs a coin chooses between differ in
   one client's data, replaced by other data: the *replace-one* relation — exactly the relation
   Flower's fixed-size sampling is accounted under (one step), and two add/remove steps (group
   privacy, :mod:`reports.soundness`) under an add/remove claim. The held-out uploads only add a
   negligible vector, independent of every u_i, to the sum. Canary clients
   (Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar 2024, "One-shot Empirical Privacy
   Estimation for Federated Learning", §3 Alg. 1) are the auditor's own nodes, added to the
   population N the claim is accounted over.
2. **The server's view** (:class:`audit.flower_view.FlowerRecorder`, a strategy wrapper around Flower's DP
   wrapper): the global model before every round (the first is the initial model) and after
   every ``aggregate_fit``, the sampled clients, the clients available and the weights FedAvg
   averaged with. It also taps the inner strategy, so that the clipped average *before* Flower's
   noise is kept too: the difference is the noise Flower added, whose std can be set beside what
   the claim assumes (:meth:`audit.flower_view.FlowerView.noise_multipliers`).
3. **The claim** (:func:`flower_claim`): T rounds of the Gaussian mechanism with multiplier σ on
   a fixed-size sample of m of N clients without replacement (Flower's ``ClientManager.sample``:
   ``random.sample`` of the available clients), accounted by *our* accountant
   (:func:`defenses.privacy.claims.gaussian_adversaries`, RDP of dp-accounting): the headline is the
   released-models figure, client level, replace-one neighbours (the relation dp-accounting
   analyses sampling without replacement under; Wang, Balle, Kasiviswanathan 2019). The server
   is not covered: it receives every client's upload in the clear before the noise is added.
4. **The audit** (:func:`audit_flower`): the one-run canary statistics of Andrew et al. 2024 on
   the recorded view — the final model's cos(u_i, w_T − w_0) and, over all iterates,
   max_t cos(u_i, w_t − w_{t−1}) (§5, "all model deltas") — each turned into ε lower bounds
   (Steinke, Nasr, Jagielski 2023; Mahloujifar, Melis, Chaudhuri 2024) and a Gaussian-fit
   estimate by :func:`attacks.canaries.canary_audit.canary_result`, then into the results document of
   :mod:`audit.external` (results.json, results.csv, report.html) with verdicts and power.

**Uniform weights.** Flower's noise std σ·S/m protects a client whose share of FedAvg's weighted
average is at most 1/m, i.e. every sampled client reports the same ``num_examples``; a client
with a larger share moves the average by more than S/m. The recorder keeps each round's largest
share and the claim's notes say when it exceeded 1/m (the claim then does not follow from the
noise). Canary clients report ``CanaryClients.num_examples`` (1 by default).

**Reproducibility.** Flower draws its DP noise from numpy's global generator
(``np.random.normal``) and samples clients with Python's global ``random``; neither is seeded by
Flower. ``FlowerRecorder(seed=...)`` seeds both from the seeded streams
``(seed, "flower", "sampling", t)`` and ``(seed, "flower", "noise", t)`` at the start of round
t's ``configure_fit`` and ``aggregate_fit`` (the server runs in one thread of the process that
calls ``run_simulation``), so the noise of a run is repeatable. Which partitions a seeded sample
picks is not: Flower's simulation gives nodes random ids (``secrets``) and its client manager
lists them in an order those ids set. Seed only an audit deployment: noise drawn from a seed
others know protects nothing.

Supported: Flower's legacy strategy API (``flwr.server.strategy``, ``ServerApp(server_fn=...)``)
with the two fixed-clipping wrappers. With client-side clipping list the canary Mod *after*
``fixedclipping_mod`` (``mods=[fixedclipping_mod, canary_mod(...)]``) so that Flower's own
clipping sees the canary's upload. Adaptive clipping is not supported (its clip is a noisy,
data-dependent quantity the Gaussian claim here does not describe).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.audit_power import power_caveat
from audit.core.errors import UserInputError, check_choice
from audit.core.vocabulary import EpsilonKind, Observer, Relation, Unit
from audit.flower_canaries import CanaryClients
from audit.flower_view import FlowerRecorder, FlowerView

# The accountant, attacks and reports (scipy, scikit-learn, matplotlib: seconds per process) are
# imported where the audit needs them: client processes import the canary Mod through this module.
if TYPE_CHECKING:
    from attacks.attack_result import AttackResult
    from defenses.privacy.claims import PrivacyClaim
    from reports.document import Results

#: the attack's name in the results (its two observations: attacks.canaries.update_canaries.OBSERVATIONS)
ATTACK = "flower-client-canaries"
#: the neighbouring relation of the canary design: a held-out canary takes part with another (tiny) update
DESIGN_RELATION = Relation.REPLACE_ONE


# --------------------------------------------------------------------------- the claim


def flower_claim(noise_multiplier: float, sample_size: int, population: int, rounds: int, delta: float,
                 sampling: str = "fixed", accountant: str = "rdp", conversion: str = "improved",
                 notes: str = "") -> PrivacyClaim:
    """Client-level (ε, δ) of Flower's central DP by our accountant: T rounds of the Gaussian
    mechanism with multiplier σ (noise std σ·S on the clipped sum of the sampled clients) on m of N
    clients per round.

    ``sampling`` "fixed" is what Flower's ``ClientManager.sample`` does (m of N without
    replacement), accounted under replace-one neighbours with sensitivity 2S (Wang, Balle,
    Kasiviswanathan 2019, via dp-accounting); "poisson" is for a strategy that samples each client
    independently with probability m/N (add/remove). The headline figure is the released models'
    (amplification by sampling); the server is not covered — it sees each upload before the noise.
    """
    from defenses.privacy.accounting import ACCOUNTANTS, CONVERSIONS, SAMPLINGS, GaussianSchedule
    from defenses.privacy.claims import GaussianRounds, PrivacyClaim, gaussian_adversaries

    check_choice("sampling", sampling, SAMPLINGS)
    check_choice("accountant", accountant, ACCOUNTANTS)
    check_choice("conversion", conversion, CONVERSIONS)
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise UserInputError(f"noise_multiplier: {noise_multiplier} is not allowed; allowed: a finite number > 0 "
                             "(σ = 0 releases the clipped average in the clear: no claim)")
    if not (1 <= sample_size <= population):
        raise UserInputError(f"sample_size: {sample_size} is not allowed; allowed: 1 ≤ m ≤ N = {population}")
    if rounds < 1:
        raise UserInputError(f"rounds: {rounds} is not allowed; allowed: an integer ≥ 1")
    if not (0.0 < delta < 1.0):
        raise UserInputError(f"delta: {delta} is not allowed; allowed: a number in (0, 1)")
    rate = float(sample_size) / float(population)
    noise = GaussianRounds(
        aggregate=float(noise_multiplier), upload=None, server_sees=None, rounds=int(rounds), rate=rate,
        sampling=sampling, population=int(population),
        server_note="Flower's central DP adds the noise after the server has received every sampled client's update "
                    "in the clear",
        why_not="Flower's central DP adds no noise to an upload")
    adversaries = gaussian_adversaries(noise, float(delta), accountant, conversion)
    released = adversaries[0]
    if released.epsilon is None:  # σ > 0 always gives a released figure
        raise RuntimeError(f"no released-models figure for σ = {noise_multiplier}: {released.notes}")
    schedule = GaussianSchedule(float(noise_multiplier), rate, int(rounds), sampling, int(population))
    mechanism = (f"Flower central DP (fixed clipping): clipped average + N(0, (σ·S/m)²), σ = {noise_multiplier:.6g}, "
                 f"m = {sample_size} of N = {population} clients per round, T = {rounds}; {schedule.describe()}")
    return PrivacyClaim(
        float(released.epsilon), float(delta), Unit.CLIENT, released.accountant, mechanism,
        notes or "claim computed by dpfl-audit's accountant from Flower's noise multiplier and sampling "
                 "(Flower states σ and S, no ε)",
        relation=released.relation, adversary=Observer.RELEASED, adversaries=adversaries)


def claim_of_view(view: FlowerView, delta: float, noise_multiplier: float | None = None,
                  accountant: str = "rdp", conversion: str = "improved") -> PrivacyClaim:
    """:func:`flower_claim` for a recorded run: σ (Flower's own unless ``noise_multiplier`` says
    otherwise — the σ an owner *states*), m, N and T as the server ran them. Where the run departs
    from what the accounting assumes (replies ≠ m, a changing population, a weight share above
    1/m) the claim's notes say so."""
    sigma = view.noise_multiplier if noise_multiplier is None else noise_multiplier
    population = int(view.available.max())
    caveats = []
    if (view.sampled != view.num_sampled_clients).any() or (view.results != view.num_sampled_clients).any():
        caveats.append(f"rounds with sampled/aggregated clients {view.sampled.tolist()}/{view.results.tolist()} ≠ "
                       f"num_sampled_clients m = {view.num_sampled_clients} (Flower's noise std σ·S/m assumes m)")
    if (view.available != population).any():
        caveats.append(f"available clients changed between rounds ({view.available.tolist()}); N = {population} used")
    if (view.max_share > 1.0 / view.num_sampled_clients * (1 + 1e-9)).any():
        caveats.append(f"a client's FedAvg weight share reached {view.max_share.max():.4g} > 1/m: its update moves the "
                       "average by more than S/m and the claim does not follow from Flower's noise")
    stated = "" if noise_multiplier is None else f" (stated σ = {noise_multiplier:g}; Flower ran σ = {view.noise_multiplier:g})"
    notes = ("claim computed by dpfl-audit's accountant from Flower's noise multiplier and sampling (Flower states σ "
             "and S, no ε)" + stated + "".join(f"; {c}" for c in caveats))
    return flower_claim(sigma, view.num_sampled_clients, population, view.rounds, delta, "fixed", accountant,
                        conversion, notes)


# --------------------------------------------------------------------------- the audit


def canary_statistics(view: FlowerView, canaries: CanaryClients) -> dict[str, np.ndarray]:
    """Per canary, Andrew et al. 2024's statistics on the recorded models: the final model's
    cos(u_i, w_T − w_0) (§3) and all iterates' max_t cos(u_i, w_t − w_{t−1}) (§5)."""
    import torch

    from attacks.canaries.update_canaries import cosines

    directions = torch.from_numpy(canaries.directions(view.dim))
    models = np.concatenate([view.initial[None, :], view.iterates])
    final = cosines(directions, torch.from_numpy(models[-1:] - models[0]))[:, 0]
    every = cosines(directions, torch.from_numpy(np.diff(models, axis=0))).max(axis=1)
    return {"final-model": final, "all-iterates": every}


def canary_results(view: FlowerView, canaries: CanaryClients, claim: PrivacyClaim, delta: float
                   ) -> list[AttackResult]:
    """The one-run canary audit's results, one per observation, at the δ the claim allows per client
    under the replace-one design (:func:`reports.soundness.measurement_delta`)."""
    from attacks.canaries.canary_audit import canary_result
    from attacks.canaries.update_canaries import OBSERVATIONS
    from reports.soundness import measurement_delta

    at = measurement_delta(claim, Unit.CLIENT, delta, DESIGN_RELATION)
    inserted = canaries.inserted
    described = (f"{canaries.count} canary clients (Flower Mod), {int(inserted.sum())} inserted, each uploading "
                 f"{canaries.scale:g}·S·u_i (clipped to S·u_i); held out: "
                 f"{canaries.held_out_norm:g}·S·v_i, v_i independent of u_i (replace-one design)")
    # the released models' canaries meet Flower's sampling of m of N clients: outside the power model
    caveat = power_caveat(view.num_sampled_clients / max(int(view.available.max()), 1), composed=" in every round")
    out = []
    for key, statistics in canary_statistics(view, canaries).items():
        result = canary_result(ATTACK, Unit.CLIENT, statistics[None, :], inserted[None, :], at, canaries.seed,
                               f"{described}; observed: {OBSERVATIONS[key]}", unmodelled_power=caveat)
        result.variant = "" if key == "final-model" else key
        result.observation = OBSERVATIONS[key]
        result.relation = DESIGN_RELATION
        out.append(result)
    return out


def audit_flower(recorded: FlowerRecorder | FlowerView, canaries: CanaryClients, delta: float = 1e-5,
                 claim: PrivacyClaim | None = None, out: str | Path | None = None, name: str = "flower",
                 dataset: str = "external", model: str = "external", test_accuracy: Sequence[float] = (),
                 config: dict[str, Any] | None = None) -> Results:
    """Audit a finished Flower run: the claim (by default :func:`claim_of_view` — Flower's σ, m, N,
    T through our accountant), the canary audit on the recorded global models, and the results
    document (written under ``out`` when given: results.json, results.csv, report.html)."""
    from audit.external import System, audit_external

    view = recorded.view() if isinstance(recorded, FlowerRecorder) else recorded
    if claim is None:
        claim = claim_of_view(view, delta)
    if view.available.max() < canaries.count:
        raise UserInputError(f"canaries.ids: {canaries.count} canaries but only {int(view.available.max())} clients "
                             "were available; allowed: canary node ids among the run's nodes")
    results = canary_results(view, canaries, claim, delta)
    measured = view.noise_multipliers()
    noise_note = ("" if measured is None else
                  f"; noise multiplier measured on the recorded aggregates: {', '.join(f'{x:.4g}' for x in measured)}")
    population = int(view.available.max())
    system = System(
        name=name, dataset=dataset, model=model, model_parameters=view.dim, clients=population, runs=1, unit="client",
        description=(f"a Flower run: {view.wrapper}({view.inner}), σ = {view.noise_multiplier:g}, S = "
                     f"{view.clipping_norm:g}, m = {view.num_sampled_clients} of N = {population} clients per round, "
                     f"T = {view.rounds}; {canaries.count} of the N are canary clients (a client Mod){noise_note}"),
        source="Flower simulation" if dataset == "external" else dataset,
        params={"noise_multiplier": view.noise_multiplier, "clipping_norm": view.clipping_norm,
                "num_sampled_clients": view.num_sampled_clients, "population": population, "rounds": view.rounds,
                "canaries": canaries.count,
                **({"measured_noise_multiplier": [float(x) for x in measured]} if measured is not None else {})},
        server_view="the global model after every round (FlowerRecorder)", test_accuracy=test_accuracy,
        seed=canaries.seed)
    return audit_external(system, claim, results, out, config)


def summary(results: Results) -> dict[str, Any]:
    """Claimed ε, the ε lower bounds per observation and the verdict of an :func:`audit_flower` document."""
    experiment = results.experiments[0]
    bounds = {}
    for record in experiment.attacks:
        for metric, estimate in record.metrics.items():
            if record.epsilon_kind.get(metric) == EpsilonKind.LOWER_BOUND:
                bounds[f"{record.observation}: {metric}"] = estimate.value
    return {"claimed_epsilon": experiment.claim.epsilon if experiment.claim.is_private else None,
            "delta": experiment.claim.delta, "relation": experiment.claim.relation,
            "epsilon_lower_bounds": bounds, "verdict": experiment.soundness, "verdict_text": experiment.soundness_text}
