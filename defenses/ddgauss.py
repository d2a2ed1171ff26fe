"""DDGauss, the distributed discrete Gaussian mechanism: Kairouz, Liu, Steinke, "The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation" (ICML 2021) — a
baseline of paper 000 (spec 000 §2.5; every choice [P], following the original paper).

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

Noise: ``noise_multiplier`` σ sets σ_loc = σ·c/√n with n the expected number of clients per round,
so the summed noise has the same scale σc as DP-FedAvg's. γ is chosen (``gamma: 0``) by the
paper's heuristic: k standard deviations of the aggregate must fit in the bit width,
1/γ = √(2^{2b} − n·k²) / (2k·√(c²n²/d′ + n·σ_loc²)).

Accounting (spec 000 §2.5; Kairouz et al. Prop. 14 and Thm. 1), per round with n clients,
l2 = Δ₂γ/(√n σ_loc), l1 = Δ₁γ/(√n σ_loc), Δ₁ = Δ₂·min(√d′, Δ₂) and
τ = 10·Σ_{k=1}^{n−1} exp(−2π²(σ_loc/γ)²·k/(k+1)):

    ε(α) = min{ α·l2²/2 + τd′,  (α/2)(l2² + 2·l1·τ + τ²d′),  (α/2)(l2 + √d′·τ)² },

amplified by Poisson subsampling with Zhu & Wang's general bound, composed over T rounds and
converted to (ε, δ) at integer orders 2..128, 256.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from audit.errors import UserInputError
from audit.seeding import numpy_rng
from defenses.accounting import (
    INTEGER_ORDERS,
    accountant_label,
    poisson_subsampled_rdp,
    rdp_to_epsilon,
    smallest_noise,
)
from defenses.base import DEFENSES, AccountingSettings, Defense, PrivacyClaim
from defenses.clipping import clip_rows
from defenses.engine import RoundContext, TrainingConfig
from defenses.noise import discrete_gaussian
from defenses.rotation import padded_dimension, random_signs, rotate, unrotate
from defenses.secure_aggregation import modular_sum, wrap


@dataclass(frozen=True)
class DDGaussParams:
    clip: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True, "help": "c: flat ℓ2 clip"})
    noise_multiplier: float = field(default=1.0, metadata={"min": 0.0, "help": "σ: σ_loc = σc/√n (0: no noise, no claim)"})
    bits: int = field(default=16, metadata={"min": 2, "max": 62, "help": "bit width of the SecAgg field (reference code: 16)"})
    beta: float = field(default=math.exp(-0.5), metadata={"min": 0.0, "max": 1.0, "max_exclusive": True,
                                                           "help": "β of conditional rounding (reference: e^-0.5)"})
    k_stddevs: float = field(default=4.0, metadata={"min": 0.0, "min_exclusive": True, "help": "k of the γ heuristic (reference: 4)"})
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
        second = math.sqrt(scaled ** 2 + self.dim / 4 + math.sqrt(2 * math.log(1 / self.beta)) * (scaled + math.sqrt(self.dim) / 2))
        return min(first, second)

    @property
    def rounded_l1(self) -> float:
        bound = self.rounded_l2
        return bound * min(math.sqrt(self.dim), bound)

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        """RDP of one unsampled round at the given orders (float64)."""
        orders = np.asarray(orders, dtype=np.float64)
        if self.local_std <= 0:
            return np.full_like(orders, np.inf)
        scaled_std = self.local_std / self.gamma
        l2 = self.rounded_l2 / (math.sqrt(self.clients) * scaled_std)
        l1 = self.rounded_l1 / (math.sqrt(self.clients) * scaled_std)
        ks = np.arange(1, self.clients, dtype=np.float64)
        tau = 10.0 * float(np.exp(-2 * math.pi ** 2 * scaled_std ** 2 * ks / (ks + 1)).sum())
        first = orders * l2 ** 2 / 2 + tau * self.dim
        second = orders / 2 * (l2 ** 2 + 2 * l1 * tau + tau ** 2 * self.dim)
        third = orders / 2 * (l2 + math.sqrt(self.dim) * tau) ** 2
        return np.minimum(np.minimum(first, second), third)


def heuristic_gamma(clip: float, local_std: float, bits: int, clients: int, dim: int, k: float) -> float:
    """γ such that k standard deviations of the noisy aggregate fit in 2^bits (Kairouz et al. §4.4)."""
    room = 2.0 ** (2 * bits) - clients * k ** 2
    if room <= 0:
        raise UserInputError(f"params.bits: {bits} bits cannot hold {clients} clients' sums at k={k}; raise bits")
    scale = math.sqrt(room) / (2 * k * math.sqrt(clip ** 2 * clients ** 2 / dim + clients * local_std ** 2))
    return 1.0 / scale


@DEFENSES.register("ddgauss")
class DDGauss(Defense):
    name = "ddgauss"
    summary = "Distributed discrete Gaussian with secure aggregation: rotate, scale, round, integer noise, modular sum"
    reference = "Kairouz, Liu, Steinke 2021, The Distributed Discrete Gaussian Mechanism for FL with Secure Aggregation"
    Params = DDGaussParams
    private = True
    default_view = "aggregate"
    clips_updates = True

    # ---------------------------------------------------------------- derived quantities

    def expected_clients(self, training: TrainingConfig, num_clients: int) -> int:
        if training.sampling == "fixed":
            return training.round_size(num_clients)
        return max(1, int(round(training.client_rate * num_clients)))

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

    # ---------------------------------------------------------------- accounting

    def _epsilon(self, training: TrainingConfig, num_clients: int, rounds: int, delta: float, conversion: str,
                 noise_multiplier: float | None = None) -> tuple[float, float]:
        setting = self.setting(training, num_clients, noise_multiplier)
        if setting.local_std <= 0 or rounds == 0:
            return (math.inf if rounds else 0.0), float("nan")
        per_round = poisson_subsampled_rdp(setting.rdp, training.sampling_rate(num_clients), INTEGER_ORDERS)
        return rdp_to_epsilon(INTEGER_ORDERS, rounds * per_round, delta, conversion)

    def _conversion(self, accounting: AccountingSettings) -> str:
        if accounting.accountant != "rdp":
            raise UserInputError("accounting.accountant: ddgauss is accounted with RDP only (no PLD of the discrete mechanism here)")
        return accounting.conversion

    def calibrate(self, target_epsilon: float, delta: float, training: TrainingConfig, num_clients: int,
                  accounting: AccountingSettings) -> DDGauss:
        conversion = self._conversion(accounting)
        sigma = smallest_noise(lambda s: self._epsilon(training, num_clients, training.rounds, delta, conversion, s)[0],
                               target_epsilon)
        return self.with_params(noise_multiplier=sigma)

    def privacy_claim(self, training, num_clients, rounds, delta, accounting) -> PrivacyClaim:
        conversion = self._conversion(accounting)
        epsilon, _ = self._epsilon(training, num_clients, rounds, delta, conversion)
        setting = self.setting(training, num_clients)
        sampling = ("Poisson-subsampled (Zhu–Wang bound)" if training.sampling == "poisson" and training.client_rate < 1
                    else "every round's sample")
        mechanism = (f"distributed discrete Gaussian, σ_loc={setting.local_std:.4g}, γ={setting.gamma:.4g}, "
                     f"{self.params.bits} bits, d′={setting.dim}, n={setting.clients} expected clients, {sampling}, T={rounds}")
        notes = ["client-level; the server sees only the modular sum (simulated secure aggregation)",
                 f"accounted for the expected {setting.clients} clients per round (Kairouz et al.'s analysis)"]
        return PrivacyClaim(epsilon, delta, "client", f"{accountant_label('rdp', conversion)}, integer orders",
                            mechanism, "; ".join(notes))

    def epsilon_trajectory(self, training, num_clients, delta, accounting) -> list[float]:
        conversion = self._conversion(accounting)
        setting = self.setting(training, num_clients)
        if setting.local_std <= 0:
            return [math.inf] * training.rounds
        per_round = poisson_subsampled_rdp(setting.rdp, training.sampling_rate(num_clients), INTEGER_ORDERS)
        return [rdp_to_epsilon(INTEGER_ORDERS, t * per_round, delta, conversion)[0] for t in range(1, training.rounds + 1)]

    # ---------------------------------------------------------------- the mechanism

    def _round_setting(self, ctx: RoundContext) -> DDGaussSetting:
        return self.setting(ctx.training, ctx.num_clients)

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
        for i, client in enumerate(ctx.participants):
            rng = numpy_rng(ctx.seed, "round", ctx.round, "client", int(client), "rounding")
            for _ in range(1000):
                up = torch.as_tensor(rng.random(setting.dim) < fraction[i].cpu().numpy(), device=updates.device)
                rounded = floor[i] + up.to(torch.float64)
                if float(torch.linalg.vector_norm(rounded)) <= bound:
                    break
            else:  # pragma: no cover - probability ≤ β^1000
                raise RuntimeError("conditional rounding did not meet its norm bound")
            noise_rng = numpy_rng(ctx.seed, "round", ctx.round, "client", int(client), "noise")
            noise = torch.as_tensor(discrete_gaussian(noise_rng, setting.local_std / setting.gamma, setting.dim),
                                    device=updates.device)
            uploads[i] = wrap(rounded.to(torch.int64) + noise, self.params.bits)
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
        return (decoded / len(ctx.participants)).to(torch.float32)
