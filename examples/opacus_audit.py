"""Audit record-level DP-SGD trained with Opacus against the ε Opacus's own accountant claims.

    python examples/opacus_audit.py --out opacus-audit-out        # a few minutes on 2 CPU cores
    dpfl-audit audit-training examples/opacus_audit.py:train --dataset digits \\
        --claim-epsilon EPS --delta 1e-5 --accountant "opacus RDP accountant"

``train(features, labels, seed)`` is ordinary Opacus code: a small MLP on scikit-learn's 8×8 digits
(embedded), made private by ``PrivacyEngine.make_private`` — DP-SGD (Abadi et al. 2016, Alg. 1):
per-example gradients clipped to ``MAX_GRAD_NORM``, Gaussian noise of std σ·``MAX_GRAD_NORM`` added
to their sum, batches by Poisson sampling at rate q. The rate is fixed (q = 1/16 of whatever records
``train`` receives), so every run dpfl-audit asks for — membership runs on half the pool, the canary
run on the pool plus canaries — has the same (σ, q, T) and one ε covers them all: Opacus's RDP
accountant (Mironov 2017; subsampled Gaussian of Mironov, Talwar, Zhang 2019) gives it from
(σ, q, T, δ) before any training (:func:`claimed_epsilon`), and each run checks that the engine's
own accountant reports the same figure after it.

dpfl-audit then measures what the models leak (:func:`audit.own_training.audit_training`): LiRA and
RMIA on the membership runs, and Steinke, Nasr and Jagielski's (2023) one-run audit with mislabelled
canaries; an ε lower bound above the claim would say the claim (or its implementation) is wrong.

``--gradient-canaries COINS`` audits the optimiser itself instead, white box
(:func:`audit.gradient_canary_audit.gradient_canary_audit`; Nasr et al. 2023, "Tight Auditing of
Differentially Private Machine Learning"): ``train`` hands its DPOptimizer to ``attach``, which
inserts Dirac per-example gradients before Opacus clips and reads every step's noisy gradient.
``--noise-bug F`` plants a bug to catch: the optimiser adds F times the noise while the claim and
Opacus's accountant keep the honest σ.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

#: DP-SGD's settings (the claim follows from NOISE_MULTIPLIER, SAMPLE_RATE, EPOCHS and DELTA)
NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0
SAMPLE_RATE = 1 / 16  # a power of two: Opacus re-derives q as 1/len(loader) = 1/int(1/q), exact only then
EPOCHS = 15
LEARNING_RATE = 2.0
DELTA = 1e-5
HIDDEN = 64
CLASSES = 10  # digits


def steps(epochs: int) -> int:
    """Optimiser steps of a run: a Poisson-sampled epoch is 1/q batches (Opacus's DPDataLoader)."""
    return epochs * int(1 / SAMPLE_RATE)


def claimed_epsilon(noise_multiplier: float = NOISE_MULTIPLIER, epochs: int = EPOCHS, delta: float = DELTA) -> float:
    """ε of T = ``steps(epochs)`` Poisson-subsampled Gaussian steps at rate q, from Opacus's RDP
    accountant (the accountant ``PrivacyEngine(accountant="rdp")`` uses) — known before training."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, SAMPLE_RATE, steps(epochs))]
    return float(accountant.get_epsilon(delta))


def mlp(input_shape: tuple[int, ...]) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def plant_noise_bug(optimizer, factor: float) -> None:
    """The bug ``--noise-bug`` plants: Opacus draws noise of std ``factor``·σ·C, while its accountant
    (which reads ``optimizer.noise_multiplier`` after the noise) and the claim keep the honest σ."""
    honest, add_noise = optimizer.noise_multiplier, optimizer.add_noise

    def buggy() -> None:
        optimizer.noise_multiplier = honest * factor
        try:
            add_noise()
        finally:
            optimizer.noise_multiplier = honest

    optimizer.add_noise = buggy


def make_train(noise_multiplier: float = NOISE_MULTIPLIER, epochs: int = EPOCHS, learning_rate: float = LEARNING_RATE,
               noise_bug: float = 1.0) -> Callable[..., nn.Module]:
    """A ``train(features, labels, seed, attach=None)`` with these DP-SGD settings; ``attach`` (dpfl-audit's
    gradient canaries) is called with the DPOptimizer. ``noise_bug`` ≠ 1 plants :func:`plant_noise_bug`."""
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader

    expected = claimed_epsilon(noise_multiplier, epochs)

    def train(features: torch.Tensor, labels: torch.Tensor, seed: int,
              attach: Callable[[object], None] | None = None) -> nn.Module:
        init_seed, sampling_seed, noise_seed = (int(s) for s in np.random.SeedSequence(seed).generate_state(3, np.uint64))
        with torch.random.fork_rng(devices=[]):  # the initialisation from the seed, the caller's RNG untouched
            torch.manual_seed(init_seed)
            model = mlp(tuple(features.shape[1:]))
        optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
        loader = DPDataLoader(TensorDataset(features, labels), sample_rate=SAMPLE_RATE,
                              generator=torch.Generator().manual_seed(sampling_seed))
        with warnings.catch_warnings():
            # Opacus warns that a seeded noise generator is not its secure RNG (seeded on purpose: same
            # seed, same run) and that the input layer's full backward hook sees no input gradients
            warnings.filterwarnings("ignore", message="Secure RNG turned off")
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            engine = PrivacyEngine(accountant="rdp")
            private, optimizer, loader = engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=noise_multiplier,
                max_grad_norm=MAX_GRAD_NORM, poisson_sampling=True, noise_generator=torch.Generator().manual_seed(noise_seed))
            if noise_bug != 1.0:
                plant_noise_bug(optimizer, noise_bug)
            if attach is not None:
                attach(optimizer)
            private.train()
            for _ in range(epochs):
                for x, y in loader:
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(private(x), y).backward()
                    optimizer.step()
        spent = engine.get_epsilon(DELTA)
        if not np.isclose(spent, expected, rtol=1e-9):  # the claim must be what this run spent
            raise RuntimeError(f"Opacus's accountant reports ε = {spent} after training, the claim says {expected}")
        private.remove_hooks()  # the plain module, as trained
        return model.eval()

    return train


#: the training function with the default settings (``dpfl-audit audit-training examples/opacus_audit.py:train``)
train = make_train()


def main(argv: list[str] | None = None) -> int:
    from audit.external import stated_claim
    from audit.own_training import audit_training, dataset_pool
    from reports.verdict_text import verdict_lines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="opacus-audit-out", help="results folder (default: %(default)s)")
    parser.add_argument("--models", type=int, default=8, help="membership runs (default: %(default)s)")
    parser.add_argument("--canaries", type=int, default=200, help="canaries of the one-run audit (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="DP-SGD epochs (default: %(default)s)")
    parser.add_argument("--noise", type=float, default=NOISE_MULTIPLIER, help="noise multiplier σ (default: %(default)s)")
    parser.add_argument("--pool", type=int, help="cap the candidate pool at this many records (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--gradient-canaries", type=int, default=0, metavar="COINS",
                        help="audit the optimiser white box with this many Dirac gradient canaries instead (≥ 10000 "
                             "recommended; default: off)")
    parser.add_argument("--noise-bug", type=float, default=1.0, metavar="F",
                        help="plant a bug: Opacus adds F·σ noise, the claim keeps σ (default: %(default)s, no bug)")
    args = parser.parse_args(argv)
    if not 0 < args.noise_bug <= 1:
        parser.error(f"--noise-bug: must lie in (0, 1] (1: no bug), got {args.noise_bug}")
    if args.gradient_canaries < 0:
        parser.error(f"--gradient-canaries: must be 0 (off) or a number of coins ≥ 4, got {args.gradient_canaries}")

    import opacus

    epsilon = claimed_epsilon(args.noise, args.epochs)
    claim = stated_claim(epsilon, DELTA, "record", "add-remove", "released",
                         accountant=f"opacus {opacus.__version__} RDP accountant (get_epsilon): σ = {args.noise}, "
                                    f"q = {SAMPLE_RATE}, T = {steps(args.epochs)} steps",
                         mechanism="DP-SGD with Opacus PrivacyEngine.make_private: Poisson sampling, per-example clipping "
                                   f"to {MAX_GRAD_NORM}, Gaussian noise")
    _, pool, test = dataset_pool("digits", args.pool, args.seed)
    train_function = make_train(args.noise, args.epochs, noise_bug=args.noise_bug)
    print(f"claimed ε (opacus RDP accountant, δ = {DELTA:g}): {epsilon:.3f}"
          + (f"; planted bug: the optimiser adds {args.noise_bug:g}·σ noise" if args.noise_bug != 1 else ""))
    if args.gradient_canaries:
        return gradient_canaries(train_function, pool, test, claim, args)
    results = audit_training(train_function, pool.features, pool.labels, claim,
                             models=args.models, canaries=args.canaries, test=(test.features, test.labels),
                             seed=args.seed, out=args.out, progress=not args.quiet, name="opacus-dp-sgd", dataset="digits")
    experiment = results.experiments[0]
    print(f"test accuracy: {experiment.utility.test_accuracy.value:.3f}")
    for record in experiment.attacks:
        figures = [f"AUC {record.metrics['auc'].value:.3f}"]
        figures += [f"{metric} {record.metrics[metric].value:.3f}" for metric in ("epsilon_one_run", "epsilon_one_run_fdp")
                    if metric in record.metrics]
        print(f"{record.attack:<16} " + ", ".join(figures))
    print("\n".join(verdict_lines(experiment)))
    print(f"written: {args.out}/results.json, {args.out}/report.html")
    return 0


def gradient_canaries(train_function, pool, test, claim, args) -> int:
    """``--gradient-canaries``: the white-box audit of the optimiser and what it shows."""
    from audit.gradient_canary_audit import gradient_canary_audit

    audit = gradient_canary_audit(train_function, pool.features, pool.labels, claim, noise_multiplier=args.noise,
                                  sample_rate=SAMPLE_RATE, coins=args.gradient_canaries, seed=args.seed,
                                  test=(test.features, test.labels), out=args.out, progress=not args.quiet,
                                  name="opacus-dp-sgd-gradient-canaries", dataset="digits")
    print(f"gradient canaries: {audit.scores.size} coins over {audit.runs} run(s) of {audit.steps} steps, "
          f"{audit.per_run} per run of {audit.parameters} coordinates, {int(audit.inserted.sum())} inserted")
    print("statistic: mixture log-likelihood ratio of z_t = s·ĝ_t[j]·B/(σ·C) over every step (μ = 1/σ, q)")
    print(", ".join(f"{figure} {a.epsilon:.3f}" for figure, a in audit.evidence.items()))
    if audit.power is not None:
        more = f" (about {audit.power.needed} coins would reach 80 %)" if audit.power.needed else ""
        print(f"power (f-DP test): {audit.power.detection:.0%} to detect 2ε{more}; tight bound {audit.power.tight_bound:.3f}")
    print(f"held-out readings: standard deviation {audit.held_out_spread:.3f} (about 1 or more with the claimed noise; less: "
          "less noise than claimed)")
    print(audit.explanation)
    print(f"verdict: {audit.status} — {audit.sentence}")
    print(f"written: {args.out}/results.json, {args.out}/report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
