"""LDP-FL: Sun, Qian, Chen, "LDP-FL: Practical Private Aggregation in Federated Learning with Local
Differential Privacy" (IJCAI 2021; Alg. 1–3, §3.3, §4).

Each selected client trains locally with plain SGD, clips every scalar of its *model* into
[c − r, c + r] and replaces it by an ε-LDP report (:mod:`defenses.blocks.ldp`: the two-point mechanism
by default, Laplace or Duchi as alternatives). It then splits the model into (id, value) items
and sends them in random order over an anonymous channel, so the cloud sees, per id, an
unlabelled multiset of k values; it averages them per id (FedAvg with equal shards).

Ranges: ``range_mode: fixed`` (c, r) for every scalar (MNIST (0, 0.075)); or
``adaptive`` per parameter tensor with ``center: zero`` (c = 0, r = max − min, the paper's §5) or
``midpoint`` (c = (max + min)/2, r = (max − min)/2, §3.3), the min/max coming from
``range_source``: ``global_prev`` (default: the received global model — public), ``secure_minmax``
(the round's clients' trained models under an ideal secure min/max — leaks a data-dependent
range) or ``local`` (each client's own range — unsafe: a per-client range gives each client a
distinctive pair of output values that links its items). Under ``center: zero`` the paper's
r = max − min covers [min, max] only when min ≤ 0 ≤ max; a tensor on one side of zero (at the
extreme a near-constant one, all weights ≈ 0.5 with width 1e-9) would be clipped to ±r and its
average collapse towards 0, so r is widened to max(max − min, |max|, |min|), the smallest radius
about 0 that holds the tensor: M is then unbiased on it (Sun et al. 2021, Eq. 4), and r is the
paper's wherever the paper's range covers the tensor.

What the server sees (``server_view``): ``unlinked`` — per-id multisets with no identities (each
column of the k × d matrix permuted independently; the per-id mean is unchanged), or ``linked``
(an ablation where anonymity fails: each client's row with its id).

The claim is the paper's: ε per weight per report (pure LDP, Thm 1). Beside it: the linked
per-round figure d·ε and the total m·d·ε (m = rounds a client takes part in), and whether the
shuffling amplification of Feldman–McMillan–Talwar 2021 applies to the k reports of an id at all.
Thm 1 holds for a range fixed independently of the reports' inputs. A ``secure_minmax`` or
``local`` range is computed from the clients' trained models and is itself released — every
report is c ± rA, so one report reveals r — with no noise of its own, so no observer gets a
finite ε: the claim is "not covered" for every observer (the paper's per-weight ε stays beside
it as ``paper_per_weight``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.vocabulary import Observer, Relation, Unit
from defenses.base import DEFENSES, NO_STATE, AuditHooks, Defense, PrivacyClaim
from defenses.blocks.ldp import perturb, shuffle_amplification
from defenses.federated.release_probe import ReleaseProbe, engine_probe
from defenses.federated.training_job import RoundContext, TrainingConfig
from defenses.privacy.claims import AdversaryClaim, server_notes

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class LDPFLParams:
    epsilon: float = field(default=1.0, metadata={"min": 0.0, "min_exclusive": True,
                                                  "help": "ε per weight per report (set from 'epsilons')"})
    mechanism: Literal["two_point", "laplace", "duchi"] = field(default="two_point",
                                                                metadata={"help": "per-scalar ε-LDP mechanism"})
    range_mode: Literal["fixed", "adaptive"] = field(default="fixed", metadata={"help": "one (c, r) for all, or per tensor"})
    center: float = field(default=0.0, metadata={"help": "c for range_mode fixed"})
    radius: float = field(default=0.075, metadata={"min": 0.0, "min_exclusive": True,
                                                   "help": "r for range_mode fixed (paper's MNIST: 0.075); adaptive: the radius "
                                                           "of a constant tensor"})
    adaptive_center: Literal["zero", "midpoint"] = field(default="zero",
                                                         metadata={"help": "adaptive: c = 0, r = max − min; or the midpoint"})
    range_source: Literal["global_prev", "secure_minmax", "local"] = field(
        default="global_prev", metadata={"help": "where an adaptive range's min/max come from (local is unsafe)"})
    server_view: Literal["unlinked", "linked"] = field(default="unlinked",
                                                       metadata={"help": "shuffled per-id multisets, or linked rows"})
    shuffle_delta: float = field(default=1e-5, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True, "max_exclusive": True,
                                                         "help": "δ for reporting the shuffling-amplification bound"})


@DEFENSES.register
class LDPFL(Defense):
    name = "ldp-fl"
    summary = "Per-weight ε-LDP (two-point, Laplace or Duchi) on clipped local models, split and shuffled"
    reference = ("Sun, Qian, Chen 2021, LDP-FL: Practical Private Aggregation in Federated Learning with Local "
                 "Differential Privacy")
    Params = LDPFLParams
    private = True

    @property
    def observes(self) -> str:
        return "shuffled" if self.params.server_view == "unlinked" else "uploads"

    def validate(self, training: TrainingConfig, num_clients: int) -> None:
        if training.aggregation != "uniform" or training.server_lr != 1.0:
            raise UserInputError("training.aggregation: ldp-fl averages the reported weights per id; use "
                                 "'uniform' and server_lr 1")

    def range_leak(self) -> str | None:
        """Why the clipping range is a non-private release of the clients' data (None: it is public)."""
        if self.params.range_mode != "adaptive" or self.params.range_source == "global_prev":
            return None
        whose = "each client's own trained model" if self.params.range_source == "local" else "the round's trained models"
        return (f"the {self.params.range_source} range is computed from {whose} and released without noise (every report "
                "is c ± rA, so one report reveals r); the per-weight ε does not cover that release")

    def calibrate(self, target_epsilon, delta, training, num_clients, accounting) -> LDPFL:
        if self.range_leak():
            raise UserInputError(f"defenses: ldp-fl with range_source '{self.params.range_source}' makes no finite claim "
                                 "(its range is a non-private release); remove its 'epsilons' or use range_source "
                                 "'global_prev' or range_mode 'fixed'")
        return self.with_params(epsilon=target_epsilon)

    # ---------------------------------------------------------------- the claim

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE) -> PrivacyClaim:
        eps = self.params.epsilon
        dim = self.layout.dim if self.layout is not None else 0
        participation = training.sampling_rate(num_clients)
        reports = max(1, int(round(participation * num_clients)))
        rounds_taken = rounds * participation
        amplified = shuffle_amplification(eps, reports, self.params.shuffle_delta)
        alternatives = {"linked_per_round": dim * eps, "linked_total": rounds_taken * dim * eps}
        notes = [f"per weight per report (pure ε-LDP, Thm 1); the paper argues that unlinkable items keep the budget at ε: "
                 f"if items can be linked, a client's model costs d·ε = {dim * eps:.4g} per round and "
                 f"{rounds_taken * dim * eps:.4g} over the {rounds_taken:g} rounds it takes part in"]
        if amplified is None:
            threshold = math.log(reports / (16 * math.log(4 / self.params.shuffle_delta)))
            notes.append(f"shuffling amplification (Feldman–McMillan–Talwar 2021) is inapplicable: k = {reports} reports per id "
                         f"need ε0 ≤ ln(k/(16 ln(4/δ))) = {threshold:.3g}")
        else:
            alternatives["shuffled_per_id_round"] = amplified
            notes.append(f"shuffling amplification applies per id and round: ε_c = {amplified:.4g} at δ = "
                         f"{self.params.shuffle_delta:g}, still composing over ids and rounds")
        leak = self.range_leak()
        if leak:
            notes.insert(0, f"range_leak: no finite ε: {leak}" + (" (unsafe: per-client ranges also link a client's items)"
                                                                  if self.params.range_source == "local" else "")
                         + f"; the paper's per-weight ε = {eps:g} is kept as the alternative paper_per_weight")
            alternatives["paper_per_weight"] = eps
        if self.params.server_view == "linked":
            notes.append("server view 'linked': the server sees each client's full report with its identity (ablation)")
        mechanism = (f"{self.params.mechanism} on every scalar of the clipped local model, "
                     + (f"fixed range c = {self.params.center:g}, r = {self.params.radius:g}" if self.params.range_mode == "fixed"
                        else f"adaptive per-tensor range ({self.params.adaptive_center}, {self.params.range_source})"))
        observers = ((Observer.RELEASED, "the global model after every round"),
                     (Observer.SERVER, "per-id multisets of reports" if self.params.server_view == "unlinked"
                      else "every client's reports, linked"),
                     (Observer.LOCAL, "one client's report of one weight"))
        if leak:
            adversaries = tuple(AdversaryClaim.not_covered(adversary, leak, observes) for adversary, observes in observers)
            return PrivacyClaim(math.inf, 0.0, Unit.WEIGHT, "per-weight ε-LDP (LDP-FL Thm 1)", mechanism, "; ".join(notes),
                                alternatives, relation=Relation.NONE, adversary=Observer.LOCAL, adversaries=adversaries)
        # pure ε-LDP per report: post-processing keeps it for every observer of the reports
        per_report = "ε per weight per report (any two values of one weight)"
        adversaries = tuple(
            AdversaryClaim(adversary, eps, 0.0, Relation.REPLACE_ONE, observes, "per-weight ε-LDP (LDP-FL Thm 1)", rounds=1,
                           round_epsilon=eps, notes=server_notes(per_report) if adversary == Observer.SERVER else per_report)
            for adversary, observes in observers)
        return PrivacyClaim(eps, 0.0, Unit.WEIGHT, "per-weight ε-LDP (LDP-FL Thm 1)", mechanism, "; ".join(notes), alternatives,
                            relation=Relation.REPLACE_ONE, adversary=Observer.LOCAL, adversaries=adversaries)

    # ---------------------------------------------------------------- the mechanism

    def _ranges(self, models: torch.Tensor, ctx: RoundContext) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(c, r) per client and parameter tensor, as tensors of shape [C] each."""
        clients = models.shape[0]
        ranges = []
        for part in ctx.layout.slices().values():
            if self.params.range_mode == "fixed":
                c = torch.full((clients,), self.params.center, dtype=torch.float64, device=models.device)
                r = torch.full((clients,), self.params.radius, dtype=torch.float64, device=models.device)
            else:
                if self.params.range_source == "global_prev":
                    values = ctx.global_vector[part].to(torch.float64)
                    low, high = values.min().expand(clients), values.max().expand(clients)
                elif self.params.range_source == "secure_minmax":
                    values = models[:, part].to(torch.float64)
                    low, high = values.min().expand(clients), values.max().expand(clients)
                else:
                    values = models[:, part].to(torch.float64)
                    low, high = values.min(1).values, values.max(1).values
                if self.params.adaptive_center == "zero":
                    # the paper's r = max − min, widened where [−r, r] would not hold [min, max] (a tensor on
                    # one side of zero): clipping it to ±r would pull its average towards 0
                    c, r = torch.zeros_like(low), torch.maximum(high - low, torch.maximum(high.abs(), low.abs()))
                else:
                    c, r = (high + low) / 2, (high - low) / 2
                # A constant tensor (max = min, e.g. a freshly initialised norm layer) has no width: the
                # plain "output c" would wipe it under center zero (c = 0) and freeze it otherwise. It
                # gets the range (its value, the fixed radius r) instead — public, like the values it
                # comes from under global_prev.
                constant = (high - low) <= 1e-12 * torch.maximum(high.abs(), low.abs()).clamp_min(1.0)
                c = torch.where(constant, (high + low) / 2, c)
                r = torch.where(constant, torch.full_like(r, self.params.radius), r)
            ranges.append((c, r))
        return ranges

    def privatize(self, updates: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict]:
        models = ctx.global_vector[None, :].to(torch.float64) + updates.to(torch.float64)
        reports = torch.empty_like(models)
        clipped = 0
        for (c, r), part in zip(self._ranges(models, ctx), ctx.layout.slices().values()):
            block = models[:, part]
            low, high = (c - r)[:, None], (c + r)[:, None]
            clipped += int(((block < low) | (block > high)).sum())
            for i, client in enumerate(ctx.participants):
                generator = ctx.client_generator(int(client), f"ldp-{part.start}")
                reports[i, part] = perturb(self.params.mechanism, block[i], c[i], r[i], self.params.epsilon, generator)
        uploads = (reports - ctx.global_vector[None, :].to(torch.float64)).to(updates.dtype)
        diagnostics = {"clipped_fraction": clipped / models.numel(),
                       "clip_input_norms": torch.linalg.vector_norm(updates.to(torch.float64), dim=1)}
        if self.params.server_view == "unlinked":
            uploads = split_and_shuffle(uploads, ctx.server_generator("shuffle"))
        return uploads, diagnostics

    def audit_hooks(self) -> PerWeightAuditHooks:
        return PerWeightAuditHooks(self)


class PerWeightAuditHooks(AuditHooks):
    """LDP-FL as the conformance audit drives it: per-weight neighbours, linked reports."""

    defense: LDPFL

    def release_probe(self, job) -> ReleaseProbe:
        """The engine's privatise path with linked reports (shuffling is post-processing of them, so the
        per-weight claim must hold before it); neighbours differ in one weight."""
        defense = self.defense
        linked = defense if defense.params.server_view == "linked" else defense.with_params(server_view="linked")
        probe = engine_probe(linked, job)
        return replace(probe, one_coordinate=True, contribution="a client's model update; one weight differs")


def split_and_shuffle(reports: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Alg. 3's effect, simulated: each id's k values arrive in random order and without their
    senders, i.e. every column of the k × d report matrix is permuted independently."""
    rows, cols = reports.shape
    keys = torch.rand(rows, cols, generator=generator).to(reports.device)
    order = keys.argsort(dim=0)
    return reports.gather(0, order)
