"""AE-DPFL: private voting among agents with secure aggregation — Zhu, Yu, Wang et al. 2020,
"Voting-based Approaches for Differentially Private Federated Learning", a baseline of Cheng et al. 2022
(§6; the paper gives no details, so every choice here is ours).

1. Every agent trains a local model on its own data, without privacy.
2. The server holds K unlabeled queries x (here: half of the held-out split; the other half
   measures accuracy). Each agent votes the one-hot vector of its model's prediction plus
   N(0, σ_v²/N · I_C); secure aggregation reveals only the sum, a noisy vote histogram whose
   noise is N(0, σ_v² · I_C). The label of x is the histogram's argmax.
3. The server trains the global model on the K voted labels.

Adding or removing one agent changes each histogram by a one-hot vector (ℓ2 sensitivity 1),
so each query is a Gaussian mechanism with noise multiplier σ_v and the K queries compose to
RDP K·α/(2σ_v²) (data-independent analysis; the data-dependent PATE analysis of the original
paper is not used). There are no per-round updates, so gradient inversion does not apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import numpy_rng, seed_torch, torch_generator
from audit.core.vocabulary import Observer, Relation, Unit
from defenses.base import DEFENSES, NO_STATE, AccountingSettings, AuditHooks, Defense, PrivacyClaim
from defenses.blocks.flat import ParamLayout, parameters_of
from defenses.blocks.local_training import (
    TRAINERS,
    LocalObjective,
    LocalSchedule,
    client_batches,
    stacked_forward,
)
from defenses.blocks.noise import gaussian_rows
from defenses.federated.engine import chunk_size, optimizer_settings
from defenses.federated.evaluation import evaluate
from defenses.federated.release_probe import ReleaseProbe
from defenses.federated.round_metrics import divergence
from defenses.federated.training_job import TrainingConfig, TrainingDiverged, TrainingJob, TrainingOutcome
from defenses.privacy.accounting import GaussianSchedule, calibrate_noise, compute_epsilon
from defenses.privacy.claims import AdversaryClaim, gaussian_round_epsilon, server_notes

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class AEDPFLParams:
    noise_multiplier: float = field(default=20.0, metadata={"min": 0.0, "min_exclusive": True,
                                                            "help": "σ_v: std of the summed vote noise (sensitivity 1)"})
    queries: int = field(default=1000,
                         metadata={"min": 1, "help": "K: server queries (capped by the public half of the held-out split)"})
    local_epochs: int = field(default=20, metadata={"min": 1, "help": "epochs of each agent's non-private local training"})
    server_epochs: int = field(default=30, metadata={"min": 1, "help": "epochs of the server's training on the voted labels"})
    public_fraction: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True, "max_exclusive": True,
                                                          "help": "share of the held-out split used as the "
                                                                  "server's unlabeled data"})


def vote_histogram(predictions: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Noiseless vote counts [K, C] from the agents' predicted labels [N, K]."""
    agents, queries = predictions.shape
    histogram = torch.zeros(queries, num_classes, dtype=torch.float64, device=predictions.device)
    return histogram.scatter_add_(1, predictions.T.to(torch.int64), torch.ones(queries, agents, dtype=torch.float64,
                                                                               device=predictions.device))


@DEFENSES.register
class AEDPFL(Defense):
    name = "ae-dpfl"
    summary = "Private voting: agents' noisy one-hot votes, summed under secure aggregation, label server data"
    reference = "Zhu et al. 2020, Voting-based Approaches for Differentially Private Federated Learning"
    Params = AEDPFLParams
    private = True
    default_view = "aggregate"

    def queries(self, test_size: int) -> int:
        return max(1, min(self.params.queries, int(test_size * self.params.public_fraction)))

    def schedule(self, queries: int) -> GaussianSchedule:
        return GaussianSchedule(self.params.noise_multiplier, 1.0, queries)

    # The number of queries depends on the held-out split, known only when training; planning
    # uses the configured K, and training never exceeds it, so the planned claim is an upper bound.
    def calibrate(self, target_epsilon: float, delta: float, training: TrainingConfig, num_clients: int,
                  accounting: AccountingSettings) -> AEDPFL:
        sigma = calibrate_noise(target_epsilon, self.schedule(self.params.queries), delta,
                                accounting.accountant, accounting.conversion)
        return self.with_params(noise_multiplier=sigma)

    def _claim(self, queries: int, delta: float, accounting: AccountingSettings) -> PrivacyClaim:
        report = compute_epsilon(self.schedule(queries), delta, accounting.accountant, accounting.conversion)
        sigma = self.params.noise_multiplier
        mechanism = f"{queries} noisy-argmax votes, Gaussian σ_v={sigma:.4g} on each vote histogram (sensitivity 1)"
        notes = ("client-level; the server sees only the summed noisy votes (simulated secure aggregation); local models "
                 "never leave the agents")
        one_query = gaussian_round_epsilon(sigma, delta, accounting.accountant, accounting.conversion)
        # every agent votes on every query, so knowing who took part teaches the server nothing: the
        # released model (trained on the voted labels) and the server's histograms get the same figure
        adversaries = (
            AdversaryClaim(Observer.RELEASED, report.epsilon, delta, Relation.ADD_REMOVE, "the model trained on the voted labels",
                           report.label, rounds=queries, noise_multiplier=sigma, round_epsilon=one_query,
                           notes="post-processing of the noisy histograms"),
            AdversaryClaim(Observer.SERVER, report.epsilon, delta, Relation.ZERO_OUT, "the summed noisy vote histograms",
                           report.label,
                           rounds=queries, noise_multiplier=sigma, round_epsilon=one_query,
                           notes=server_notes("an agent that abstains votes the zero vector: the histogram moves by ≤ 1 in ℓ2")),
            AdversaryClaim.not_covered(Observer.LOCAL, "one agent's votes carry only its share σ_v/√N of the noise; secure "
                                                "aggregation is what hides them", "one agent's noisy votes"),
        )
        return PrivacyClaim(report.epsilon, delta, Unit.CLIENT, report.label, mechanism, notes, relation=Relation.ADD_REMOVE,
                            adversary=Observer.RELEASED, adversaries=adversaries)

    def noisy_histograms(self, clean: torch.Tensor, agents: int, seed: int) -> torch.Tensor:
        """What secure aggregation reveals: Σ_i (votes_i + N(0, σ_v²/N·I)) = the clean histograms [K, C]
        (the agents' summed one-hot, or zero, votes) plus every agent's noise share, agent i's from its
        own stream (float64)."""
        queries, classes = clean.shape
        share_std = self.params.noise_multiplier / math.sqrt(agents)
        total = clean.to(torch.float64).clone()
        for i in range(agents):
            generator = torch_generator(seed, "ae-dpfl", "agent", i, "votes")
            total += gaussian_rows(1, queries * classes, share_std, [generator], clean.device)[0].view(queries, classes).double()
        return total

    def privacy_claim(self, training, num_clients, rounds, delta, accounting, state=NO_STATE) -> PrivacyClaim:
        return self._claim(self.params.queries, delta, accounting)

    @staticmethod
    def predict(model, stacked: dict[str, torch.Tensor], x: torch.Tensor, budget: int = 1 << 24) -> torch.Tensor:
        """Labels [agents, K] predicted by each stacked agent model, in groups of bounded memory."""
        agents = next(iter(stacked.values())).shape[0]
        group = max(1, budget // max(1, x.numel()))
        labels = []
        model.eval()
        with torch.no_grad():
            for start in range(0, agents, group):
                part = {n: p[start:start + group] for n, p in stacked.items()}
                count = next(iter(part.values())).shape[0]
                labels.append(stacked_forward(model, part, x.unsqueeze(0).expand(count, *x.shape)).argmax(-1))
        model.train()
        return torch.cat(labels)

    def train(self, job: TrainingJob, progress=None) -> TrainingOutcome:
        training, device = job.training, job.device
        seed_torch(job.seed, "torch")
        model = job.model_factory().to(device)
        model.train()
        layout = ParamLayout.of(model)
        initial = parameters_of(model)
        agents = len(job.clients)
        trainer = TRAINERS[training.engine]
        sgd = optimizer_settings(training, training.lr)

        # 1. the agents' non-private local models
        batches = [client_batches(len(c), "epochs", self.params.local_epochs, training.batch_size,
                                  numpy_rng(job.seed, "ae-dpfl", "agent", i, "batches")) for i, c in enumerate(job.clients)]
        schedule = LocalSchedule.build(batches, job.clients)
        order = list(range(agents))
        size = chunk_size(training, layout.dim)

        # 2. the server's queries and the held-out evaluation half
        split = numpy_rng(job.seed, "ae-dpfl", "public-split").permutation(len(job.test_y))
        queries = self.queries(len(job.test_y))
        public = torch.as_tensor(split[:queries], device=job.test_x.device)
        held_out = torch.as_tensor(split[int(len(split) * self.params.public_fraction):], device=job.test_x.device)
        query_x, query_y = job.test_x[public], job.test_y[public]

        predictions = torch.empty(agents, queries, dtype=torch.int64, device=device)
        for start in range(0, agents, size):
            chunk = order[start:start + size]
            local = trainer(model, LocalObjective(), initial, schedule.select(chunk), job.pool_x, job.pool_y, sgd)
            what = divergence(local)
            if what is not None:  # the agents' votes would be argmaxes of NaN
                raise TrainingDiverged(1, f"{what} of the agents' local models")
            predictions[start:start + len(chunk)] = self.predict(model, local, query_x)

        # 3. noisy votes, summed under secure aggregation
        num_classes = int(model(query_x[:1]).shape[-1])
        clean = vote_histogram(predictions, num_classes)
        noisy = self.noisy_histograms(clean, agents, job.seed)
        voted = noisy.argmax(1)

        # 4. the server trains on the voted labels
        server_batches = client_batches(queries, "epochs", self.params.server_epochs, training.batch_size,
                                        numpy_rng(job.seed, "ae-dpfl", "server", "batches"))
        server_schedule = LocalSchedule.build([server_batches], [np.arange(queries)])
        final = trainer(model, LocalObjective(), initial, server_schedule, query_x, voted, sgd)
        final = {n: p[0] for n, p in final.items()}

        members = torch.as_tensor(np.concatenate(job.clients), device=job.pool_x.device)
        test_loss, test_accuracy = evaluate(model, final, job.test_x[held_out], job.test_y[held_out])
        train_loss, train_accuracy = evaluate(model, final, job.pool_x[members], job.pool_y[members])
        claim = self._claim(queries, job.delta, job.accounting)
        row = {"round": 1, "participants": agents, "queries": queries,
               "vote_accuracy": float((voted == query_y).double().mean()),
               "noiseless_vote_accuracy": float((clean.argmax(1) == query_y).double().mean()),
               "test_loss": test_loss, "test_accuracy": test_accuracy, "train_loss": train_loss,
               "train_accuracy": train_accuracy, "epsilon": claim.epsilon}
        what = divergence(final, row, ("train_loss",) * bool(len(members)) + ("test_loss",) * bool(len(held_out)))
        if what is not None:
            row["diverged"] = what
            raise TrainingDiverged(1, what, [row])
        view = {"round_0001/votes": noisy.float()} if job.record.wants_uploads(1, 1) else {}
        globals_ = {"round_0001": layout.flatten(final)} if job.record.wants_global(1, 1) else {}
        return TrainingOutcome(final, layout, [row], claim, view, globals_)

    def audit_hooks(self) -> VotingAuditHooks:
        return VotingAuditHooks(self)


class VotingAuditHooks(AuditHooks):
    """AE-DPFL as the audits see it: agents upload noisy votes, not model updates (no canary
    clients), and the conformance audit drives one query's vote histogram."""

    defense: AEDPFL

    def __init__(self, defense: AEDPFL):
        super().__init__(defense, update_canaries=False, engine_rounds=False)

    def release_probe(self, job) -> ReleaseProbe:
        """One query's vote histogram: contribution row i is agent i's vote (its argmax class as a one-hot
        vector, or nothing for an all-zero row: an abstaining agent)."""
        defense = self.defense
        agents = len(job.clients)
        classes = int(job.pool_y.max()) + 1

        def views(contributions: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
            votes = torch.zeros(agents, classes, dtype=torch.float64)
            voting = contributions.abs().sum(1) > 0
            votes[voting, contributions[voting].abs().argmax(1)] = 1.0
            noisy = defense.noisy_histograms(votes.sum(0, keepdim=True), agents, seed)[0]
            return {Observer.RELEASED: noisy, Observer.SERVER: noisy}

        return ReleaseProbe(classes, agents, 1.0, views, "an agent's one-hot vote on one query", defense)
