"""What a Dirac canary run recorded beside its models, as the statistics read it: which canaries
a round released, the real clients' share of each step on the canaries' coordinates, and the
noise in each held-out reading (:mod:`defenses.federated.canary_clients` writes these views)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attacks.canaries.canary_audit import CanaryRun
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def exercised_canaries(runs: list[CanaryRun]) -> np.ndarray:
    """[runs, K]: whether each canary's coordinate was released in a round it joined (the run's
    ``dirac/exercised``, written where some was not; public — the defense's trainable subset —
    whatever the coins). A canary the mechanism never met is no coin."""
    out = []
    for run in runs:
        view = run.server_view or {}
        count = len(run.injection.inserted)
        out.append(view["dirac/exercised"].numpy().astype(bool) if "dirac/exercised" in view else np.ones(count, dtype=bool))
    return np.stack(out)


def real_drift(run: CanaryRun) -> np.ndarray:
    """[T, K]: the real clients' noise-free share of each step on each canary's coordinate, which an
    observer who knows the other clients' data could compute from the released models
    (:func:`defenses.federated.dirac_passage.real_share`); zeros where the run could not tell it
    from the noise (the readings then keep it: less power, the same validity)."""
    coords = run.injection.dirac_coords
    view = run.server_view or {}
    if "dirac/drift" not in view:
        return np.zeros((run.iterates.shape[0] if run.iterates is not None else 0, 0 if coords is None else len(coords)))
    return view["dirac/drift"].to(torch.float64).numpy()


def drift_known(run: CanaryRun) -> bool:
    """Whether the run told the real clients' share of every step from the noise (else its readings
    keep that share: :func:`real_drift` gives zeros)."""
    return "dirac/drift" in (run.server_view or {})


def conformance_block(run: CanaryRun, uploads: np.ndarray, mirrored: bool) -> np.ndarray:
    """The uploads the conformance tests read [T, K]: the inserted canaries' as the server sees
    them; a held-out canary's is its noise alone — what it uploads under zero-out, and under
    the mirrored design its upload less its (mirrored) clipped value, which the defense's own
    code gave it (recorded by the run as ``dirac/noise``)."""
    view = run.server_view or {}
    if "dirac/noise" not in view:
        if mirrored:
            raise ValueError("a mirrored Dirac canary run records each reading's noise; this run has none")
        return uploads
    noise = view["dirac/noise"].to(torch.float64).numpy()
    return np.where(run.injection.inserted[None, :], uploads, noise)

