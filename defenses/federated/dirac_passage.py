"""Dirac canary clients through the defense's own code: what they add to a round, read off the
defense's ``privatize_together`` and ``aggregate`` run on ordinary dense rows.

A Dirac canary client (Nasr et al. 2023, §4; Andrew et al. 2024, canary clients) has a raw update
that is zero except ``value`` on one coordinate j. 10⁴ of them join a round, far too many to run as
dense rows, and they must not change the mechanism the real clients meet. So they contribute
**signal only**, and every number about them comes from the defense's own code:

* **Clipping and selection.** The canaries of one round fall into a few classes — the tensor their
  coordinate lies in and their value (±U). One *probe row* per class, a dense row with the class's
  value on one of its canaries' coordinates, replaces a real row at a random position of the round
  (its participant id replaced by a probe id, so its noise is a fresh client's) and goes through
  ``privatize_together`` — a user's override of ``privatize`` included — twice: with the spike and
  with a zero row, on the same round context, so every keyed noise stream is the same (and torch's
  and numpy's global generators, which user code often draws from, are seeded alike for both and
  restored after). The difference is what the defense's code made of the spike: the class's
  clipped value c.
* **Noise.** The canaries add their clipped values Σ c_k e_{j_k} to the round's sum and no noise
  of their own: the noise on their coordinates in the released step is the real clients' noise,
  drawn by the defense's own code for a round of exactly the real participants (|P_t| counts no
  canary, so each real upload's noise is what it is in a canary-free run). The signal enters the
  release through the defense's own ``aggregate`` (added to one upload), and the step it makes
  there gives the divisor the released step standardises with.
* **Each upload.** What a server that sees each upload reads of canary k is c_k plus the noise of
  one upload: the zero probe row's upload at j_k, a client's own noise from the defense's code
  at the round's share (one row serves the round's canaries, on distinct coordinates).
* **The real clients' share.** A canary's coordinate also carries the real clients' clipped
  updates. :func:`real_share` measures that share of the step without its noise, so the audit can
  take it off the readings (an observer who knows the other clients' data could): it only adds
  variance to a canary statistic, and costs power, never validity.

What cannot be isolated is reported, never read around (:attr:`DiracPassage.anomaly`): uploads
that differ between two computations of one round (noise from a source no seed reaches, such as
a generator seeded from the clock), a probe whose output differs from its zero row off its own coordinate (an update spread
over coordinates, noise that depends on the input), another client's upload changed by a canary's
input, a row count that differs, or a step that is not the sum's share of the canaries' signal.
The clipped value is read on one coordinate per class: a defense that treats coordinates of one
tensor differently is measured on the probed one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.seeding import derive_seed, numpy_rng
from defenses.blocks.dirac_rows import DiracRows

if TYPE_CHECKING:
    import torch

    from defenses.federated.round_defense import RoundDefense
    from defenses.federated.training_job import RoundContext
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

#: relative size of a difference that counts as a change (float32 rounding of equal computations is 0)
TOLERANCE = 1e-5


@dataclass(frozen=True)
class DiracPassage:
    """What a round's Dirac canary clients contribute, measured through the defense's own code."""

    signal: torch.Tensor  # [d]: Σ_k c_k e_{j_k}, each canary's clipped value on its coordinate
    readings: torch.Tensor  # [K]: canary k's upload at j_k as a server that sees it reads it
    anomaly: str | None = None  # why the canaries' path could not be isolated (None: it was)


def probe_classes(rows: DiracRows, boundaries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class of each canary, the canary representing each class): canaries of one tensor
    (``boundaries``: the tensors' first coordinates) and one value are one class; zero-valued
    canaries are class −1 (they contribute nothing)."""
    coords = rows.coords.cpu().numpy()
    values = rows.values.detach().double().cpu().numpy()
    tensors = np.searchsorted(boundaries, coords, side="right") - 1
    classes = np.full(len(coords), -1, dtype=np.int64)
    live = np.flatnonzero(values != 0.0)
    if live.size == 0:
        return classes, np.zeros(0, dtype=np.int64)
    keys = np.stack([tensors[live].astype(np.float64), values[live]], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    # classes numbered in order of first appearance, as the canaries are listed
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    classes[live] = rank[np.asarray(inverse).ravel()]
    return classes, live[first[order]]


@contextmanager
def _global_streams(key: int, device: torch.device) -> Iterator[None]:
    """Torch's and numpy's global generators seeded with ``key`` for one computation, and restored
    after it: a defense that draws its noise from them (``torch.randn_like``, ``np.random.normal``)
    gives the same draws to the two computations of a probe, and the run's own streams are untouched."""
    devices = [device.index or 0] if device.type == "cuda" else []
    state = np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            # the generators this computation can reach, not torch.manual_seed: that also queues
            # seeds for every accelerator backend, a traceback each, costly in a per-round probe
            torch.default_generator.manual_seed(key % (1 << 63))
            if devices:
                torch.cuda.manual_seed(key % (1 << 63))
            np.random.seed(key % (1 << 32))
            yield
    finally:
        np.random.set_state(state)


def _privatized(defense: RoundDefense, rows: torch.Tensor, ctx: RoundContext, key: int) -> torch.Tensor:
    """The defense's own uploads of ``rows`` in ``ctx``, its global generators (if it uses them) seeded with ``key``."""
    with _global_streams(key, rows.device):
        return defense.privatize_together([(defense, rows, ctx)])[0][0]


def _changed(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    return (a - b).abs() > TOLERANCE * max(scale, 1.0)


def dirac_passage(defense: RoundDefense, ctx: RoundContext, updates: torch.Tensor, rows: DiracRows) -> DiracPassage:
    """The round's canaries ``rows`` through ``defense``'s own privatisation, beside the real raw
    ``updates`` of ``ctx``'s participants (see the module docstring)."""
    assert ctx.layout is not None
    dim, device, dtype = updates.shape[1], updates.device, updates.dtype
    boundaries = np.cumsum((0,) + ctx.layout.sizes[:-1])
    classes, firsts = probe_classes(rows, boundaries)
    coords = rows.coords.to(device)
    # the probes: one spike per class, then the zero row whose upload gives each canary its noise
    spikes = [(int(rows.coords[k]), float(rows.values[k])) for k in firsts]
    probes: list[tuple[int, float] | None] = [*spikes, None]
    clipped = torch.zeros(len(spikes), dtype=torch.float64)
    zero_upload: torch.Tensor | None = None
    n = len(ctx.participants)
    anomaly = None
    for g, start in enumerate(range(0, len(probes), n)):
        group = probes[start:start + n]
        positions = np.sort(numpy_rng(ctx.seed, "round", ctx.round, "dirac-probe", g).choice(n, len(group), replace=False))
        participants = np.array(ctx.participants, copy=True)
        participants[positions] = ctx.num_clients + start + np.arange(len(group))
        sizes = np.array(ctx.sizes, copy=True)
        sizes[positions] = max(1, int(np.median(ctx.sizes)))
        data = list(ctx.client_data)
        for p in positions:
            data[int(p)] = np.array([], dtype=np.int64)
        probe_ctx = replace(ctx, participants=participants, sizes=sizes, client_data=data)
        zero = updates.clone()
        zero[torch.as_tensor(positions, device=device)] = 0
        spiked = zero.clone()
        for p, probe in zip(positions, group):
            if probe is not None:
                spiked[int(p), probe[0]] = probe[1]
        # the zero row and the spikes: two computations of one round that differ only in the probes' inputs
        key = derive_seed(ctx.seed, "round", ctx.round, "dirac-probe", g, "global-streams")
        outputs = [_privatized(defense, x, probe_ctx, key) for x in (zero, spiked)]
        if any(tuple(o.shape) != tuple(zero.shape) for o in outputs):
            anomaly = (f"privatize returned {[tuple(o.shape) for o in outputs]} for {tuple(zero.shape)} rows with the "
                       "canary probes")
            break
        base, moved = (o.detach().to(torch.float64) for o in outputs)
        scale = float(base.abs().max()) if base.numel() else 1.0
        # every row without a spike (the zero probe row's included) must repeat exactly: what differs
        # comes from a source no seed reaches or from another row's input; the spike rows are
        # checked off their coordinate below
        spike_rows = [int(p) for p, probe in zip(positions, group) if probe is not None]
        still = np.setdiff1d(np.arange(n), spike_rows)
        if len(still) and bool(_changed(moved[still], base[still], scale).any()):
            anomaly = ("the defense's uploads differ between two computations of one round that differ only in the "
                       "canary probes' inputs (noise from a source no seed reaches, or an upload that depends on "
                       "another client's input): the canaries' clipped values cannot be read")
            break
        for i, (p, probe) in enumerate(zip(positions, group)):
            row = moved[int(p)] - base[int(p)]
            if probe is None:
                zero_upload = base[int(p)]
                continue
            off = row.clone()
            off[probe[0]] = 0
            if bool((off.abs() > TOLERANCE * max(scale, abs(float(row[probe[0]])), 1.0)).any()):
                anomaly = ("a one-coordinate input's upload differs from the zero row's off that coordinate (the update "
                           "spread over coordinates, or noise that depends on the input): the canaries' clipped values "
                           "cannot be read")
                break
            clipped[start + i] = row[probe[0]]
        if anomaly is not None:
            break
    if anomaly is not None or zero_upload is None:
        empty = torch.zeros(len(rows), dtype=torch.float64)
        return DiracPassage(torch.zeros(dim, dtype=dtype, device=device), empty, anomaly or "no zero probe row")
    values = torch.where(torch.as_tensor(classes >= 0), clipped[torch.as_tensor(np.maximum(classes, 0))],
                         torch.zeros(len(rows), dtype=torch.float64))
    signal = torch.zeros(dim, dtype=torch.float64).index_add_(0, coords.cpu(), values)
    readings = values + zero_upload.cpu()[coords.cpu()]
    return DiracPassage(signal.to(device=device, dtype=dtype), readings)


def released_step(defense: RoundDefense, uploads: torch.Tensor, ctx: RoundContext, passage: DiracPassage,
                  coords: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, float | None, str | None]:
    """The round's step with the canaries' signal, through the defense's own ``aggregate``: the
    signal added to the first upload (a sum carries it whichever upload it rides on); ``step`` is
    the defense's step of the same uploads without the canaries. Returns
    (step, the divisor the step shows: signal / its share of the step, anomaly or None). Where no
    canary contributes, a unit on the first canary coordinate, not released, measures the divisor."""
    signal = passage.signal.to(uploads)
    test = signal if bool(signal.abs().max() > 0) else torch.zeros_like(signal).index_fill_(0, coords[:1].to(signal.device), 1.0)
    carried = uploads.clone()
    carried[0] = carried[0] + test
    with_signal = defense.aggregate(carried, ctx)
    if with_signal.shape != step.shape:
        return step, None, f"aggregate returned steps of shapes {tuple(step.shape)} and {tuple(with_signal.shape)}"
    change = (with_signal - step).detach().to(torch.float64)
    on = test.detach().to(torch.float64) != 0
    scale = float(change[on].abs().max()) if bool(on.any()) else 0.0
    if not scale > 0 or bool((change[~on].abs() > TOLERANCE * scale).any()):
        return step, None, "the canaries' signal does not reach the released step as a share of the sum"
    ratios = test.detach().to(torch.float64)[on] / change[on]
    divisor = float(ratios.median())
    if not divisor > 0 or float((ratios / divisor - 1).abs().max()) > 1e-3:
        return step, None, "the released step divides the canaries' signal by no one divisor"
    return (with_signal if test is signal else step), divisor, None


def real_share(defense: RoundDefense, updates: torch.Tensor, plain: torch.Tensor, ctx: RoundContext) -> torch.Tensor | None:
    """The step the real clients' contributions make without noise — what a canary's coordinate
    carries besides the canary and the noise (the real clients' drift), which an observer who knows
    the other clients' data and the released model could compute — or None where it cannot be told
    from the noise. It is the round's step less the step of all-zero rows on the same keyed streams
    (the noise cancels); the same difference on other streams must agree, else the defense's noise
    depends on its inputs and the difference would carry noise (subtracting it would remove noise
    the claim counts on)."""

    def step(rows: torch.Tensor, context: RoundContext) -> torch.Tensor:
        # the keyed streams alone: noise from the global generators is not the release's and cannot cancel
        out = _privatized(defense, rows, context, derive_seed(context.seed, "round", context.round, "dirac-drift"))
        return defense.aggregate(out, context).detach().to(torch.float64)

    zeros = torch.zeros_like(updates)
    first = plain.detach().to(torch.float64) - step(zeros, ctx)
    other = replace(ctx, seed=derive_seed(ctx.seed, "dirac-drift"))
    second = step(updates.clone(), other) - step(zeros, other)
    if first.shape != second.shape:
        return None
    scale = max(float(first.abs().max()), float(second.abs().max()), 1e-12)
    return first if bool(((first - second).abs() <= 1e-4 * scale + 1e-9).all()) else None
