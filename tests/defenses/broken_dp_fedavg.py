"""Deliberately broken DP-FedAvg implementations that keep the honest claim — what an end-to-end
audit must catch (``dpfl-audit run`` names them as ``tests.defenses.broken_dp_fedavg:Class``).

Each is a bug of a kind found in real DP code: noise scaled wrongly while the accountant is told
the configured σ, and a clipping step that misses a client.
"""

from __future__ import annotations

from dataclasses import replace

from defenses.dirac_rows import DiracRows
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
        if isinstance(updates, DiracRows):
            values = uploads.values.clone()
            values[i] = updates.values[i]  # the raw value where the clipped one belonged
            return replace(uploads, values=values), diagnostics
        clipped = self.clip(updates)[0]
        uploads = uploads.clone()
        uploads[i] = uploads[i] + (updates[i] - clipped[i])
        return uploads, diagnostics
