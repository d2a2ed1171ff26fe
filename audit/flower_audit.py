"""Audit a Flower deployment's central-DP claim: canary clients, the server's view, our claim.

Flower's DP-FedAvg wrappers — ``DifferentialPrivacyServerSideFixedClipping`` and
``DifferentialPrivacyClientSideFixedClipping`` (``flwr.server.strategy``; McMahan, Ramage,
Talwar, Zhang 2018, "Learning Differentially Private Recurrent Language Models", Alg. 1) — clip
every sampled client's model update to L2 norm S, let the inner strategy (``FedAvg``) average
them, and add N(0, (σ·S/m)²) to every coordinate of the average, m being ``num_sampled_clients``
(``flwr.supercore.differential_privacy.compute_stdv``). Flower states σ and S but no ε. This
module turns such a deployment into an audited system:

1. **Canary clients** (:func:`canary_mod`, a client-side Flower *Mod*): the nodes named in
   :class:`CanaryClients` never train. Canary i is *inserted* with probability ½ (its coin from
   the seeded stream ``(seed, "flower-canaries", "inserted")``); when sampled, an inserted canary
   uploads the received global model plus c·u_i, u_i a fixed random unit direction of the
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
2. **The server's view** (:class:`FlowerRecorder`, a strategy wrapper around Flower's DP
   wrapper): the global model before every round (the first is the initial model) and after
   every ``aggregate_fit``, the sampled clients, the clients available and the weights FedAvg
   averaged with. It also taps the inner strategy, so that the clipped average *before* Flower's
   noise is kept too: the difference is the noise Flower added, whose std can be set beside what
   the claim assumes (:meth:`FlowerView.noise_multipliers`).
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

import io
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Context, Message, MessageType
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from audit.core.atomic import write_bytes
from audit.core.errors import UserInputError, check_choice
from audit.core.seeding import derive_seed, numpy_rng, sklearn_random_state

# The Mod runs in every client process (a Ray actor per CPU in simulation): this module imports
# only numpy, Flower and the seeded streams at load time, and the accountant, attacks and
# reports (scipy, scikit-learn, matplotlib: seconds per process) where the audit needs them.
if TYPE_CHECKING:
    from attacks.attack_result import AttackResult
    from defenses.privacy.claims import PrivacyClaim
    from reports.document import Results

#: the attack's name in the results (its two observations: attacks.canaries.update_canaries.OBSERVATIONS)
ATTACK = "flower-client-canaries"
#: the neighbouring relation of the canary design: a held-out canary takes part with another (tiny) update
DESIGN_RELATION = "replace-one"
#: Flower's fixed-clipping DP wrappers (σ on the clipped average, std σ·S/m)
DP_WRAPPERS = (DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyClientSideFixedClipping)


def _flat(arrays: NDArrays) -> np.ndarray:
    """The model as one float64 vector, in Flower's array order."""
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)


# --------------------------------------------------------------------------- canary clients


@dataclass(frozen=True)
class CanaryClients:
    """Which nodes are canary clients and what they upload.

    ``ids`` are the values of ``node_config[id_key]`` (Flower's simulation sets ``partition-id``
    0..N−1) of the canary nodes; canary i is ``ids[i]``. ``clipping_norm`` is Flower's S; a canary
    uploads ``scale``·S·u_i, which the clip scales to S·u_i (hence ``scale`` > 1).
    """

    seed: int
    ids: tuple[int, ...]
    clipping_norm: float
    scale: float = 10.0
    id_key: str = "partition-id"
    num_examples: int = 1  # FedAvg weight: the same as every real client's (see "Uniform weights")
    held_out_norm: float = 1e-3  # a held-out canary's update norm, in units of S (small; not 0: see held_out_update)

    def __post_init__(self) -> None:
        ids = tuple(int(i) for i in self.ids)
        object.__setattr__(self, "ids", ids)
        if len(ids) < 4:
            raise UserInputError(f"canaries.ids: {len(ids)} canary clients; allowed: at least 4 distinct node ids")
        if len(set(ids)) != len(ids) or min(ids) < 0:
            raise UserInputError("canaries.ids: must be distinct non-negative node ids; allowed: e.g. range(N, N + m)")
        if not (self.clipping_norm > 0 and math.isfinite(self.clipping_norm)):
            raise UserInputError(f"canaries.clipping_norm: {self.clipping_norm} is not allowed; allowed: Flower's "
                                 "clipping norm S, a finite number > 0")
        if not (self.scale > 1 and math.isfinite(self.scale)):
            raise UserInputError(f"canaries.scale: {self.scale} is not allowed; allowed: a finite number > 1 (the clip "
                                 "must scale the canary's update down to exactly S)")
        if not (0 < self.held_out_norm < 1):
            raise UserInputError(f"canaries.held_out_norm: {self.held_out_norm} is not allowed; allowed: a number in "
                                 "(0, 1), a fraction of S")
        if self.num_examples < 1:
            raise UserInputError(f"canaries.num_examples: {self.num_examples} is not allowed; allowed: an integer ≥ 1")

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def inserted(self) -> np.ndarray:
        """The coins: bool [m], each canary inserted independently with probability ½."""
        return numpy_rng(self.seed, "flower-canaries", "inserted").random(self.count) < 0.5

    def direction(self, index: int, dim: int) -> np.ndarray:
        """u_i: a uniformly random unit vector of R^dim (a normalised Gaussian), float64."""
        raw = numpy_rng(self.seed, "flower-canaries", "direction", index).standard_normal(dim)
        return raw / np.linalg.norm(raw)

    def held_out_update(self, index: int, dim: int) -> np.ndarray:
        """A held-out canary's update: ``held_out_norm``·S·v_i, v_i a unit direction independent of u_i.
        Not zero: Flower's clip divides by the update's norm (flwr 1.42 ``clip_inputs_inplace``
        raises ZeroDivisionError on a zero update)."""
        raw = numpy_rng(self.seed, "flower-canaries", "held-out", index).standard_normal(dim)
        return self.held_out_norm * self.clipping_norm * raw / np.linalg.norm(raw)

    def directions(self, dim: int) -> np.ndarray:
        """All canaries' directions [m, dim]."""
        return np.stack([self.direction(i, dim) for i in range(self.count)])

    def index_of(self, context: Context) -> int | None:
        """The canary index of the node running ``context`` (None: a real client)."""
        if self.id_key not in context.node_config:
            raise UserInputError(f"canaries.id_key: '{self.id_key}' is not in the node's config; allowed: a key of "
                                 f"node_config, here {', '.join(sorted(context.node_config)) or 'none'}")
        node = int(context.node_config[self.id_key])
        return self.ids.index(node) if node in self.ids else None


def canary_mod(canaries: CanaryClients):
    """A Flower client Mod (``ClientApp(mods=[...])``) that makes the ``canaries`` nodes canary clients.

    On a TRAIN message a canary node does not call the client: it replies with the received
    global model w plus ``scale``·S·u_i when inserted, plus the tiny
    :meth:`CanaryClients.held_out_update` when held out (Andrew et al. 2024, Alg. 1: a canary's
    update is a fixed direction at the clip norm). Every other message, and
    every real client, passes through unchanged.
    """
    inserted = canaries.inserted

    def mod(msg: Message, ctxt: Context, call_next) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, ctxt)
        index = canaries.index_of(ctxt)
        if index is None:
            return call_next(msg, ctxt)
        fit_ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        arrays = parameters_to_ndarrays(fit_ins.parameters)
        dim = int(sum(a.size for a in arrays))
        step = (canaries.scale * canaries.clipping_norm * canaries.direction(index, dim) if inserted[index]
                else canaries.held_out_update(index, dim))
        out, start = [], 0
        for array in arrays:
            # float64 arithmetic, cast back: the upload keeps the model's dtype
            out.append((array.astype(np.float64) + step[start:start + array.size].reshape(array.shape)).astype(array.dtype))
            start += array.size
        arrays = out
        reply = FitRes(Status(Code.OK, "canary client"), ndarrays_to_parameters(arrays), canaries.num_examples, {})
        return Message(compat.fitres_to_recorddict(reply, keep_input=False), reply_to=msg)

    return mod


# --------------------------------------------------------------------------- the server's view


class _Delegate(Strategy):
    """A strategy that hands every call to ``strategy``."""

    def __init__(self, strategy: Strategy) -> None:
        super().__init__()
        self.strategy = strategy

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                      ) -> list[tuple[ClientProxy, FitIns]]:
        return self.strategy.configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]) -> tuple[Parameters | None, dict[str, Scalar]]:
        return self.strategy.aggregate_fit(server_round, results, failures)

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]
                           ) -> tuple[float | None, dict[str, Scalar]]:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return self.strategy.evaluate(server_round, parameters)


class _CleanTap(_Delegate):
    """Sits between Flower's DP wrapper and its inner strategy: keeps the clipped average before
    the wrapper adds its noise (observation only; the result passes through unchanged)."""

    def __init__(self, strategy: Strategy, sink: dict[int, np.ndarray]) -> None:
        super().__init__(strategy)
        self.sink = sink

    def aggregate_fit(self, server_round, results, failures):
        aggregated, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        if aggregated is not None:
            self.sink[server_round] = _flat(parameters_to_ndarrays(aggregated))
        return aggregated, metrics


class FlowerRecorder(_Delegate):
    """Wraps Flower's DP wrapper (``DifferentialPrivacyServerSideFixedClipping(FedAvg(...))`` or the
    client-side one) and records what the server sees; pass it to ``ServerAppComponents`` as the
    strategy. ``seed`` seeds Flower's sampling and noise per round (module docstring)."""

    def __init__(self, strategy: Strategy, seed: int | None = None) -> None:
        if not isinstance(strategy, DP_WRAPPERS):
            names = ", ".join(w.__name__ for w in DP_WRAPPERS)
            raise UserInputError(f"strategy: {type(strategy).__name__} is not allowed; allowed: Flower's {names}")
        super().__init__(strategy)
        self.seed = seed
        self.before: dict[int, np.ndarray] = {}
        self.after: dict[int, np.ndarray] = {}
        self.clean: dict[int, np.ndarray] = {}
        self.sampled: dict[int, int] = {}
        self.available: dict[int, int] = {}
        self.results: dict[int, int] = {}
        self.max_share: dict[int, float] = {}
        strategy.strategy = _CleanTap(strategy.strategy, self.clean)

    @property
    def dp(self) -> DifferentialPrivacyServerSideFixedClipping | DifferentialPrivacyClientSideFixedClipping:
        return self.strategy  # type: ignore[return-value]

    def configure_fit(self, server_round, parameters, client_manager):
        if self.seed is not None:
            # Flower's ClientManager.sample draws with the global `random`; Python seeds it with all bits of an int
            random.seed(derive_seed(self.seed, "flower", "sampling", server_round))
        self.before[server_round] = _flat(parameters_to_ndarrays(parameters))
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        # counted after the sample: Flower's ClientManager.sample first waits for min_available_clients
        # nodes, so before it the count can be short of the pool the sample was drawn from (nodes were
        # still registering: 197 of 204 seen in round 1), which would misstate N in the claim
        self.available[server_round] = client_manager.num_available()
        self.sampled[server_round] = len(instructions)
        return instructions

    def aggregate_fit(self, server_round, results, failures):
        if self.seed is not None:
            # Flower's add_gaussian_noise_inplace draws np.random.normal from numpy's global RandomState
            np.random.set_state(sklearn_random_state(self.seed, "flower", "noise", server_round).get_state())
        weights = np.array([res.num_examples for _, res in results], dtype=np.float64)
        self.results[server_round] = len(results)
        self.max_share[server_round] = float(weights.max() / weights.sum()) if weights.size and weights.sum() > 0 else 0.0
        aggregated, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        # no aggregate (failures): Flower's server keeps the previous global model
        self.after[server_round] = (_flat(parameters_to_ndarrays(aggregated)) if aggregated is not None
                                    else self.before[server_round])
        return aggregated, metrics

    def view(self) -> FlowerView:
        """The recorded rounds as a :class:`FlowerView`."""
        rounds = sorted(self.after)
        if not rounds or rounds != list(range(1, len(rounds) + 1)):
            raise UserInputError(f"recorder: rounds {rounds} were recorded; allowed: a finished run of rounds 1..T "
                                 "(pass the FlowerRecorder itself to ServerAppComponents)")
        clean = (np.stack([self.clean[t] for t in rounds]) if all(t in self.clean for t in rounds) else None)
        dp = self.dp
        return FlowerView(
            initial=self.before[1], iterates=np.stack([self.after[t] for t in rounds]), clean=clean,
            sampled=np.array([self.sampled[t] for t in rounds]), available=np.array([self.available[t] for t in rounds]),
            results=np.array([self.results[t] for t in rounds]), max_share=np.array([self.max_share[t] for t in rounds]),
            noise_multiplier=float(dp.noise_multiplier), clipping_norm=float(dp.clipping_norm),
            num_sampled_clients=int(dp.num_sampled_clients), wrapper=type(dp).__name__,
            inner=type(getattr(dp.strategy, "strategy", dp.strategy)).__name__)


@dataclass
class FlowerView:
    """What the server of a Flower run saw, as :class:`FlowerRecorder` recorded it (float64)."""

    initial: np.ndarray  # w_0 [d]
    iterates: np.ndarray  # w_1..w_T [T, d]
    clean: np.ndarray | None  # the clipped average before Flower's noise, per round [T, d]
    sampled: np.ndarray  # clients sampled per round [T]
    available: np.ndarray  # clients available per round [T]
    results: np.ndarray  # replies aggregated per round [T]
    max_share: np.ndarray  # the largest FedAvg weight share per round [T]
    noise_multiplier: float  # Flower's σ, as the DP wrapper holds it
    clipping_norm: float  # Flower's S
    num_sampled_clients: int  # Flower's m (the noise std is σ·S/m)
    wrapper: str = ""
    inner: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return len(self.iterates)

    @property
    def dim(self) -> int:
        return len(self.initial)

    def noise_multipliers(self) -> np.ndarray | None:
        """The noise multiplier each round's aggregate really carries: the std of (noisy − clean)
        average over the coordinates, times m/S (None without the clean averages)."""
        if self.clean is None:
            return None
        noise = self.iterates - self.clean
        return noise.std(axis=1) * self.num_sampled_clients / self.clipping_norm

    def save(self, path: str | Path) -> Path:
        """An .npz (no pickles: arrays and one JSON string)."""
        path = Path(path)
        meta = {"noise_multiplier": self.noise_multiplier, "clipping_norm": self.clipping_norm,
                "num_sampled_clients": self.num_sampled_clients, "wrapper": self.wrapper, "inner": self.inner,
                **self.meta}
        arrays: dict[str, Any] = {"initial": self.initial, "iterates": self.iterates, "sampled": self.sampled,
                  "available": self.available, "results": self.results, "max_share": self.max_share,
                  "meta": np.array(json.dumps(meta))}
        if self.clean is not None:
            arrays["clean"] = self.clean
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        write_bytes(path, buffer.getvalue())  # a temp name unique to this process, then a rename
        return path

    @classmethod
    def load(cls, path: str | Path) -> FlowerView:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            return cls(initial=data["initial"], iterates=data["iterates"],
                       clean=data.get("clean", None), sampled=data["sampled"],
                       available=data["available"], results=data["results"], max_share=data["max_share"],
                       noise_multiplier=meta.pop("noise_multiplier"), clipping_norm=meta.pop("clipping_norm"),
                       num_sampled_clients=meta.pop("num_sampled_clients"), wrapper=meta.pop("wrapper"),
                       inner=meta.pop("inner"), meta=meta)


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
        float(released.epsilon), float(delta), "client", released.accountant, mechanism,
        notes or "claim computed by dpfl-audit's accountant from Flower's noise multiplier and sampling "
                 "(Flower states σ and S, no ε)",
        relation=released.relation, adversary="released", adversaries=adversaries)


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

    at = measurement_delta(claim, "client", delta, DESIGN_RELATION)
    inserted = canaries.inserted
    described = (f"{canaries.count} canary clients (Flower Mod), {int(inserted.sum())} inserted, each uploading "
                 f"{canaries.scale:g}·S·u_i (clipped to S·u_i); held out: "
                 f"{canaries.held_out_norm:g}·S·v_i, v_i independent of u_i (replace-one design)")
    out = []
    for key, statistics in canary_statistics(view, canaries).items():
        result = canary_result(ATTACK, "client", statistics[None, :], inserted[None, :], at, canaries.seed,
                               f"{described}; observed: {OBSERVATIONS[key]}")
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
            if record.epsilon_kind.get(metric) == "lower_bound":
                bounds[f"{record.observation}: {metric}"] = estimate.value
    return {"claimed_epsilon": experiment.claim.epsilon if experiment.claim.is_private else None,
            "delta": experiment.claim.delta, "relation": experiment.claim.relation,
            "epsilon_lower_bounds": bounds, "verdict": experiment.soundness, "verdict_text": experiment.soundness_text}
