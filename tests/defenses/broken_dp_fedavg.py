"""Deliberately broken DP-FedAvg implementations that keep the honest claim — what an end-to-end
audit must catch (``dpfl-audit run`` names them as ``tests.defenses.broken_dp_fedavg:Class``).

Each is a bug of a kind found in real DP code, the accountant still told the configured σ and S:
noise halved (:class:`HalvedNoise`), halved or cut to 0.8 from a later round on (schedule bugs:
:class:`NoiseHalvedFromMidRun`, :class:`NoiseShrunkAfterFirstRound`), divided by |P_t| instead
of √|P_t| (:class:`NoiseOverCountNotItsRoot`), clipping at 3·S (:class:`ClipsAtThreeTimesTheBound`)
and a clipping step that misses one client a round (:class:`OneClientUnclippedAfterFirstRound`);
and, written as a user writes them (``privatize`` rewritten with plain tensors): halved noise,
noise cancelled in pairs, reused every round, uniform, and a claim of sampling that never happens.
Dirac canary clients meet each bug where real uploads meet it: their probe rows go through the
defense's own privatisation (``defenses.federated.dirac_passage``).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from audit.core.seeding import torch_generator
from defenses.blocks.clipping import clip_rows, clip_rows_per_tensor
from defenses.fedavg import DPFedAvg


class HalvedNoise(DPFedAvg):
    """Each upload carries half the noise std the claim accounts for (the accounting is unchanged):
    true ε at a claimed 1 is ≈ 1.97 by exact GDP composition over 60 full-participation rounds."""

    name = "dp-fedavg-halved-noise"

    def upload_noise_std(self, ctx):
        return super().upload_noise_std(ctx) / 2


class OneClientUnclippedAfterFirstRound(DPFedAvg):
    """From round 2 on, one participant per privatised batch — the one at position t mod |batch|,
    an index bug — uploads its update unclipped (its noise is as accounted)."""

    name = "dp-fedavg-one-client-unclipped"

    def privatize(self, updates, ctx):
        uploads, diagnostics = super().privatize(updates, ctx)
        if ctx.round == 0 or not len(updates):
            return uploads, diagnostics
        i = ctx.round % len(updates)
        clipped = self.clip(updates)[0]
        uploads = uploads.clone()
        uploads[i] = uploads[i] + (updates[i] - clipped[i])
        return uploads, diagnostics


# ---------------------------------------------------------------- more bugs that keep the claim
# Each acts through the hooks DP-FedAvg's privatisation calls (``upload_noise_std``, ``clip``).
# True ε figures are by exact μ-GDP composition at full participation (q = 1, the benchmark's
# designs): T Gaussian rounds with noise multipliers σ_t compose to μ = √(Σ_t 1/σ_t²), which
# at the claimed σ gives 0.91 at a claimed ε = 1 and 3.70 at 4 (δ = 1e-5; the RDP accountant's
# claim is a little looser).


class NoiseHalvedFromMidRun(DPFedAvg):
    """Schedule bug: from round ⌊T/2⌋ on, half the accounted noise std; true ε ≈ 1.52 at a claimed
    1, 6.31 at 4 (μ × √(5/2), T even)."""

    name = "dp-fedavg-noise-halved-from-mid-run"

    def upload_noise_std(self, ctx):
        std = super().upload_noise_std(ctx)
        return std / 2 if ctx.round >= ctx.training.rounds // 2 else std


class NoiseShrunkAfterFirstRound(DPFedAvg):
    """Decay bug: from round 2 on, 0.8 of the accounted noise std; true ε ≈ 1.15-1.17 at a claimed
    1, 4.68-4.77 at 4 (μ × 1.23-1.25, T = 10-60): a leak below 2ε, the power's yardstick."""

    name = "dp-fedavg-noise-shrunk-after-first-round"
    factor = 0.8

    def upload_noise_std(self, ctx):
        std = super().upload_noise_std(ctx)
        return self.factor * std if ctx.round >= 1 else std


class ClipsAtThreeTimesTheBound(DPFedAvg):
    """Units bug: clips to 3·S (a per-epoch bound applied to a 3-epoch update), noise and claim for
    S; true ε ≈ 3.11 at a claimed 1, 13.8 at 4 (μ × 3)."""

    name = "dp-fedavg-clips-at-three-times-the-bound"
    factor = 3.0

    def clip(self, updates):
        bound = self.factor * self.params.clip
        if self.params.clip_mode == "flat":
            return clip_rows(updates, bound)
        return clip_rows_per_tensor(updates, bound, list(self.layout.slices().values()))


class NoiseOverCountNotItsRoot(DPFedAvg):
    """Share bug: each upload's noise std is S·σ/|P_t|, not S·σ/√|P_t|; true ε ≈ 4.9 at a claimed 1,
    23 at 4 with 20 clients (μ × √|P_t|)."""

    name = "dp-fedavg-noise-over-count-not-its-root"

    def upload_noise_std(self, ctx):
        return self.params.clip * self.params.noise_multiplier / ctx.participant_count


# ---------------------------------------------------------------- bugs written as a user writes them
# A subclass whose ``privatize`` clips and noises plain tensors, each client's noise from the
# round's keyed stream (``ctx.client_generator``) as the engine's own defenses draw it. The audits
# must meet these bugs where the real uploads meet them: no hook of DP-FedAvg's is involved.


class UserWrittenHonest(DPFedAvg):
    """DP-FedAvg's privatisation rewritten with plain tensor code, correctly: flat clip to S, each
    upload N(0, (σS)²/|P_t|) from its client's stream."""

    name = "dp-fedavg-user-written"

    def user_noise(self, ctx, std):
        """[|P_t|, d] noise: row i from participant i's stream, scaled to ``std``."""
        dim = ctx.layout.dim
        return torch.stack([torch.randn(dim, generator=ctx.client_generator(int(c), "noise")) for c in ctx.participants]) * std

    def privatize(self, updates, ctx):
        norms = updates.norm(dim=1, keepdim=True)
        clipped = updates * torch.clamp(self.params.clip / norms.clamp_min(1e-12), max=1.0)
        std = self.params.clip * self.params.noise_multiplier / math.sqrt(len(updates))
        return clipped + self.user_noise(ctx, std).to(clipped), {}


class UserHalvedNoise(UserWrittenHonest):
    """The user's rewrite with half the accounted noise std (true ε at a claimed 4: ≈ 8.5)."""

    name = "dp-fedavg-user-halved-noise"

    def user_noise(self, ctx, std):
        return super().user_noise(ctx, std / 2)


class UserNoiseCancelledInPairs(UserWrittenHonest):
    """Each odd participant uploads the negation of the previous one's noise ("antithetic" noise
    that keeps each upload's variance): the pairs' noise cancels in the sum, which carries one
    client's share at most."""

    name = "dp-fedavg-user-noise-cancelled-in-pairs"

    def user_noise(self, ctx, std):
        noise = super().user_noise(ctx, std)
        pairs = len(noise) // 2 * 2
        noise[1:pairs:2] = -noise[0:pairs:2]
        return noise


class UserNoiseReusedEveryRound(UserWrittenHonest):
    """Each client's noise stream keyed by the run's seed and the client, not the round: the same
    draw every round, so consecutive models' difference carries none."""

    name = "dp-fedavg-user-noise-reused-every-round"

    def user_noise(self, ctx, std):
        dim = ctx.layout.dim
        return torch.stack([torch.randn(dim, generator=torch_generator(ctx.seed, "client", int(c), "noise"))
                            for c in ctx.participants]) * std


class UserUniformNoise(UserWrittenHonest):
    """Uniform noise of the accounted variance (±√3·std): the same second moment, bounded support,
    an unbounded privacy loss."""

    name = "dp-fedavg-user-uniform-noise"

    def user_noise(self, ctx, std):
        dim = ctx.layout.dim
        return torch.stack([(torch.rand(dim, generator=ctx.client_generator(int(c), "noise")) * 2 - 1)
                            for c in ctx.participants]) * (std * math.sqrt(3))


class UserGlobalRandomNoise(UserWrittenHonest):
    """Honest noise from torch's global generator (``torch.randn``), as most user code draws it."""

    name = "dp-fedavg-user-global-random-noise"

    def user_noise(self, ctx, std):
        return torch.randn(len(ctx.participants), ctx.layout.dim) * std


class UserClockSeededNoise(UserWrittenHonest):
    """Honest noise from a generator seeded from the clock: no seed the audit sets reaches it, so
    two computations of one round differ and the canaries' path cannot be isolated."""

    name = "dp-fedavg-user-clock-seeded-noise"

    def user_noise(self, ctx, std):
        generator = torch.Generator().manual_seed(time.time_ns())
        return torch.randn(len(ctx.participants), ctx.layout.dim, generator=generator) * std


class ClaimsSamplingItDoesNotDo(DPFedAvg):
    """The accountant is told the clients are sampled at q = 0.25 (and calibrates σ for it), while
    the rounds run as configured — every client every round in the benchmark's designs: the claim's
    amplification by sampling describes a sampling that never happens."""

    name = "dp-fedavg-claims-sampling-it-does-not-do"
    told_rate = 0.25

    def told(self, training):
        return dataclasses.replace(training, sampling="poisson", client_rate=self.told_rate, clients_per_round=None)

    def noise_reach(self, training, num_clients, rounds=None):
        return super().noise_reach(self.told(training), num_clients, rounds)

    def schedule(self, training, num_clients, rounds=None):
        return super().schedule(self.told(training), num_clients, rounds)
