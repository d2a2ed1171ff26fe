"""Deliberately broken LDP-FL rewrites that keep the paper's per-weight ε claim (Sun, Qian, Chen
2021, Alg. 2 and Thm 1) — what an audit of the per-weight ε-LDP claim must catch, written as a
user writes a ``privatize`` override (``tests.defenses.broken_ldp_fl:Class``):

* :class:`UserLDPFLBiasedCoin` — the two-point report c ± r·A(ε) drawn with the up-probability of
  2ε: p_up(c ± r) = e^{±2ε}/(1 + e^{±2ε}), a biased report whose likelihood ratio is e^{2ε};
* :class:`UserLDPFLValueTrace` — the honest report plus a trace of the clipped value,
  (w − c)/1000: no longer two-valued, so one report reveals w exactly (no finite ε);
* :class:`UserLDPFLWrittenHonest` — the same rewrite without a bug.
"""

from __future__ import annotations

import torch

from defenses.blocks.ldp import two_point, two_point_magnitude
from defenses.ldp_fl import LDPFL


def _reports(defense: LDPFL, updates: torch.Tensor, ctx, coin_epsilon: float, trace: float = 0.0):
    """LDP-FL's round (two-point reports of the clipped model, linked) as a user rewrites it: the
    up-probability drawn at ``coin_epsilon``, a ``trace`` of the clipped value added to each report."""
    models = ctx.global_vector[None, :].to(torch.float64) + updates.to(torch.float64)
    reports = torch.empty_like(models)
    epsilon = defense.params.epsilon
    for (c, r), part in zip(defense._ranges(models, ctx), ctx.layout.slices().values()):
        for i, client in enumerate(ctx.participants):
            generator = ctx.client_generator(int(client), f"ldp-{part.start}")
            w = torch.minimum(torch.maximum(models[i, part], c[i] - r[i]), c[i] + r[i])
            # two_point at coin_epsilon draws the coin; the report keeps ε's magnitude
            drawn = two_point(w, c[i], r[i], coin_epsilon, generator)
            up = drawn > c[i]
            magnitude = r[i] * two_point_magnitude(epsilon)
            reports[i, part] = torch.where(up, c[i] + magnitude, c[i] - magnitude) + trace * (w - c[i])
    return (reports - ctx.global_vector[None, :].to(torch.float64)).to(updates.dtype), {}


class UserLDPFLBiasedCoin(LDPFL):
    """LDP-FL whose report coin is drawn at 2ε (its claim keeps ε)."""

    name = "ldp-fl-user-biased-coin"

    def privatize(self, updates, ctx):
        return _reports(self, updates, ctx, 2 * self.params.epsilon)


class UserLDPFLValueTrace(LDPFL):
    """LDP-FL whose reports carry a trace (w − c)/1000 of the clipped value."""

    name = "ldp-fl-user-value-trace"

    def privatize(self, updates, ctx):
        return _reports(self, updates, ctx, self.params.epsilon, trace=1e-3)


class UserLDPFLWrittenHonest(LDPFL):
    """The same rewrite without a bug: the coin at ε, no trace (what the audits must not flag)."""

    name = "ldp-fl-user-written-honest"

    def privatize(self, updates, ctx):
        return _reports(self, updates, ctx, self.params.epsilon)
