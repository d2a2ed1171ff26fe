"""Audit a real Flower simulation's DP claim: DifferentialPrivacyServerSideFixedClipping(FedAvg) on
scikit-learn's digits, N real clients plus m canary clients, the claim from dpfl-audit's accountant.

Run, as a Flower App on Flower's local simulation (this folder's pyproject.toml names the apps):
      flwr run examples/flower --federation-config "num-supernodes=204" --stream \
               --run-config "out='/absolute/path/flower-audit'"
or from Python (``flwr.simulation.run_simulation``, which Flower 1.42 deprecates in favour of ``flwr run``):
      python examples/flower/app.py --out flower-audit            (honest: the claim uses Flower's σ)
      python examples/flower/app.py --out flower-lowered --noise-multiplier 0.01 --claimed-noise-multiplier 10
                                                                   (Flower secretly runs a lower σ)
Prints the claimed ε, the ε lower bounds and the verdict; writes results.json, results.csv,
report.html (and flower_view.npz: the recorded global models) under --out. See README.md here.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Iterator

# Flower sends usage telemetry unless told not to; an audit should not phone home
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.client import ClientApp, NumPyClient  # noqa: E402
from flwr.common import Context, ndarrays_to_parameters  # noqa: E402
from flwr.server import ServerApp, ServerAppComponents, ServerConfig  # noqa: E402
from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from audit.core.errors import UserInputError  # noqa: E402
from audit.core.seeding import numpy_rng, torch_generator  # noqa: E402
from audit.flower_audit import audit_flower, claim_of_view, flower_claim, summary  # noqa: E402
from audit.flower_canaries import CanaryClients, canary_mod  # noqa: E402
from audit.flower_view import FlowerRecorder  # noqa: E402
from reports.verdict_text import verdict_lines  # noqa: E402


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def get_arrays(model: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in model.state_dict().values()]


def set_arrays(model: torch.nn.Module, arrays: list[np.ndarray]) -> None:
    keys = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, arrays, strict=True)})


def load_data(seed: int, clients: int):
    """Digits scaled to [0, 1]; a seeded 80/20 split, the training part dealt iid to the real clients."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = numpy_rng(seed, "flower-example", "split").permutation(len(x))
    test, train = order[: len(x) // 5], order[len(x) // 5:]
    parts = np.array_split(train, clients)
    return (x[test], y[test]), [(x[p], y[p]) for p in parts]


class DigitsClient(NumPyClient):
    """A real client: local SGD epochs on its shard; reports num_examples = 1 so that FedAvg weighs
    every sampled client equally, as Flower's noise std σ·S/m assumes."""

    def __init__(self, data, seed: int, partition: int, epochs: int, lr: float) -> None:
        self.x, self.y = data
        self.seed, self.partition, self.epochs, self.lr = seed, partition, epochs, lr

    def fit(self, parameters, config):
        torch.set_num_threads(1)
        model = make_model()
        set_arrays(model, parameters)
        generator = torch_generator(self.seed, "flower-example", "round", int(config["round"]), "client", self.partition)
        optimiser = torch.optim.SGD(model.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            for batch in torch.randperm(len(self.x), generator=generator).split(32):
                optimiser.zero_grad()
                torch.nn.functional.cross_entropy(model(self.x[batch]), self.y[batch]).backward()
                optimiser.step()
        return get_arrays(model), 1, {}


def check(args) -> None:
    """The run's settings checked (one-line errors) before anything runs or is written."""
    population = args.clients + args.canaries
    if not (1 <= args.sample_size <= population):
        raise UserInputError(f"--sample-size: {args.sample_size} is not allowed; allowed: 1..{population} (clients + canaries)")
    flower_claim(args.claimed_noise_multiplier or args.noise_multiplier, args.sample_size, population, args.rounds,
                 args.delta)


def canaries_of(args) -> CanaryClients:
    """The canary clients: nodes clients..clients + canaries − 1 (the same in every process: seeded)."""
    return CanaryClients(seed=args.seed, ids=tuple(range(args.clients, args.clients + args.canaries)),
                         clipping_norm=args.clip)


def client_fn_of(args):
    """The real clients' ``client_fn``: node ``partition-id`` p trains on shard p."""
    _, shards = load_data(args.seed, args.clients)

    def client_fn(context: Context):
        partition = int(context.node_config["partition-id"])
        return DigitsClient(shards[partition], args.seed, partition, args.local_epochs, args.lr).to_client()

    return client_fn


def server_side(args):
    """(Flower's DP strategy wrapped in the recorder, the accuracy per round): what the server runs."""
    population = args.clients + args.canaries
    test, _ = load_data(args.seed, args.clients)
    model = make_model()
    model.load_state_dict({k: torch.randn(v.shape, generator=torch_generator(args.seed, "flower-example", "init", k)) * 0.1
                           for k, v in model.state_dict().items()})
    accuracy: list[float] = []

    def evaluate(server_round, arrays, config):
        evaluated = make_model()
        set_arrays(evaluated, arrays)
        with torch.no_grad():
            logits = evaluated(test[0])
        accuracy.append(float((logits.argmax(1) == test[1]).float().mean()))
        return float(torch.nn.functional.cross_entropy(logits, test[1])), {"accuracy": accuracy[-1]}

    fedavg = FedAvg(fraction_fit=args.sample_size / population, min_fit_clients=args.sample_size,
                    min_available_clients=population, fraction_evaluate=0.0, min_evaluate_clients=0,
                    initial_parameters=ndarrays_to_parameters(get_arrays(model)), evaluate_fn=evaluate,
                    on_fit_config_fn=lambda server_round: {"round": server_round})
    dp = DifferentialPrivacyServerSideFixedClipping(fedavg, noise_multiplier=args.noise_multiplier,
                                                     clipping_norm=args.clip, num_sampled_clients=args.sample_size)
    return FlowerRecorder(dp, seed=args.seed), accuracy


def build(args):
    """The Flower apps, the recorder and the canaries of one run (the Python path: run_simulation)."""
    check(args)
    canaries = canaries_of(args)
    recorder, accuracy = server_side(args)
    server_app = ServerApp(server_fn=lambda context: ServerAppComponents(
        strategy=recorder, config=ServerConfig(num_rounds=args.rounds)))
    client_app = ClientApp(client_fn=client_fn_of(args), mods=[canary_mod(canaries)])
    return server_app, client_app, recorder, canaries, accuracy


def audit_run(args, recorder: FlowerRecorder, canaries: CanaryClients, accuracy: list[float]):
    """The audit of a finished run: the server's view saved, the claim, the results document."""
    view = recorder.view()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        view.save(os.path.join(args.out, "flower_view.npz"))
    claim = claim_of_view(view, args.delta, args.claimed_noise_multiplier)
    return audit_flower(view, canaries, args.delta, claim, args.out, name="flower-dp-fedavg", dataset="digits",
                        model="mlp 64-32-10", test_accuracy=accuracy[-1:], config=vars(args))


def run(args):
    """Simulate, then audit; returns the results document."""
    server_app, client_app, recorder, canaries, accuracy = build(args)
    logging.getLogger("flwr").setLevel(logging.WARNING)  # Flower logs every clip; keep the output to the audit
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": args.actors, "num_gpus": 0, "include_dashboard": False,
                             "logging_level": "ERROR", "log_to_driver": False}}
    try:
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=args.clients + args.canaries, backend_config=backend)
    finally:
        import ray

        if ray.is_initialized():  # Flower shuts Ray down on success; not always after an error
            ray.shutdown()
    return audit_run(args, recorder, canaries, accuracy)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write results.json, results.csv, report.html here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clients", type=int, default=4, help="real clients")
    p.add_argument("--canaries", type=int, default=200, help="canary clients (each inserted with probability ½)")
    p.add_argument("--sample-size", type=int, default=100, help="clients Flower samples per round (m of N)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--noise-multiplier", type=float, default=10.0, help="σ Flower runs with")
    p.add_argument("--claimed-noise-multiplier", type=float, default=None,
                   help="σ the claim is computed from (default: the σ Flower runs with)")
    p.add_argument("--clip", type=float, default=1.0, help="Flower's clipping norm S")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--actors", type=int, default=2, help="Ray CPUs (one client actor each)")
    return p


def report_lines(args, results) -> list[str]:
    figures = summary(results)
    lines = [f"claimed ε = {figures['claimed_epsilon']:.4g} at δ = {figures['delta']:g} "
             f"(client level, {figures['relation']}, released models; Flower σ = {args.noise_multiplier:g}, "
             f"claim σ = {args.claimed_noise_multiplier or args.noise_multiplier:g})"]
    lines += [f"  ε_LB {name:<40} {value:.4g}" for name, value in figures["epsilon_lower_bounds"].items()]
    accuracy = results.experiments[0].utility.test_accuracy.value
    if accuracy is not None:
        lines.append(f"final test accuracy {accuracy:.3f}")
    lines += verdict_lines(results.experiments[0])
    if args.out:
        lines.append(f"wrote {os.path.join(args.out, 'report.html')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        results = run(args)
    except UserInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(report_lines(args, results)))
    return 0


# ---------------------------------------------------------------- the Flower App (`flwr run`)
# pyproject.toml here names `server_app` and `client_app`; its [tool.flwr.app.config] holds the
# settings above (the same names, without "--"; `claimed-noise-multiplier = 0.0`: Flower's own σ,
# `out = ""`: write nothing). Flower runs the ServerApp and the ClientApps in processes of its own,
# so each side rebuilds what it needs from the run config (the canaries are seeded: every process
# agrees on them), and the audit runs in the ServerApp once its rounds are over.


def settings(run_config) -> argparse.Namespace:
    """The example's arguments from a Flower run config (keys: the option names without "--")."""
    options_of = parser()
    args = options_of.parse_args([])
    options = {action.option_strings[0][2:]: action for action in options_of._actions
               if action.option_strings and action.dest != "help"}
    unknown = sorted(set(run_config) - set(options))
    if unknown:
        raise UserInputError(f"run config: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(options))}")
    for key, value in run_config.items():
        setattr(args, options[key].dest, (options[key].type or str)(value))
    args.claimed_noise_multiplier = args.claimed_noise_multiplier or None  # 0.0: the σ Flower runs with
    args.out = args.out or None  # "": write nothing
    if args.out is not None and not os.path.isabs(args.out):
        raise UserInputError(f"out: '{args.out}' is not allowed; allowed: an absolute path (Flower runs the "
                             "ServerApp in a process of its own, in another working directory)")
    check(args)
    return args


@functools.lru_cache(maxsize=4)
def _client_parts(frozen: tuple):
    args = argparse.Namespace(**dict(frozen))
    return client_fn_of(args), canary_mod(canaries_of(args))


def _client_side(context: Context):
    """(client_fn, canary Mod) of this run's settings, built once per process and run config."""
    return _client_parts(tuple(sorted(vars(settings(context.run_config)).items())))


def _client_fn(context: Context):
    client_fn, _ = _client_side(context)
    return client_fn(context)


def _canary_mod(msg, context: Context, call_next):
    _, mod = _client_side(context)
    return mod(msg, context, call_next)


client_app = ClientApp(client_fn=_client_fn, mods=[_canary_mod])
_SERVER_RUNS: dict[int, tuple] = {}


def _server_fn(context: Context) -> ServerAppComponents:
    args = settings(context.run_config)
    logging.getLogger("flwr").setLevel(logging.WARNING)  # Flower logs every clip; keep the output to the audit
    recorder, accuracy = server_side(args)
    _SERVER_RUNS[context.run_id] = (args, recorder, accuracy)
    return ServerAppComponents(strategy=recorder, config=ServerConfig(num_rounds=args.rounds))


server_app = ServerApp(server_fn=_server_fn)


@server_app.lifespan()
def _audit_after_the_rounds(context: Context) -> Iterator[None]:
    yield  # Flower runs the rounds
    args, recorder, accuracy = _SERVER_RUNS.pop(context.run_id)
    if len(recorder.after) < args.rounds:  # the rounds failed: Flower reports why
        print(f"the run stopped after {len(recorder.after)} of {args.rounds} rounds: no audit", file=sys.stderr)
        return
    results = audit_run(args, recorder, canaries_of(args), accuracy)
    print("\n".join(report_lines(args, results)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
