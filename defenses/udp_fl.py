"""UDP-FL: Feng, Mohammady, Hong, Yan, Kundu, Wang, Hong, "Universally Harmonizing Differential
Privacy Mechanisms for Federated Learning" (arXiv 2407.14710; §3.2–3.3, §4.4).

Each participating client trains with DP-SGD (:mod:`defenses.blocks.dp_sgd`): Poisson batches at rate q,
per-example clipping to C, and i.i.d. noise from the chosen mechanism — Gaussian (then UDP-FL is
DP-SGD in FedAvg), Laplace or Staircase — on every coordinate; the server runs FedAvg. The noise
parameter of each mechanism comes from the Harmonizer (:mod:`defenses.blocks.harmonizer`) for the
target (ε, δ) over all of a client's local steps: rounds × ⌈E/q⌉ (no credit for client sampling).

The guarantee is record-level, for each client's records (add/remove one record; the Poisson
batches are drawn by the client, so the amplification holds against every observer, the server
included). The paper accounts the Laplace and Staircase noise with one-dimensional RDP curves
although the noise is added to every coordinate of a d-dimensional ℓ2-clipped gradient: sound for
the Gaussian only (our finding; ``dpfl-audit audit-mechanism`` shows the violation). The
claim's headline is therefore always the ``sound`` figure; the paper's ``paper_1d`` figure stays
beside it as a labelled alternative. ``accounting`` chooses what calibration (``epsilons``) aims
at: ``sound`` (default: the claim meets the target) or ``paper_1d`` (the paper's noise, whose
sound ε is then larger than the target). The Staircase has no finite sound bound under ℓ2
clipping (no claim); ``clip_norm: l1`` gives it one (a poor one).

Options: ``shuffle`` (§4.4: the server receives the uploads in random order without identities;
FedAvg is unchanged; no amplification is credited because the uploads are not ε0-LDP reports);
``client_epsilons`` (§3.3: clients in groups with their own ε, each harmonized separately, plus the
penalty λ_k(w − w_max) towards the largest-ε clients' last local model,
λ_k = penalty·(ε_max − ε_k)/ε_max — the paper's formula is not legible in the text we used; this
one is our choice).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Observer, Relation, Unit
from defenses.base import DEFENSES, AuditHooks, Defense, PrivacyClaim
from defenses.blocks.dp_sgd import DPSGDObjective, clip_and_sum
from defenses.blocks.harmonizer import epsilon as accounted_epsilon
from defenses.blocks.harmonizer import harmonize
from defenses.blocks.local_training import LocalObjective
from defenses.blocks.mechanisms import Mechanism, make_mechanism
from defenses.blocks.record_gradient_canaries import ClaimedStep
from defenses.blocks.sparsify import exact_fraction
from defenses.federated.engine import FederatedEngine
from defenses.federated.release_probe import ReleaseProbe
from defenses.federated.training_job import NO_STATE, DefenseState, RoundContext, TrainingConfig
from defenses.privacy.claims import AdversaryClaim, server_notes

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class UDPFLParams:
    mechanism: Literal["gaussian", "laplace", "staircase"] = field(default="gaussian", metadata={"help": "per-coordinate noise"})
    accounting: Literal["paper_1d", "sound"] = field(
        default="sound", metadata={"help": "what 'epsilons' calibrates: a bound valid for d-dim noise (sound) or the paper's "
                                           "1-D accounting; the claim's headline is always the sound ε"})
    noise: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                                "help": "z (gaussian), λ (laplace) or ε (staircase); set by the "
                                                        "Harmonizer from 'epsilons'"})
    clip: float = field(default=2.0,
                        metadata={"min": 0.0, "min_exclusive": True, "help": "C: per-example clip (public code: 2 on MNIST)"})
    clip_norm: Literal["l2", "l1"] = field(default="l2", metadata={"help": "norm of the per-example clip"})
    sample_rate: float = field(default=0.01, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True,
                                                       "help": "q: Poisson rate of records per local step; "
                                                               "⌈E/q⌉ steps per round"})
    shuffle: bool = field(default=False, metadata={"help": "the server gets uploads in random order, without identities"})
    client_epsilons: list[float] | None = field(default=None, metadata={"min": 0.0, "min_exclusive": True,
                                                                        "help": "heterogeneous ε: client i gets "
                                                                                "client_epsilons[i mod k]"})
    penalty: float = field(default=0.01, metadata={"min": 0.0, "help": "scale of the heterogeneous-ε penalty"})


@DEFENSES.register
class UDPFL(Defense):
    name = "udp-fl"
    summary = "DP-SGD clients with Gaussian, Laplace or Staircase noise harmonized by RDP; FedAvg server"
    reference = "Feng et al. 2024, Universally Harmonizing Differential Privacy Mechanisms for Federated Learning"
    Params = UDPFLParams
    private = True

    # ---------------------------------------------------------------- accounting

    def steps_per_round(self, training: TrainingConfig) -> int:
        return math.ceil(training.local_steps / exact_fraction(self.params.sample_rate))  # ⌈E/q⌉, exactly

    def total_steps(self, training: TrainingConfig, rounds: int | None = None) -> int:
        return (training.rounds if rounds is None else rounds) * self.steps_per_round(training)

    def mechanism(self) -> Mechanism:
        return make_mechanism(self.params.mechanism, self.params.noise)

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.local_unit != "epochs":
            raise UserInputError("training.local_unit: udp-fl counts local work in epochs of Poisson batches; use 'epochs'")

    def calibrate(self, target_epsilon, delta, training, num_clients, accounting) -> UDPFL:
        if self.params.client_epsilons:
            raise UserInputError("defenses: udp-fl with client_epsilons sets each group's ε itself; remove 'epsilons'")
        mechanism = harmonize(self.params.mechanism, target_epsilon, delta, self.params.sample_rate, self.total_steps(training),
                              self.params.accounting, self.params.clip_norm, accounting.conversion)
        return self.with_params(noise=mechanism.parameter)

    def _epsilons(self, mechanism: Mechanism, steps: int, delta: float, conversion: str) -> dict[str, float]:
        return {mode: accounted_epsilon(mechanism, self.params.sample_rate, steps, delta, mode, self.params.clip_norm, conversion)
                for mode in ("paper_1d", "sound")}

    def group_mechanism(self, group_epsilon: float, training: TrainingConfig, delta: float, conversion: str) -> Mechanism:
        """The harmonized noise of the clients whose ε is ``group_epsilon`` (heterogeneous ε), for the
        run's δ and conversion: it depends on every one of them, not on ε alone."""
        return _harmonized(self.params.mechanism, group_epsilon, delta, self.params.sample_rate, self.total_steps(training),
                           self.params.accounting, self.params.clip_norm, conversion)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state: DefenseState = NO_STATE) -> PrivacyClaim:
        steps = self.total_steps(training, rounds)
        if self.params.client_epsilons:
            worst = max(self.params.client_epsilons)
            mechanism = self.group_mechanism(worst, training, delta, accounting.conversion)
        else:
            mechanism = self.mechanism()
        both = self._epsilons(mechanism, steps, delta, accounting.conversion)
        headline = both["sound"]
        holds = both["sound"] <= both["paper_1d"] * (1 + 1e-6)
        sound_text = f"ε = {both['sound']:.4g}" if math.isfinite(both["sound"]) else "none (no finite bound)"
        coordinates = self.layout.dim if self.layout else "d"
        verdict = ("the paper's 1-D figure is sound here" if holds else
                   f"the paper's 1-D figure ε = {both['paper_1d']:.4g} does NOT hold for noise on {coordinates} "
                   f"coordinates of an {self.params.clip_norm}-clipped gradient; the sound bound is {sound_text}")
        mechanism_text = (f"DP-SGD with {mechanism!r} noise per coordinate (sensitivity C = {self.params.clip:g}, "
                          f"{self.params.clip_norm} per-example clip), Poisson batches q = {self.params.sample_rate:g}, "
                          f"{steps} local steps per client ({self.steps_per_round(training)} per round, all rounds counted)")
        notes = [f"record-level for each client's records; headline: the sound accounting (calibrated for: "
                 f"{self.params.accounting})", verdict]
        if self.params.client_epsilons:
            notes.append("heterogeneous ε: client i uses client_epsilons[i mod k] = " +
                         ", ".join(f"{e:g}" for e in self.params.client_epsilons)
                         + "; the claim is the weakest group's")
        if self.params.shuffle:
            notes.append("shuffler on: uploads reach the server without identities; no amplification is credited "
                         "(the uploads are not the ε0-LDP reports its bounds need)")
        method = "sampled Gaussian" if self.params.mechanism == "gaussian" else "RDP curves + Zhu–Wang subsampling"
        label = f"sound ({method}), {accounting.conversion} conversion"
        finite = math.isfinite(headline)
        gaussian = self.params.mechanism == "gaussian"
        one_step = accounted_epsilon(mechanism, 1.0, 1, delta, "sound", self.params.clip_norm, accounting.conversion)
        every = ("the client adds the noise to every local step, so every observer of its uploads gets the same "
                 "record-level guarantee")
        adversaries = tuple(
            AdversaryClaim(adversary, headline if finite else None, delta, Relation.ADD_REMOVE if finite else Relation.NONE,
                           observes,
                           label, amplification=True, rounds=rounds,
                           noise_multiplier=mechanism.parameter if gaussian else None,
                           round_epsilon=one_step if math.isfinite(one_step) else None,
                           notes=((server_notes(every) if adversary == Observer.SERVER else every) if finite else
                                  f"not covered: {verdict}"))
            for adversary, observes in ((Observer.RELEASED, "the global model after every round"),
                                        (Observer.SERVER, "every client's upload" if not self.params.shuffle else
                                         "every upload, shuffled"),
                                        (Observer.LOCAL, "one client's upload")))
        return PrivacyClaim(headline, delta, Unit.RECORD, label, mechanism_text, "; ".join(notes), alternatives=both,
                            relation=Relation.ADD_REMOVE if finite else Relation.NONE, adversary=Observer.RELEASED,
                            adversaries=adversaries)

    def epsilon_trajectory(self, training, num_clients, delta, accounting, state: DefenseState = NO_STATE) -> list[float]:
        mechanism = self.group_mechanism(max(self.params.client_epsilons), training, delta, accounting.conversion) \
            if self.params.client_epsilons else self.mechanism()
        per_round = self.steps_per_round(training)
        return [accounted_epsilon(mechanism, self.params.sample_rate, t * per_round, delta, "sound",
                                  self.params.clip_norm, accounting.conversion) for t in range(1, training.rounds + 1)]

    # ---------------------------------------------------------------- training

    @property
    def observes(self) -> str:
        return "shuffled" if self.params.shuffle else "uploads"

    def local_batches(self, num_records: int, training: TrainingConfig, rng) -> list[np.ndarray]:
        """⌈E/q⌉ Poisson batches: each record joins each step independently with probability q."""
        return [np.flatnonzero(rng.random(num_records) < self.params.sample_rate)
                for _ in range(self.steps_per_round(training))]

    def memory_factor(self, training: TrainingConfig) -> float:
        return 64.0  # per-example gradients of a batch

    def group_epsilon(self, client: int) -> float:
        epsilons = self.params.client_epsilons
        return epsilons[client % len(epsilons)]

    def local_objective(self) -> LocalObjective:
        return UDPFLObjective(self)

    def prepare(self, job, model=None, initial=None) -> UDPFLState:
        return UDPFLState(job.delta, job.accounting.conversion, {})

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        """The uploads are the clients' DP-SGD models as trained (the noise is in local training); with
        heterogeneous ε, the largest-ε clients' mean local model becomes the run's next pull target.
        The shuffler (``shuffle``) is the channel, not the client: the engine's server view
        (``observes == "shuffled"``) gets the uploads in random order."""
        if self.params.client_epsilons:
            largest = max(self.params.client_epsilons)
            rows = [i for i, c in enumerate(ctx.participants) if self.group_epsilon(int(c)) == largest]
            if rows:
                local = ctx.global_vector + updates[rows].mean(0)
                target = run_state(ctx).pull_target
                target.clear()
                target.update({n: t.clone() for n, t in ctx.layout.unflatten(local).items()})
        return updates, {"clip_input_norms": torch.linalg.vector_norm(updates.to(torch.float64), dim=1)}

    def audit_hooks(self) -> DPSGDAuditHooks:
        return DPSGDAuditHooks(self)


@functools.lru_cache(maxsize=256)
def _harmonized(mechanism: str, epsilon: float, delta: float, sample_rate: float, steps: int, accounting: str,
                clip_norm: str, conversion: str) -> Mechanism:
    """The Harmonizer's noise (a pure function of its arguments, so it is computed once per setting)."""
    return harmonize(mechanism, epsilon, delta, sample_rate, steps, accounting, clip_norm, conversion)


@dataclass(frozen=True)
class UDPFLState(DefenseState):
    """A UDP-FL run's δ and conversion (heterogeneous ε harmonizes each group's noise for them), and
    what one round leaves for the next: the largest-ε clients' mean local model, the target of the
    others' penalty λ_k(w − w_max) — a container made for this run by ``prepare``, so no other run
    can read or overwrite it."""

    delta: float
    conversion: str
    pull_target: dict[str, torch.Tensor] = field(compare=False)


def run_state(ctx: RoundContext) -> UDPFLState:
    if not isinstance(ctx.state, UDPFLState):
        raise ValueError("udp-fl: the run was not prepared (its δ and penalty target are the run's own)")
    return ctx.state


class UDPFLObjective(DPSGDObjective):
    """UDP-FL's client step: DP-SGD with each client's mechanism (its group's, with heterogeneous ε),
    its expected batch q·n_i and its penalty, all read from the round's context — the run's own
    seed, client sizes and state — when the round begins."""

    def __init__(self, defense: UDPFL):
        params = defense.params
        pull = self._pull if params.client_epsilons else None
        super().__init__(params.clip, params.clip_norm, self._mechanism, self._expected_batch, seed=0, pull_of=pull)
        self.defense = defense
        self.sizes: dict[int, int] = {}
        self.ctx: RoundContext | None = None

    def begin_round(self, ctx: RoundContext) -> None:
        super().begin_round(ctx)
        self.ctx, self.seed = ctx, ctx.seed
        self.sizes = {int(c): int(n) for c, n in zip(ctx.participants, ctx.sizes)}

    def _mechanism(self, client: int) -> Mechanism:
        defense, ctx = self.defense, self.ctx
        if not defense.params.client_epsilons:
            return defense.mechanism()
        assert ctx is not None
        state = run_state(ctx)
        return defense.group_mechanism(defense.group_epsilon(client), ctx.training, state.delta, state.conversion)

    def _expected_batch(self, client: int) -> float:
        return max(self.defense.params.sample_rate * self.sizes[client], 1e-12)

    def _pull(self, client: int):
        assert self.ctx is not None
        epsilons = self.defense.params.client_epsilons
        largest = max(epsilons)
        strength = self.defense.params.penalty * (largest - self.defense.group_epsilon(client)) / largest
        target = run_state(self.ctx).pull_target
        if strength == 0 or not target:
            return None
        return strength, target


class DPSGDAuditHooks(AuditHooks):
    """UDP-FL as the conformance audit drives it: its noise is added inside local training (DP-SGD)."""

    defense: UDPFL

    def claimed_step(self, training: TrainingConfig) -> ClaimedStep | None:
        """Each client's step as the claim accounts it: its mechanism at sensitivity C, Poisson rate q,
        the clip norm (None with heterogeneous ε: the claim is the weakest group's, the canaries'
        clients meet their own group's noise)."""
        params = self.defense.params
        if params.client_epsilons:
            return None
        return ClaimedStep(self.defense.mechanism(), params.sample_rate, params.clip_norm,
                           self.defense.steps_per_round(training))

    def release_probe(self, job) -> ReleaseProbe:
        """One DP-SGD step of one client of the weakest-ε group (its noise lives in local training, not
        in privatize): contribution rows are that client's per-example gradients; every observer sees
        (post-processing of) the noisy step."""
        defense = self.defense
        engine = FederatedEngine(defense, job)
        state = engine.start()
        objective = engine.defense.local_objective()
        participants = np.arange(len(job.clients))
        objective.begin_round(engine.context(0, participants, state.model, state.layout, state.global_vector, job.training.lr,
                                             state.defense_state))
        layout = state.layout
        params = {n: v[None] for n, v in layout.unflatten(state.global_vector).items()}
        epsilons = defense.params.client_epsilons
        client = next(i for i in range(len(job.clients)) if epsilons[i % len(epsilons)] == max(epsilons)) if epsilons else 0
        examples = 8

        def views(contributions: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
            objective.seed, objective.round = seed, 0
            objective.at_step(0, [client])
            gradients = {n: g[None] for n, g in layout.unflatten_stacked(contributions.to(state.global_vector)).items()}
            mask = torch.ones(1, contributions.shape[0], dtype=state.global_vector.dtype)
            summed = clip_and_sum(gradients, mask, defense.params.clip, defense.params.clip_norm)
            step = layout.flatten_stacked(objective.noisy_gradient(summed, params))[0].detach().double()
            return {Observer.RELEASED: step, Observer.SERVER: step, Observer.LOCAL: step}

        return ReleaseProbe(layout.dim, examples, defense.params.clip, views,
                            "one client's per-example gradients in one DP-SGD step", engine.defense, state=state.defense_state)
