"""DDGauss, the distributed discrete Gaussian mechanism: Kairouz, Liu, Steinke, "The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation" (ICML 2021) — a
baseline of Cheng et al. 2022 (§6; the paper gives no details: every choice is ours, following the
original paper).

Client i, per round (Alg. 1 of Kairouz et al.):

1. clip Δ_i to ℓ2 norm ≤ c;
2. pad to d′ = 2^⌈log₂ d⌉ and rotate, x = H·D·Δ/√d′ (D random signs shared by the round);
3. scale x ← x/γ;
4. conditional randomized rounding: round each coordinate down or up with probability equal to
   its fractional part, and redraw until ‖x̃‖₂ ≤ Δ₂ = min(c/γ + √d′,
   √(c²/γ² + d′/4 + √(2 ln(1/β))·(c/γ + √d′/2)));
5. add integer noise from the discrete Gaussian N_Z(0, (σ_loc/γ)²) to every coordinate;
6. wrap into Z_m, m = 2^bits.

The server learns only the modular sum (secure aggregation), multiplies it by γ, rotates back,
drops the padding and takes the uniform mean; w ← w + η_g·mean.

Noise: ``noise_multiplier`` σ sets σ_loc = σ·c/√n with n the number of clients per round, so the
summed noise has the same scale σc as DP-FedAvg's. Kairouz et al. analyse a round of exactly n
clients; under Poisson sampling a round with fewer clients than expected would carry less noise
than accounted, so ``validate`` requires a fixed number per round (fixed-size sampling, or every
client every round), and a round whose realised number of real clients is not n is refused. Canary
clients of an update-space audit (:func:`defenses.federated.canary_clients.add_canaries`) round
and upload their vector like a client but add no noise share: the n real shares already sum to
the accounted σc, and each further share would make the audit run with more noise than the claim
accounts (its ε lower bound biased low). For the same reason the sum is divided by the configured
n, not by the count of uploads: a public constant, so the released mean is post-processing of the
noisy sum whoever joined. γ is chosen (``gamma: 0``) by the paper's heuristic: k standard deviations
of the aggregate must fit in the bit width, 1/γ = √(2^{2b} − n·k²) / (2k·√(c²n²/d′ + n·σ_loc²)).

Accounting (Kairouz et al. Prop. 14 and Thm. 1), per round of n clients, for a
change of the client's rounded vector of ℓ2 norm ≤ Δ₂ (zero-out: the client stays and sends
zero), l2 = Δ₂γ/(√n σ_loc), l1 = Δ₁γ/(√n σ_loc), Δ₁ = Δ₂·min(√d′, Δ₂) and
τ = 10·Σ_{k=1}^{n−1} exp(−2π²(σ_loc/γ)²·k/(k+1)):

    ε(α) = min{ α·l2²/2 + τd′,  (α/2)(l2² + 2·l1·τ + τ²d′),  (α/2)(l2 + √d′·τ)² },

composed over rounds and converted to (ε, δ) at integer orders 2..128, 256. Observers
(:mod:`defenses.privacy.claims`): the released models, with every client every round, are accounted
over all T rounds (zero-out); with a fixed-size sample of m < N clients, amplification by
sampling without replacement holds for replace-one neighbours (Wang, Balle, Kasiviswanathan
2019, Thm. 9), whose change is up to 2Δ₂; the server sees the modular sum and knows who took part
(zero-out, no amplification, the participation bound); one upload alone is not covered (its own
noise is σ_loc, and secure aggregation is what hides it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng
from audit.core.vocabulary import Observer, Relation, Unit
from defenses.base import DEFENSES, NO_STATE, AccountingSettings, AuditHooks, Defense, PrivacyClaim
from defenses.blocks.clipping import clip_rows
from defenses.blocks.noise import discrete_gaussian
from defenses.blocks.rotation import padded_dimension, random_signs, rotate, unrotate
from defenses.blocks.secure_aggregation import modular_sum, wrap
from defenses.federated.canary_clients import canary_clients
from defenses.federated.training_job import RoundContext, TrainingConfig
from defenses.privacy.accounting import accountant_label, rdp_to_epsilon
from defenses.privacy.calibration import smallest_noise
from defenses.privacy.claims import AdversaryClaim, participation_bound, server_notes
from defenses.privacy.subsampled_rdp import INTEGER_ORDERS, without_replacement_subsampled_rdp

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class DDGaussParams:
    clip: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True, "help": "c: flat ℓ2 clip"})
    noise_multiplier: float = field(default=1.0, metadata={"min": 0.0, "help": "σ: σ_loc = σc/√n (0: no noise, no claim)"})
    bits: int = field(default=16, metadata={"min": 2, "max": 62, "help": "bit width of the SecAgg field (reference code: 16)"})
    beta: float = field(default=math.exp(-0.5), metadata={"min": 0.0, "max": 1.0, "max_exclusive": True,
                                                           "help": "β of conditional rounding (reference: e^-0.5)"})
    k_stddevs: float = field(default=4.0,
                             metadata={"min": 0.0, "min_exclusive": True, "help": "k of the γ heuristic (reference: 4)"})
    gamma: float = field(default=0.0, metadata={"min": 0.0, "help": "rounding granularity γ (0: the paper's heuristic)"})


@dataclass(frozen=True)
class DDGaussSetting:
    """The mechanism's derived quantities for one model size and round size."""

    clip: float
    local_std: float  # σ_loc, in the unscaled domain
    gamma: float
    beta: float
    dim: int  # d′, padded
    clients: int  # n, expected clients per round

    @property
    def rounded_l2(self) -> float:
        """Δ₂: the ℓ2 bound after scaling and conditional rounding (Kairouz et al., Thm. 1 / Prop. 22)."""
        scaled = self.clip / self.gamma
        first = scaled + math.sqrt(self.dim)
        if self.beta == 0:
            return first
        second = math.sqrt(scaled ** 2 + self.dim / 4 + math.sqrt(2 * math.log(1 / self.beta)) *
                           (scaled + math.sqrt(self.dim) / 2))
        return min(first, second)

    @property
    def rounded_l1(self) -> float:
        bound = self.rounded_l2
        return bound * min(math.sqrt(self.dim), bound)

    def rdp(self, orders: np.ndarray, change: float = 1.0) -> np.ndarray:
        """RDP of one unsampled round at the given orders (float64), for a change of the rounded
        vector of ℓ2 norm ≤ ``change``·Δ₂ (1: zero-out; 2: replace-one)."""
        orders = np.asarray(orders, dtype=np.float64)
        if self.local_std <= 0:
            return np.full_like(orders, np.inf)
        scaled_std = self.local_std / self.gamma
        bound = change * self.rounded_l2
        # an integer vector's ℓ1 norm is at most min(√d′·‖v‖₂, ‖v‖₂²)
        l2 = bound / (math.sqrt(self.clients) * scaled_std)
        l1 = bound * min(math.sqrt(self.dim), bound) / (math.sqrt(self.clients) * scaled_std)
        ks = np.arange(1, self.clients, dtype=np.float64)
        tau = 10.0 * float(np.exp(-2 * math.pi ** 2 * scaled_std ** 2 * ks / (ks + 1)).sum())
        first = orders * l2 ** 2 / 2 + tau * self.dim
        second = orders / 2 * (l2 ** 2 + 2 * l1 * tau + tau ** 2 * self.dim)
        third = orders / 2 * (l2 + math.sqrt(self.dim) * tau) ** 2
        return np.minimum(np.minimum(first, second), third)


def check_fixed_rounds(training: TrainingConfig) -> None:
    """Kairouz et al. analyse rounds of exactly n clients: Poisson sampling below rate 1 does not give that."""
    if training.sampling == "poisson" and training.client_rate < 1:
        raise UserInputError("training.sampling: ddgauss needs the same number of clients every round (its noise and "
                             "analysis are for exactly n clients); use sampling 'fixed' or client_rate 1")


def heuristic_gamma(clip: float, local_std: float, bits: int, clients: int, dim: int, k: float) -> float:
    """γ such that k standard deviations of the noisy aggregate fit in 2^bits (Kairouz et al. §4.4)."""
    room = 2.0 ** (2 * bits) - clients * k ** 2
    if room <= 0:
        raise UserInputError(f"params.bits: {bits} bits cannot hold {clients} clients' sums at k={k}; raise bits")
    scale = math.sqrt(room) / (2 * k * math.sqrt(clip ** 2 * clients ** 2 / dim + clients * local_std ** 2))
    return 1.0 / scale


@DEFENSES.register
class DDGauss(Defense):
    name = "ddgauss"
    summary = "Distributed discrete Gaussian with secure aggregation: rotate, scale, round, integer noise, modular sum"
    reference = "Kairouz, Liu, Steinke 2021, The Distributed Discrete Gaussian Mechanism for FL with Secure Aggregation"
    Params = DDGaussParams
    private = True
    default_view = "aggregate"

    # ---------------------------------------------------------------- derived quantities

    def expected_clients(self, training: TrainingConfig, num_clients: int) -> int:
        """n: clients per round (fixed by :meth:`validate`)."""
        if training.sampling == "fixed":
            return training.round_size(num_clients)
        return num_clients

    def setting(self, training: TrainingConfig, num_clients: int, noise_multiplier: float | None = None) -> DDGaussSetting:
        if self.layout is None:
            raise UserInputError("ddgauss: the model's layout is needed (bind the defense first)")
        sigma = self.params.noise_multiplier if noise_multiplier is None else noise_multiplier
        clients = self.expected_clients(training, num_clients)
        dim = padded_dimension(self.layout.dim)
        local_std = sigma * self.params.clip / math.sqrt(clients)
        gamma = self.params.gamma or heuristic_gamma(self.params.clip, local_std, self.params.bits, clients, dim,
                                                     self.params.k_stddevs)
        return DDGaussSetting(self.params.clip, local_std, gamma, self.params.beta, dim, clients)

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.aggregation != "uniform":
            raise UserInputError("training.aggregation: ddgauss needs 'uniform' (size weights change the sensitivity)")
        check_fixed_rounds(training)

    # ---------------------------------------------------------------- accounting

    def released_rdp(self, training: TrainingConfig, num_clients: int, noise_multiplier: float | None = None
                     ) -> tuple[np.ndarray, str]:
        """RDP of one round as the released models see it, and its neighbouring relation."""
        setting = self.setting(training, num_clients, noise_multiplier)
        rate = training.sampling_rate(num_clients)
        if rate >= 1.0:
            return setting.rdp(INTEGER_ORDERS), Relation.ZERO_OUT
        rdp = without_replacement_subsampled_rdp(lambda a: setting.rdp(a, change=2.0), rate, INTEGER_ORDERS)
        return rdp, Relation.REPLACE_ONE

    def _epsilon(self, training: TrainingConfig, num_clients: int, rounds: int, delta: float, conversion: str,
                 noise_multiplier: float | None = None) -> float:
        check_fixed_rounds(training)
        setting = self.setting(training, num_clients, noise_multiplier)
        if setting.local_std <= 0 or rounds == 0:
            return math.inf if rounds else 0.0
        per_round, _ = self.released_rdp(training, num_clients, noise_multiplier)
        return rdp_to_epsilon(INTEGER_ORDERS, rounds * per_round, delta, conversion)[0]

    def _conversion(self, accounting: AccountingSettings) -> str:
        if accounting.accountant != "rdp":
            raise UserInputError("accounting.accountant: ddgauss is accounted with RDP only (no PLD of the "
                                 "discrete mechanism here)")
        return accounting.conversion

    def calibrate(self, target_epsilon: float, delta: float, training: TrainingConfig, num_clients: int,
                  accounting: AccountingSettings) -> DDGauss:
        conversion = self._conversion(accounting)
        sigma = smallest_noise(lambda s: self._epsilon(training, num_clients, training.rounds, delta, conversion, s),
                               target_epsilon)
        return self.with_params(noise_multiplier=sigma)

    def server_epsilon(self, training: TrainingConfig, num_clients: int, rounds: int, delta: float,
                       conversion: str) -> tuple[float, int]:
        """The server knows who took part: unsampled rounds (zero-out), all of them or the participation bound."""
        per_round = self.setting(training, num_clients).rdp(INTEGER_ORDERS)
        every = rdp_to_epsilon(INTEGER_ORDERS, rounds * per_round, delta, conversion)[0]
        rate = training.sampling_rate(num_clients)
        if rate >= 1.0 or rounds == 0:
            return every, rounds
        bound = participation_bound(rounds, rate, delta / 2)
        bounded = rdp_to_epsilon(INTEGER_ORDERS, bound * per_round, delta / 2, conversion)[0]
        return (bounded, bound) if bounded < every else (every, rounds)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE) -> PrivacyClaim:
        conversion = self._conversion(accounting)
        epsilon = self._epsilon(training, num_clients, rounds, delta, conversion)
        setting = self.setting(training, num_clients)
        _, relation = self.released_rdp(training, num_clients)
        label = f"{accountant_label('rdp', conversion)}, integer orders"
        sampled = training.sampling_rate(num_clients) < 1
        sampling = (f"fixed-size samples of {setting.clients} of {num_clients} clients (Wang–Balle–Kasiviswanathan bound, "
                    "replace-one)" if sampled else "every client every round")
        mechanism = (f"distributed discrete Gaussian, σ_loc={setting.local_std:.4g}, γ={setting.gamma:.4g}, "
                     f"{self.params.bits} bits, d′={setting.dim}, n={setting.clients} clients per round, {sampling}, T={rounds}")
        round_epsilon = rdp_to_epsilon(INTEGER_ORDERS, setting.rdp(INTEGER_ORDERS), delta, conversion)[0]
        replace_epsilon = rdp_to_epsilon(INTEGER_ORDERS, setting.rdp(INTEGER_ORDERS, change=2.0), delta, conversion)[0]
        sigma = self.params.noise_multiplier  # the summed noise is σc, discrete, for a change of ≤ c (zero-out)
        server, counted = self.server_epsilon(training, num_clients, rounds, delta, conversion)
        finite = setting.local_std > 0
        adversaries = (
            AdversaryClaim(Observer.RELEASED, epsilon if finite else None, delta, relation, "the global model after every round",
                           label, amplification=sampled, rounds=rounds,
                           noise_multiplier=(sigma / 2 if sampled else sigma) if finite else None,
                           round_epsilon=(replace_epsilon if sampled else round_epsilon) if finite else None, notes=mechanism),
            AdversaryClaim(Observer.SERVER, server if finite else None, delta, Relation.ZERO_OUT,
                           "the modular sum of every round it runs",
                           label, amplification=False, rounds=counted, noise_multiplier=sigma if finite else None,
                           round_epsilon=round_epsilon if finite else None,
                           notes=server_notes(f"participation known, {counted} of {rounds} rounds accounted")),
            AdversaryClaim.not_covered(Observer.LOCAL, "one upload carries only its own share σ_loc of the noise; secure "
                                                "aggregation is what hides it", "one client's upload"),
        )
        notes = ["client-level; the server sees only the modular sum (simulated secure aggregation)",
                 f"the server, which knows who took part, gets ε = {server:.4g}" if finite else "no noise: no claim"]
        return PrivacyClaim(epsilon if finite else math.inf, delta, Unit.CLIENT, label, mechanism, "; ".join(notes),
                            relation=relation, adversary=Observer.RELEASED, adversaries=adversaries)

    def epsilon_trajectory(self, training, num_clients, delta, accounting, state=NO_STATE) -> list[float]:
        conversion = self._conversion(accounting)
        setting = self.setting(training, num_clients)
        if setting.local_std <= 0:
            return [math.inf] * training.rounds
        per_round, _ = self.released_rdp(training, num_clients)
        return [rdp_to_epsilon(INTEGER_ORDERS, t * per_round, delta, conversion)[0] for t in range(1, training.rounds + 1)]

    # ---------------------------------------------------------------- the mechanism

    def _round_setting(self, ctx: RoundContext) -> DDGaussSetting:
        """The round's setting, after checking that exactly the n accounted real clients take part:
        σ_loc = σc/√n is set from n, so with fewer the summed noise would fall below σc."""
        setting = self.setting(ctx.training, ctx.num_clients)
        real = int((~canary_clients(ctx)).sum())
        if real != setting.clients:
            raise ValueError(f"ddgauss: round {ctx.round + 1} has {real} participating clients, but its noise (σ_loc = σc/√n) "
                             f"and its claim are for exactly n = {setting.clients}; refusing to release an aggregate "
                             "with less or more noise than accounted")
        return setting

    def encode(self, updates: torch.Tensor, ctx: RoundContext, setting: DDGaussSetting) -> tuple[torch.Tensor, torch.Tensor]:
        """Clients' integer uploads in Z_{2^bits} (int64, [C, d′]) and their pre-clip norms."""
        clipped, norms, _ = clip_rows(updates.to(torch.float64), self.params.clip)
        padded = torch.zeros(updates.shape[0], setting.dim, dtype=torch.float64, device=updates.device)
        padded[:, : updates.shape[1]] = clipped
        signs = random_signs(setting.dim, ctx.server_generator("rotation")).to(updates.device)
        scaled = rotate(padded, signs) / setting.gamma
        bound = setting.rounded_l2
        uploads = torch.empty_like(scaled, dtype=torch.int64)
        floor = torch.floor(scaled)
        fraction = scaled - floor
        canary = canary_clients(ctx)
        for i, client in enumerate(ctx.participants):
            rng = numpy_rng(ctx.seed, "round", ctx.round, "client", int(client), "rounding")
            for _ in range(1000):
                up = torch.as_tensor(rng.random(setting.dim) < fraction[i].cpu().numpy(), device=updates.device)
                rounded = floor[i] + up.to(torch.float64)
                if float(torch.linalg.vector_norm(rounded)) <= bound:
                    break
            else:  # pragma: no cover - probability ≤ β^1000
                raise RuntimeError("conditional rounding did not meet its norm bound")
            upload = rounded.to(torch.int64)
            if not canary[i]:  # the n real clients' shares make the accounted σc; a canary adds none
                noise_rng = numpy_rng(ctx.seed, "round", ctx.round, "client", int(client), "noise")
                upload = upload + torch.as_tensor(discrete_gaussian(noise_rng, setting.local_std / setting.gamma, setting.dim),
                                                  device=updates.device)
            uploads[i] = wrap(upload, self.params.bits)
        return uploads, norms

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        setting = self._round_setting(ctx)
        uploads, norms = self.encode(updates, ctx, setting)
        return uploads, {"clip_fraction": float((norms > self.params.clip).double().mean()), "clip_input_norms": norms,
                         "gamma": setting.gamma}

    def aggregate(self, uploads: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        setting = self._round_setting(ctx)
        total = modular_sum(uploads, self.params.bits).to(torch.float64) * setting.gamma
        signs = random_signs(setting.dim, ctx.server_generator("rotation")).to(uploads.device)
        decoded = unrotate(total, signs)[: ctx.layout.dim]
        # the configured n, a public constant (canary clients join beyond it and must not change the scale)
        return (decoded / setting.clients).to(torch.float32)

    def audit_hooks(self) -> AuditHooks:
        return DDGaussAuditHooks(self, clips_updates=True)  # canary clients carry the clip c


class DDGaussAuditHooks(AuditHooks):
    """DDGauss as the audits see it: update canaries carry the clip c; Dirac canary clients refused."""

    def dirac_canaries_refused(self, training: TrainingConfig) -> str | None:
        """A one-coordinate update is rotated over every coordinate before the rounding, the discrete
        noise and the modular sum: its canary would be the pre-image of a coordinate under the round's
        public rotation, read in the rotated domain of each released step. That design is not built."""
        return ("its uploads are rotated (a one-coordinate update spreads over every coordinate), stochastically "
                "rounded and summed modulo 2^bits: a Dirac canary would be a coordinate's pre-image under the round's "
                "rotation, read in the rotated domain, which this audit does not build (the dense client-canaries "
                "audit applies)")
