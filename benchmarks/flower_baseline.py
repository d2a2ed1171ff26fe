"""Flower's simulation doing a benchmark workload, timed: the third column of the benchmark table.

What is measured. Workload 1 (``--workload mlp``, ``workloads.py``) is DP-FedAvg (McMahan et al. 2018, "Learning
Differentially Private Recurrent Language Models", Alg. 1): every round all 100 clients start
from the global model and train one local epoch over a fresh permutation of their 15 digits
records in batches of 5 (3 plain SGD steps, lr 0.1, mean cross-entropy); the server clips each
update w_i - w to L2 norm 1, averages, and adds N(0, (σ·S/n)²) with σ = 1, S = 1, n = 100 to the
average. Workload 2 (``--workload cnn``) is the same with MNIST's test split (100 clients of 80
records), the sigmoid LeNet and batches of 16 (5 steps). Here Flower runs exactly that: a ``NumPyClient`` per client id does the
local training with plain torch (``nn.Module`` + ``torch.optim.SGD``) and returns its new weights, and the server
strategy is ``FedAvg`` (all clients fit, no federated evaluation, the same initial model as ours)
wrapped in Flower's own ``DifferentialPrivacyServerSideFixedClipping`` (server-side fixed
clipping + Gaussian noise on the aggregate, the same mechanism as our ``noise_placement =
"aggregate"``). Both of Flower's simulation engines are timed: the newer
``flwr.simulation.run_simulation`` (ServerApp + ClientApp on the Simulation Runtime) and the
older ``flwr.simulation.start_simulation`` (the Virtual Client Engine); both run clients in Ray
actors.

Why so. The table compares client updates per second of our batched engine, a plain per-client
PyTorch loop and Flower on the same work, so only the rounds are timed: a timestamp is taken in
the strategy's ``configure_fit`` (a round starts) and after ``aggregate_fit`` (the last round
ends); a round lasts until the next one starts. Flower's and Ray's start-up is reported apart as
``startup_seconds``: from the call to the moment the first client begins local training (a
wall-clock stamp the client returns in its fit metrics; under run_simulation the server's first
``configure_fit`` runs before Ray is even up, so "first round starts" would hide the start-up in
round 1). The first ``warmup_rounds`` rounds (Ray actors starting, torch's first-use costs in
them) are not timed; ``updates_per_second`` = 100 × timed rounds / timed seconds, the median of
``repeats`` fresh Flower runs, each ending with ``ray.shutdown()``. The final global model's test
accuracy (after all warm-up + timed rounds) checks that Flower really trained (chance is 10 %;
Flower's DP noise is unseeded, so it varies from run to run).

Settings (``Settings``; chosen on a 2-core machine): 1 CPU per virtual client (2 actors; 0.5 was
not faster and more variable) and 1 torch thread per client (the MLP's batches of 5 gain nothing
from more, which would only oversubscribe the cores). Both engines drive the legacy ``Server``,
which sends each client's ``FitIns`` from a thread pool (Flower's default: min(32, cores + 4)
threads). Under run_simulation each of those threads waits on the in-memory grid's 0.1 s reply
poll, which caps the default at about 45 updates/s, so run_simulation gets a pool of 100 (one
thread per client, ~3× faster); start_simulation waits on Ray futures directly and is fastest
with Flower's default pool.

    python benchmarks/flower_baseline.py [--rounds 10] [--warmup-rounds 2] [--repeats 1]
        [--client-cpus 1.0] [--torch-threads 1] [--server-max-workers N] [--engines ...] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
# Flower's telemetry would try to phone home; Ray's log deduplication would buffer worker lines.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from workloads import (  # noqa: E402
    CLIENTS,
    CLIP,
    NOISE_MULTIPLIER,
    SEED,
    WORKLOADS,
    Workload,
    load_workload,
)

ENGINES = ("run_simulation", "start_simulation")


@dataclass(frozen=True)
class Settings:
    """How Flower is run (the fastest found on a 2-core machine, see ``main``'s flags to retry)."""

    client_cpus: float = 1.0  # Ray ``num_cpus`` per virtual client: actors = cores / client_cpus
    torch_threads: int = 1  # torch.set_num_threads in each client: more oversubscribes the cores
    # The legacy Server's thread pool sending FitIns (None: Flower's default, min(32, cores + 4)).
    # run_simulation needs one thread per client: each waits on the grid's 0.1 s reply poll, so
    # Flower's default pool caps it near 45 updates/s; start_simulation is fastest with the default.
    server_max_workers: tuple[tuple[str, int | None], ...] = (("run_simulation", CLIENTS),
                                                              ("start_simulation", None))

    def max_workers(self, engine: str) -> int | None:
        return dict(self.server_max_workers).get(engine)

    def describe(self, engine: str) -> dict[str, Any]:
        workers = self.max_workers(engine)
        return {"client_resources": {"num_cpus": self.client_cpus, "num_gpus": 0.0},
                "actors": int((os.cpu_count() or 1) // self.client_cpus),
                "torch_threads_per_client": self.torch_threads,
                "server_max_workers": workers if workers is not None else "flower default"}


# ---------------------------------------------------------------------------------------------
# Client side (runs inside Ray actors: module-level, so it is pickled by reference and the
# workload is loaded once per actor process).


@lru_cache(maxsize=2)
def _actor_workload(name: str = "mlp") -> Workload:
    return load_workload(name)


def get_weights(model: nn.Module) -> list[np.ndarray]:
    return [t.detach().cpu().numpy().copy() for t in model.state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    keys = list(model.state_dict().keys())
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in zip(keys, weights)}, strict=True)


def local_train(workload: Workload, client: int, weights: list[np.ndarray], server_round: int) -> list[np.ndarray]:
    """The workload's local training: from the global weights, ``local_epochs`` epochs over a fresh
    permutation of the client's records in batches of ``batch_size``, plain SGD on mean cross-entropy."""
    model = workload.model()
    set_weights(model, weights)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=workload.lr)
    records = workload.clients[client]
    rng = np.random.default_rng([SEED, server_round, client])
    for _ in range(workload.local_epochs):
        order = torch.as_tensor(records[rng.permutation(len(records))])
        for start in range(0, len(order), workload.batch_size):
            batch = order[start:start + workload.batch_size]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(workload.features[batch]), workload.labels[batch]).backward()
            optimizer.step()
    return get_weights(model)


def _numpy_client_class() -> type:
    from flwr.client import NumPyClient

    class DigitsClient(NumPyClient):
        """One workload client: trains locally and returns its new weights (the server clips)."""

        def __init__(self, client: int) -> None:
            self.client = client

        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return get_weights(_actor_workload(str(config.get("workload", "mlp"))).model())

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
            began = time.time()
            threads = int(config.get("torch_threads", Settings.torch_threads))
            if threads > 0 and torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            workload = _actor_workload(str(config["workload"]))
            new = local_train(workload, self.client, parameters, int(config["server_round"]))
            return new, len(workload.clients[self.client]), {"began": began}

    return DigitsClient


@lru_cache(maxsize=1)
def _client_class() -> type:
    return _numpy_client_class()


def client_fn(context: Any) -> Any:
    """Flower ``client_fn``: the client for this virtual node's partition id."""
    return _client_class()(int(context.node_config["partition-id"])).to_client()


# ---------------------------------------------------------------------------------------------
# Server side (runs in this process).


def _timed_strategy(initial: list[np.ndarray], torch_threads: int, workload: str = "mlp") -> Any:
    """FedAvg over all 100 clients in Flower's server-side fixed-clipping DP wrapper, recording
    the time each round starts (configure_fit) and ends (after aggregate_fit)."""
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    class TimedDP(DifferentialPrivacyServerSideFixedClipping):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.starts: list[float] = []
            self.ends: list[float] = []
            self.first_fit: float | None = None  # time.time() the first client began training
            self.final: list[np.ndarray] | None = None

        def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
            self.starts.append(time.perf_counter())
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
            if self.first_fit is None and results:
                self.first_fit = min(float(res.metrics["began"]) for _, res in results)
            aggregated, metrics = super().aggregate_fit(server_round, results, failures)
            self.ends.append(time.perf_counter())
            if aggregated is not None:
                self.final = parameters_to_ndarrays(aggregated)
            return aggregated, metrics

    fedavg = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=CLIENTS,
        min_evaluate_clients=0,
        min_available_clients=CLIENTS,
        initial_parameters=ndarrays_to_parameters(initial),
        on_fit_config_fn=lambda server_round: {"server_round": server_round, "torch_threads": torch_threads,
                                                "workload": workload},
    )
    return TimedDP(fedavg, noise_multiplier=NOISE_MULTIPLIER, clipping_norm=CLIP, num_sampled_clients=CLIENTS)


def test_accuracy(workload: Workload, weights: list[np.ndarray]) -> float:
    model = workload.model()
    set_weights(model, weights)
    model.eval()
    test = torch.as_tensor(workload.test)
    with torch.no_grad():
        predictions = model(workload.features[test]).argmax(dim=1)
    return float((predictions == workload.labels[test]).float().mean())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence Flower's and Ray's Python logging and warnings, and restore PYTHONPATH (Flower's
    Ray backend rewrites it) so that one engine run leaves nothing behind for the next. The
    benchmarks folder goes on PYTHONPATH so Ray's workers can import this module by name."""
    loggers = [logging.getLogger(name) for name in ("flwr", "ray")]
    levels = [(lg, lg.level, [(h, h.level) for h in lg.handlers]) for lg in loggers]
    pythonpath = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(_HERE), *([pythonpath] if pythonpath else [])])
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL + 1)
            for handler in lg.handlers:
                handler.setLevel(logging.CRITICAL + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level, handlers in levels:
            lg.setLevel(level)
            for handler, handler_level in handlers:
                handler.setLevel(handler_level)
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath


def _shutdown_ray() -> None:
    """Neither engine shuts Ray down; do it, so the next run starts clean and no process is left."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # start_simulation leaves a non-daemon 10 s threading.Timer (its cluster-growth poll) behind.
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer) and getattr(thread.function, "__module__", "").startswith("flwr"):
            thread.cancel()


def _ray_init_args() -> dict[str, Any]:
    return {"address": "local", "include_dashboard": False, "ignore_reinit_error": True, "logging_level": logging.ERROR,
            "log_to_driver": False, "configure_logging": True}


def _run_engine(engine: str, strategy: Any, total_rounds: int, settings: Settings) -> None:
    from flwr.server import Server, ServerConfig, SimpleClientManager

    client_resources = {"num_cpus": settings.client_cpus, "num_gpus": 0.0}
    config = ServerConfig(num_rounds=total_rounds)
    server = Server(client_manager=SimpleClientManager(), strategy=strategy)
    server.set_max_workers(settings.max_workers(engine))
    if engine == "run_simulation":
        from flwr.clientapp import ClientApp
        from flwr.server import ServerAppComponents
        from flwr.serverapp import ServerApp
        from flwr.simulation import run_simulation

        def server_fn(context: Any) -> Any:
            return ServerAppComponents(server=server, config=config)

        run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                       num_supernodes=CLIENTS,
                       backend_config={"client_resources": client_resources, "init_args": _ray_init_args()})
    elif engine == "start_simulation":
        from flwr.simulation import start_simulation

        start_simulation(client_fn=client_fn, num_clients=CLIENTS, config=config, server=server,
                         client_resources=client_resources, ray_init_args=_ray_init_args())
    else:
        raise ValueError(f"unknown engine {engine!r}")


def run_once(engine: str, workload: Workload, rounds: int, warmup_rounds: int, settings: Settings) -> dict[str, Any]:
    """One Flower run of ``warmup_rounds + rounds`` rounds on ``engine``: times and accuracy."""
    torch.manual_seed(SEED)
    initial = get_weights(workload.model())  # the same initial model on every side
    total = warmup_rounds + rounds
    strategy = _timed_strategy(initial, settings.torch_threads, workload.name)
    started, started_wall = time.perf_counter(), time.time()
    try:
        with _quiet():
            _run_engine(engine, strategy, total, settings)
    finally:
        with _quiet():
            _shutdown_ray()
    if len(strategy.ends) != total or strategy.final is None or strategy.first_fit is None:
        raise RuntimeError(f"only {len(strategy.ends)} of {total} rounds aggregated")
    bounds = [*strategy.starts[1:], strategy.ends[-1]]  # a round lasts until the next one starts
    round_seconds = [end - start for start, end in zip(strategy.starts, bounds)]
    timed = sum(round_seconds[warmup_rounds:])
    return {
        "startup_seconds": strategy.first_fit - started_wall,
        "round_seconds": round_seconds,
        "updates_per_second": CLIENTS * rounds / timed,
        "final_test_accuracy": test_accuracy(workload, strategy.final),
        "wall_seconds": time.perf_counter() - started,
    }


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def measure_engine(engine: str, workload: Workload, rounds: int, warmup_rounds: int, repeats: int,
                   settings: Settings) -> dict[str, Any]:
    """Median over ``repeats`` Flower runs of one engine, or ``{"error": ...}`` if it fails."""
    try:
        runs = [run_once(engine, workload, rounds, warmup_rounds, settings) for _ in range(repeats)]
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # Flower may sys.exit() on a failed run
        return {"error": _one_line(error)}
    ups = [run["updates_per_second"] for run in runs]
    median_run = sorted(runs, key=lambda run: run["updates_per_second"])[(len(runs) - 1) // 2]
    return {
        "startup_seconds": statistics.median(run["startup_seconds"] for run in runs),
        "round_seconds": [round(s, 4) for s in median_run["round_seconds"]],
        "updates_per_second": statistics.median(ups),
        "updates_per_second_repeats": ups,
        "final_test_accuracy": median_run["final_test_accuracy"],
        "wall_seconds": sum(run["wall_seconds"] for run in runs),
        "settings": {**settings.describe(engine), "rounds": warmup_rounds + rounds, "warmup_rounds": warmup_rounds,
                     "timed_rounds": rounds, "repeats": repeats},
    }


def measure_flower(rounds: int = 10, warmup_rounds: int = 2, repeats: int = 1, settings: Settings | None = None,
                   engines: tuple[str, ...] = ENGINES, workload: str = "mlp") -> dict[str, Any]:
    """A workload (``mlp``: 1, ``cnn``: 2) on each Flower simulation engine: start-up seconds (call → first client starts
    training), per-round seconds, client updates per second over the ``rounds`` rounds after
    ``warmup_rounds`` warm-up rounds (median of ``repeats`` runs), final global test accuracy."""
    started = time.perf_counter()
    settings = settings or Settings()
    try:
        import flwr
        import ray
    except ImportError as error:
        return {"error": f"flower not installed ({error}); pip install -e '.[bench]'"}
    data = load_workload(workload)
    result: dict[str, Any] = {"workload": workload, "flwr_version": flwr.__version__, "ray_version": ray.__version__,
                              "torch_version": torch.__version__, "cpu_count": os.cpu_count()}
    for engine in engines:
        result[engine] = measure_engine(engine, data, rounds, warmup_rounds, repeats, settings)
    ok = {engine: result[engine] for engine in engines if "error" not in result[engine]}
    if ok:
        best = max(ok, key=lambda engine: ok[engine]["updates_per_second"])
        result["best_engine"] = best
        result["best_updates_per_second"] = ok[best]["updates_per_second"]
        result["final_test_accuracy"] = ok[best]["final_test_accuracy"]
    result["total_seconds"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="mlp")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (after the warm-up)")
    parser.add_argument("--warmup-rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--client-cpus", type=float, default=Settings.client_cpus, help="Ray num_cpus per client")
    parser.add_argument("--torch-threads", type=int, default=Settings.torch_threads, help="torch threads per client")
    parser.add_argument("--server-max-workers", type=int, default=None,
                        help="the legacy Server's thread pool on both engines (0: Flower's default; "
                             "unset: 100 on run_simulation, Flower's default on start_simulation)")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings(args.client_cpus, args.torch_threads)
    if args.server_max_workers is not None:
        settings = replace(settings, server_max_workers=tuple((e, args.server_max_workers or None) for e in ENGINES))
    result = measure_flower(args.rounds, args.warmup_rounds, args.repeats, settings, tuple(args.engines), args.workload)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if "error" in result:
        print(f"flower: {result['error']}")
        return
    print(f"flwr {result['flwr_version']}, ray {result['ray_version']}: workload {args.workload} ({CLIENTS} clients, "
          f"dp-fedavg clip {CLIP:g} sigma {NOISE_MULTIPLIER:g}), {args.rounds} timed rounds after "
          f"{args.warmup_rounds} warm-up, median of {args.repeats}")
    print(f"{'engine':<18}{'startup s':>10}{'updates/s':>11}{'test acc':>10}  settings")
    for engine in args.engines:
        entry = result[engine]
        if "error" in entry:
            print(f"{engine:<18}  error: {entry['error']}")
            continue
        print(f"{engine:<18}{entry['startup_seconds']:>10.1f}{entry['updates_per_second']:>11.1f}"
              f"{entry['final_test_accuracy']:>10.3f}  {entry['settings']['client_resources']['num_cpus']:g} cpu/client, "
              f"{entry['settings']['actors']} actors, {entry['settings']['torch_threads_per_client']} torch thread, "
              f"server max_workers {entry['settings']['server_max_workers']}")
    print(f"total {result['total_seconds']:.1f} s")


if __name__ == "__main__":
    # Run through the importable module so the client code Ray pickles is referenced by name
    # (``flower_baseline.client_fn``), not copied by value from ``__main__`` on every call.
    import flower_baseline

    flower_baseline.main()
