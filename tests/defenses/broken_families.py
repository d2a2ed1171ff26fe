"""Deliberately broken twins of the papers' client-level defenses that keep their honest claims —
what the Dirac canary audit must catch in each family (``dpfl-audit run`` names them as
``tests.defenses.broken_families:Class``).

Each bug sits where the family's own code puts it, the accountant still told the configured σ
and S:

* **LUS / BLUR+LUS** (Cheng et al. 2022, Alg. 2): the noise step halved through DP-FedAvg's own
  hook (:class:`BlurLusHalvedNoise`), halved from round ⌊T/2⌋ on (:class:`LusNoiseHalvedFromMidRun`,
  a schedule bug), and a user's rewrite that "keeps the update's scale" by dividing the sparsified,
  *clipped* update by the kept share 1 − c (:class:`UserLusRescaledAfterClip`: sensitivity S/(1 − c));
* **top-k / rand-k masks** (Hu, Guo, Gong 2022): rand-k with halved noise (:class:`RandKHalvedNoise`),
  and a user's rand-k rewrite made "unbiased" by scaling the kept coordinates by d/k *after* the
  clip (:class:`UserRandKUnbiasedAfterClip`: sensitivity S·d/k), top-k with its noise halved in a
  rewrite (:class:`UserTopKHalvedNoise`);
* **subset training** (Kerkouche et al. 2021, Alg. 3): FL-TOP-DP and FL-STD-DP whose rewritten
  round draws half the noise (:class:`UserFLTopHalvedNoise`, :class:`UserFLStdHalvedNoise`), and
  FL-STD-DP whose clip misses the coordinates of every odd index — a bug only in the dense-row
  code, which one probe per tensor would miss (:class:`UserFLStdClipSkipsOddCoordinates`);
* a DP-FedAvg whose rewrite clips every coordinate but those of odd index
  (:class:`UserClipSkipsOddCoordinates`), the same dense-row bug in the plain algorithm;
* **NbAFL** (Wei et al. 2020, Alg. 1: clip the local *model*, add N(0, σ_U²)): a user's rewrite
  with half σ_U (:class:`UserNbAFLHalvedNoise`), and one whose model clip leaves the odd
  coordinates as they were (:class:`UserNbAFLClipSkipsOddCoordinates`).

The user-style rewrites draw their noise as user code does — from torch's global generator.
"""

from __future__ import annotations

import math

import torch

from defenses.blocks.clipping import clip_rows
from defenses.blur_lus import DPFedAvgBLURLUS, DPFedAvgLUS, lus_mask
from defenses.fed_smp import FedSMPRandK, FedSMPTopK
from defenses.fedavg import DPFedAvg
from defenses.fl_std import FLStdDP
from defenses.fl_top import FLTopDP
from defenses.nbafl import NbAFL, run_state, uplink_std
from defenses.subset_training import run_clip

# ---------------------------------------------------------------- LUS and BLUR+LUS


class BlurLusHalvedNoise(DPFedAvgBLURLUS):
    """BLUR+LUS whose uploads carry half the noise std the claim accounts for."""

    name = "dp-fedavg-blur-lus-halved-noise"

    def upload_noise_std(self, ctx):
        return super().upload_noise_std(ctx) / 2


class LusNoiseHalvedFromMidRun(DPFedAvgLUS):
    """LUS with half the noise std from round ⌊T/2⌋ on (a schedule bug: the first rounds are honest)."""

    name = "dp-fedavg-lus-noise-halved-from-mid-run"

    def upload_noise_std(self, ctx):
        std = super().upload_noise_std(ctx)
        return std / 2 if ctx.round >= ctx.training.rounds // 2 else std


class UserLusRescaledAfterClip(DPFedAvgLUS):
    """LUS rewritten by a user who restores the sparsified update's scale — the clipped update
    divided by the kept share 1 − c — after the clip: every upload may carry S/(1 − c)."""

    name = "dp-fedavg-lus-user-rescaled-after-clip"

    def privatize(self, updates, ctx):
        sparse = updates * lus_mask(updates, ctx, self.params.lus_sparsity, self.params.lus_gradient)
        norms = sparse.norm(dim=1, keepdim=True)
        clipped = sparse * torch.clamp(self.params.clip / norms.clamp_min(1e-12), max=1.0) / (1 - self.params.lus_sparsity)
        std = self.params.clip * self.params.noise_multiplier / math.sqrt(len(updates))
        return clipped + torch.randn_like(clipped) * std, {}


# ---------------------------------------------------------------- top-k and rand-k masks (Fed-SMP)


class RandKHalvedNoise(FedSMPRandK):
    """Fed-SMP rand-k with half the accounted noise std, through its own noise step."""

    name = "fed-smp-randk-halved-noise"

    def upload_noise_std(self, ctx):
        return super().upload_noise_std(ctx) / 2


class UserRandKUnbiasedAfterClip(FedSMPRandK):
    """rand-k rewritten by a user who makes the sparsifier unbiased — the kept coordinates scaled by
    d/k — after the clip, where it multiplies the sensitivity by d/k."""

    name = "fed-smp-randk-user-unbiased-after-clip"

    def privatize(self, updates, ctx):
        dim = updates.shape[1]
        keep = self.kept(dim)
        mask = torch.zeros_like(updates)
        for i, client in enumerate(ctx.participants):
            mask[i, torch.randperm(dim, generator=ctx.client_generator(int(client), "mask"))[:keep]] = 1.0
        clipped = clip_rows(updates * mask, self.params.clip)[0] * (dim / keep)
        std = self.params.clip * self.params.noise_multiplier / math.sqrt(len(updates))
        return clipped + torch.randn_like(clipped) * std, {}


class UserTopKHalvedNoise(FedSMPTopK):
    """Fed-SMP top-k rewritten by a user, with half the accounted noise std."""

    name = "fed-smp-topk-user-halved-noise"

    def privatize(self, updates, ctx):
        keep = self.kept(updates.shape[1])
        mask = torch.zeros_like(updates).scatter_(1, updates.abs().topk(keep, dim=1).indices, 1.0)
        clipped = clip_rows(updates * mask, self.params.clip)[0]
        std = self.params.clip * self.params.noise_multiplier / math.sqrt(len(updates))
        return clipped + torch.randn_like(clipped) * std / 2, {}


# ---------------------------------------------------------------- subset training (FL-TOP family)


def _subset_round(defense, updates, ctx, noise_scale: float = 1.0, skip_odd: bool = False):
    """The FL-TOP family's round (Alg. 3) as a user rewrites it: restrict to the trainable
    coordinates, clip to the run's S (or, with ``skip_odd``, leave the odd coordinates unclipped),
    add N(0, (Sσ)²/|𝕂|)·``noise_scale`` on the exchanged coordinates."""
    mask = defense.trainable(ctx)
    keep = torch.ones(updates.shape[1], dtype=updates.dtype) if mask is None else mask.to(updates.dtype)
    sparse = updates * keep
    clip = run_clip(ctx)
    clipped = clip_rows(sparse, clip)[0]
    if skip_odd:
        clipped[:, 1::2] = sparse[:, 1::2]
    std = clip * defense.params.noise_multiplier / math.sqrt(len(ctx.participants))
    return clipped + torch.randn_like(clipped) * std * noise_scale * keep, {}


class UserFLTopHalvedNoise(FLTopDP):
    """FL-TOP-DP's round rewritten with half the noise std."""

    name = "fl-top-dp-user-halved-noise"

    def privatize(self, updates, ctx):
        return _subset_round(self, updates, ctx, noise_scale=0.5)


class UserFLStdHalvedNoise(FLStdDP):
    """FL-STD-DP's round rewritten with half the noise std."""

    name = "fl-std-dp-user-halved-noise"

    def privatize(self, updates, ctx):
        return _subset_round(self, updates, ctx, noise_scale=0.5)


class UserFLStdClipSkipsOddCoordinates(FLStdDP):
    """FL-STD-DP's round rewritten with a clip that leaves every odd coordinate as it was."""

    name = "fl-std-dp-user-clip-skips-odd-coordinates"

    def privatize(self, updates, ctx):
        return _subset_round(self, updates, ctx, skip_odd=True)


class UserClipSkipsOddCoordinates(DPFedAvg):
    """DP-FedAvg rewritten with a clip that leaves every odd coordinate as it was (noise honest)."""

    name = "dp-fedavg-user-clip-skips-odd-coordinates"

    def privatize(self, updates, ctx):
        clipped = clip_rows(updates, self.params.clip)[0]
        clipped[:, 1::2] = updates[:, 1::2]
        std = self.params.clip * self.params.noise_multiplier / math.sqrt(len(updates))
        return clipped + torch.randn_like(clipped) * std, {}


# ---------------------------------------------------------------- NbAFL


def _nbafl_round(defense, updates, ctx, noise_scale: float = 1.0, skip_odd: bool = False):
    """NbAFL's upload (Alg. 1) as a user rewrites it: the local model w_0 + Δ clipped to C (or,
    with ``skip_odd``, its odd coordinates left as they were), N(0, σ_U²)·``noise_scale`` added,
    the server handed the noisy model less w_0."""
    models = ctx.global_vector[None, :] + updates
    clipped = clip_rows(models, defense.params.clip)[0]
    if skip_odd:
        clipped[:, 1::2] = models[:, 1::2]
    state = run_state(ctx)
    std = uplink_std(defense.params.clip, defense.params.epsilon, state.delta,
                     defense.exposures(ctx.training, ctx.num_clients), state.smallest)
    return clipped + torch.randn_like(clipped) * std * noise_scale - ctx.global_vector[None, :], {}


class UserNbAFLHalvedNoise(NbAFL):
    """NbAFL's upload rewritten with half σ_U."""

    name = "nbafl-user-halved-noise"

    def privatize(self, updates, ctx):
        return _nbafl_round(self, updates, ctx, noise_scale=0.5)


class UserNbAFLClipSkipsOddCoordinates(NbAFL):
    """NbAFL's upload rewritten with a model clip that leaves every odd coordinate as it was."""

    name = "nbafl-user-clip-skips-odd-coordinates"

    def privatize(self, updates, ctx):
        return _nbafl_round(self, updates, ctx, skip_odd=True)
