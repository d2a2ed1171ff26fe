"""The server's view of a Flower deployment under central DP: :class:`FlowerRecorder` wraps
Flower's fixed-clipping DP wrapper (McMahan, Ramage, Talwar, Zhang 2018, Alg. 1) and records the
global model before and after every round, the sampled and available clients, FedAvg's weights,
and — tapping the inner strategy — the clipped average before Flower's noise; :class:`FlowerView`
is that record, saved and loaded as an NPZ file. Seeded, it makes Flower's sampling and noise
repeatable (:mod:`audit.flower_audit`, "Reproducibility").
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from audit.core.atomic import write_bytes
from audit.core.errors import UserInputError
from audit.core.seeding import derive_seed, sklearn_random_state

#: Flower's fixed-clipping DP wrappers (σ on the clipped average, std σ·S/m)
DP_WRAPPERS = (DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyClientSideFixedClipping)


def _flat(arrays: NDArrays) -> np.ndarray:
    """The model as one float64 vector, in Flower's array order."""
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)


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
