"""The commands that attack one piece on its own, outside an audit's pipeline:
``audit-mechanism`` (the optimal test on one clipped-and-noised step: an ε lower bound against
the claim), ``conformance`` (does each defense's code release the noise its claim accounts for,
per observer?) and ``invert`` (gradient inversion of one client's, possibly noised, gradient).

The attacks, the registries and torch are imported inside each command, never at module level
(see ``audit.commands``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from audit.commands import EXIT_FAILURE, EXIT_OK
from audit.core.errors import UserInputError

#: the largest ε of the staircase mechanism audited: its step ratio e^{−ε} underflows to 0 near
#: ε = 745 (a math error), and past ε ≈ 40 it is 1e-17, a point mass the audit cannot tell apart
#: from no noise; 100 matches ldp-two-point's --epsilon
MAX_STAIRCASE_EPSILON = 100.0


def command_audit_mechanism(args: argparse.Namespace) -> int:
    from attacks.mechanism_audits.mechanism_audit import audit_mechanism, audit_two_point

    if args.mechanism == "ldp-two-point":
        if args.epsilon is None:
            raise UserInputError("--epsilon: ldp-two-point needs the ε of the mechanism")
        result = audit_two_point(args.epsilon, args.trials, args.seed)
        header = f"two-point ε-LDP mechanism (LDP-FL), one weight at the two ends of its range, {args.trials} trials"
        delta = 0.0
    else:
        if args.noise is None:
            raise UserInputError(f"--noise: {args.mechanism} needs its noise parameter")
        if args.mechanism == "staircase" and args.noise > MAX_STAIRCASE_EPSILON:
            raise UserInputError(f"--noise: the staircase's ε must be at most {MAX_STAIRCASE_EPSILON:g}, got {args.noise:g}; "
                                 f"allowed: 1e-06 to {MAX_STAIRCASE_EPSILON:g}")
        result = audit_mechanism(args.mechanism, args.noise, args.clip, args.dim, args.trials, args.accounting,
                                 args.clip_norm, args.delta, args.conversion, args.canary, args.seed)
        header = f"{result['mechanism']}, C = {args.clip:g}, d = {args.dim}, {args.trials} trials, accounting {args.accounting}"
        delta = args.delta
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return EXIT_OK
    print(header)
    claimed = result["epsilon_claimed"]
    print(f"claimed ε:       {'none (no finite bound)' if claimed is None else f'{claimed:.4f}'} at δ = {delta:g}")
    each = 100 * result.get("confidence_per_canary", result["confidence"])
    for canary, bound in result["canaries"].items():
        print(f"ε lower bound:   {bound:.4f}  ({canary}, Clopper–Pearson {each:.4g} %, threshold on a held-out half)")
    print(result["verdict"])
    return EXIT_OK


def _conformance_defenses(args: argparse.Namespace) -> tuple[list, list[dict[str, Any]]]:
    """The defenses ``conformance`` checks, with their hyper-parameters validated (one-line errors)."""
    import defenses.catalog  # noqa: F401
    from audit.core.schema import from_mapping
    from audit.core.strict_yaml import parse_yaml
    from defenses.base import DEFENSES

    if args.all and args.defenses:
        raise UserInputError("conformance: name defenses or give --all, not both")
    names = DEFENSES.names() if args.all else list(args.defenses)
    if not names:
        raise UserInputError("conformance: name at least one defense (see `dpfl-audit list`) or give --all")
    if args.trials < 100:
        raise UserInputError(f"--trials: must be >= 100, got {args.trials}")
    if not 0 < args.alpha < 1:
        raise UserInputError(f"--alpha: must lie in (0, 1), got {args.alpha:g}")
    if not 0 < args.delta < 1:
        raise UserInputError(f"--delta: must lie in (0, 1), got {args.delta:g}")
    overrides: dict[str, dict[str, Any]] = {name: {} for name in names}
    for item in args.param:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserInputError(f"--param: '{item}' is not FIELD=VALUE or DEFENSE.FIELD=VALUE")
        target, dot, field = key.rpartition(".")
        if dot and target not in overrides:
            raise UserInputError(f"--param: '{key}' names a defense not checked here; checked: {', '.join(names)}")
        # the strict loader: no aliases (a few bytes of nested aliases expand to gigabytes),
        # no duplicate keys; a bad value is one line naming the key
        parsed = parse_yaml(value, f"--param: the value of '{key}' is not valid YAML")
        for name in ([target] if dot else names):
            overrides[name][field] = parsed
    chosen, shown = [], []
    for name in names:
        cls = DEFENSES.get(name, "conformance: defense")
        params: Any = from_mapping(cls.Params, overrides[name], f"--param ({name})")
        chosen.append(cls(params))
        shown.append(overrides[name])
    return chosen, shown


def command_conformance(args: argparse.Namespace) -> int:
    from attacks.mechanism_audits.conformance import CONFORMS, VIOLATES, conformance

    chosen, shown = _conformance_defenses(args)
    bar = None
    if not args.quiet:
        from audit.logs import progress_bar

        bar = progress_bar(0, "conformance", args.quiet, unit="trial", leave=False)

    def progress(name: str, done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.n = done
            bar.set_description(name)
            bar.refresh()

    result = conformance(chosen, args.trials, args.seed, args.alpha, args.delta,
                         [{**to_params(d), **o} for d, o in zip(chosen, shown)], progress)
    if bar is not None:
        bar.close()
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(f"conformance: {result['task']}, {result['participation']}; {result['trials']} coupled trials per input")
        skipped = ("" if result["epsilon_tests"] else f" (none can fire: {result['trials']} trials show at most "
                                                      f"ε_LB = {result['epsilon_ceiling']:.3g})")
        print(f"{result['family_size']} tests, each at α/K = {1 - result['level']:.2g} (α = "
              f"{result['alpha']:g} over the family), δ = {result['delta']:g}: {result['sigma_tests']} noise and coin tests (χ² "
              f"interval, KS shortfall and tails, per round and pooled; fresh noise and participation; every "
              f"coordinate a coin of a per-weight claim), "
              f"{result['epsilon_tests']} ε tests{skipped}")
        for entry in result["defenses"]:
            print(f"{entry['defense']:<20} {entry['status'].upper() if entry['status'] == VIOLATES else entry['status']}")
            if entry.get("probed") and entry["probed"] != result["participation"]:
                print(f"    {'probed':<19} {entry['probed']}")
            for check in entry["adversaries"]:
                print(f"    {check['adversary']:<9} {check['status']:<9} {check['detail']}")
            for adversary, why in entry["not_covered"].items():
                print(f"    {adversary:<9} {'—':<9} {why}")
            if entry["status"] != CONFORMS or not entry["adversaries"]:
                print(f"    {entry['note']}")
        print(f"overall: {result['status']}")
    return EXIT_OK if result["status"] == CONFORMS else EXIT_FAILURE


def to_params(defense) -> dict[str, Any]:
    from dataclasses import asdict

    from audit.core.schema import to_mapping

    return to_mapping(asdict(defense.params))


def _check_invert_options(args: argparse.Namespace) -> None:
    """Every option of ``invert`` checked before anything is loaded or written."""
    from attacks.reconstruction.inversion import RECONSTRUCTION_ATTACKS
    from audit.core.datasets import DATASETS
    from audit.core.models import MODELS

    if args.attack not in RECONSTRUCTION_ATTACKS:
        raise UserInputError(f"--attack: unknown attack '{args.attack}'; allowed: {', '.join(RECONSTRUCTION_ATTACKS)}")
    if args.dataset not in DATASETS:
        raise UserInputError(f"--dataset: unknown dataset '{args.dataset}'; allowed: {', '.join(DATASETS.names())}")
    if args.model not in MODELS:
        raise UserInputError(f"--model: unknown model '{args.model}'; allowed: {', '.join(MODELS.names())}")
    for option, value in (("--batch-size", args.batch_size), ("--restarts", args.restarts),
                          ("--iterations", args.iterations), ("--images", args.images)):
        if value is not None and value < 1:
            raise UserInputError(f"{option}: must be >= 1, got {value}")
    if args.clip is not None and not args.clip > 0:
        raise UserInputError(f"--clip: must be > 0, got {args.clip:g}")
    if args.noise is not None:
        if not args.noise >= 0:
            raise UserInputError(f"--noise: must be >= 0, got {args.noise:g}")
        if args.clip is None:
            raise UserInputError("--noise: needs --clip (the noise std is σ·C)")
    if args.images is not None and args.images % args.batch_size:
        raise UserInputError(f"--images: {args.images} images do not split into batches of --batch-size {args.batch_size}")


def command_invert(args: argparse.Namespace) -> int:
    import time

    from attacks.reconstruction.inversion import invert
    from audit.core.atomic import write_bytes, write_json
    from audit.core.datasets import load_dataset
    from audit.core.output_folder import claim

    _check_invert_options(args)
    dataset = load_dataset(args.dataset, args.data_root)
    if dataset.kind != "image" or len(dataset.input_shape) != 3:
        raise UserInputError(f"--dataset: '{args.dataset}' is not an image dataset; gradient inversion reconstructs images")
    started = time.perf_counter()
    result = invert(args.attack, dataset, args.model, args.batch_size, args.images, args.clip, args.noise or 0.0,
                    args.iterations, args.restarts, args.seed)
    seconds = time.perf_counter() - started
    out = claim(Path(args.out))  # created and locked only now: the attack ran, the input was good
    grid, results = out / "grid.png", out / "results.json"
    write_bytes(grid, result.pop("png"))
    result["grid"] = str(grid)
    write_json(results, result)
    if args.json:
        from audit.core.atomic import dumps

        print(dumps(result))
        return EXIT_OK
    print(f"{result['attack']} ({result['reference']}) on {result['dataset']}, {result['model']} untrained "
          f"(seed {result['seed']}): {result['threat']}; {result['images']} images, {result['iterations']} iterations "
          f"× {result['restarts']} restart(s), {seconds:.1f} s")
    per_image = result["per_image"]
    print(f"{'image':>6} {'label':>6} {'recovered':>10} {'SSIM':>7} {'PSNR dB':>8} {'MSE':>10}")
    for i, index in enumerate(per_image["index"]):
        print(f"{index:>6} {per_image['label'][i]:>6} {per_image['recovered_label'][i]:>10} {per_image['ssim'][i]:>7.3f} "
              f"{per_image['psnr'][i]:>8.2f} {per_image['mse'][i]:>10.3g}")
    print(f"{'mean':>6} {'':>6} {100 * result['label_accuracy']:>9.0f}% {result['ssim']:>7.3f} {result['psnr']:>8.2f} "
          f"{result['mse']:>10.3g}")
    print(f"grid:    {grid} (top: private images, bottom: reconstructions)")
    print(f"results: {results}")
    return EXIT_OK
