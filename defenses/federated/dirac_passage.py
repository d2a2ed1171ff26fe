"""Dirac canary clients through the defense's own code: what they add to a round, read off the
defense's ``privatize_together`` and ``aggregate`` run on ordinary dense rows.

A Dirac canary client (Nasr et al. 2023, §4; Andrew et al. 2024, canary clients) has a raw update
that is zero except ``value`` on one coordinate j. 10⁴ of them join a round, far too many to run as
dense rows, and they must not change the mechanism the real clients meet. So they contribute
**signal only**, and every number about them comes from the defense's own code:

* **Clipping and selection.** Each canary's value is read on a *probe row*: a dense row with the
  canary's value on its coordinate, which replaces a real row at a random position of the round
  (its participant id replaced by a probe id, so its noise is a fresh client's; its data, which a
  defense such as LUS reads, stays) and goes through ``privatize_together`` — a user's override of
  ``privatize`` included — against one computation with every probe row zero, on the same round
  context, so every keyed noise stream is the same (and torch's and numpy's global generators,
  which user code often draws from, are seeded alike for all of them and restored after). The
  difference is what the defense's code made of the spike: the canary's clipped value c — zero
  where a mask (rand-k, a frozen coordinate, a top-k that drops it) kept it out. The spikes of one
  computation sit in distinct rows, so a round of n clients reads n − 1 canaries a computation.
  Where the defense's code is *known* to treat alike the canaries of one class — the tensor their
  coordinate lies in and their value (±U), as DP-FedAvg's own clip and noise do
  (:meth:`~defenses.audit_hooks.AuditHooks.dirac_canaries_alike`) — one probe per class reads
  them all; any other code, a user's override included, is read canary by canary.
* **Noise.** The canaries add their clipped values Σ c_k e_{j_k} to the round's sum and no noise
  of their own: the noise on their coordinates in the released step is the real clients' noise,
  drawn by the defense's own code for a round of exactly the real participants (|P_t| counts no
  canary, so each real upload's noise is what it is in a canary-free run). The signal enters the
  release through the defense's own ``aggregate`` (added to one upload), and the step it makes
  there gives the divisor the released step standardises with.
* **Each upload.** What a server that sees each upload reads of canary k is c_k plus the noise of
  one upload: the zero probe row's upload at j_k, a client's own noise from the defense's code
  at the round's share (one row serves the round's canaries, on distinct coordinates).
* **The origin.** "Zero" is what the defense clips: the zero update for a defense that clips
  updates; for one that clips something else, its pre-image (NbAFL clips the model w_0 + Δ, so a
  probe row holds Δ = −w_0 and a canary's spike sits on it: the canary's model is s·U·e_j). A
  reading is taken relative to the origin's upload, whose offset is public.
* **The real clients' share.** A canary's coordinate also carries the real clients' clipped
  updates. :func:`real_share` measures that share of the step without its noise, so the audit can
  take it off the readings (an observer who knows the other clients' data could): it only adds
  variance to a canary statistic, and costs power, never validity.

What cannot be isolated is reported, never read around (:attr:`DiracPassage.anomaly`): uploads
that differ between two computations of one round (noise from a source no seed reaches, such as
a generator seeded from the clock), a probe whose output differs from its zero row off its own coordinate (an update spread
over coordinates, noise that depends on the input), another client's upload changed by a canary's
input, a row count that differs, or a step that is not the sum's share of the canaries' signal.
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
    noise: torch.Tensor | None = None  # [K]: the noise in each reading (the reading less the canary's clipped value)
    anomaly: str | None = None  # why the canaries' path could not be isolated (None: it was)
    dropped: int = 0  # inserted canaries the defense's own code kept out (clipped value 0: a mask, LUS's |g⊙Δ|)


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


def each_canary(rows: DiracRows) -> tuple[np.ndarray, np.ndarray]:
    """(class of each canary, the canary representing each class) with every live canary a class
    of its own: each is measured on its own probe row; zero-valued canaries are class −1."""
    classes = np.full(len(rows), -1, dtype=np.int64)
    live = np.flatnonzero(rows.values.detach().cpu().numpy() != 0.0)
    classes[live] = np.arange(live.size)
    return classes, live


def dirac_passage(defense: RoundDefense, ctx: RoundContext, updates: torch.Tensor, rows: DiracRows, *,
                  alike: bool = False, origin: torch.Tensor | None = None) -> DiracPassage:
    """The round's canaries ``rows`` through ``defense``'s own privatisation, beside the real raw
    ``updates`` of ``ctx``'s participants (see the module docstring). ``alike``: the defense's code
    is known to treat the canaries of one class (tensor, value) alike, so one probe per class
    reads them all; otherwise every canary is read on a probe row of its own. ``origin``: the raw
    update the defense's code makes zero before its noise (:meth:`~defenses.audit_hooks.AuditHooks.dirac_origin`;
    None: the zero update) — the probe rows hold it, and a canary's spike sits on it."""
    assert ctx.layout is not None
    dim, device, dtype = updates.shape[1], updates.device, updates.dtype
    boundaries = np.cumsum((0,) + ctx.layout.sizes[:-1])
    classes, firsts = probe_classes(rows, boundaries) if alike else each_canary(rows)
    coords = rows.coords.to(device)
    coords_np = rows.coords.cpu().numpy()
    values_np = rows.values.detach().double().cpu().numpy()
    # the probe rows replace real rows at random positions (their ids a fresh client's, so their noise
    # is); the last is the zero row, whose upload gives each canary its noise; the others carry the
    # spikes, as many computations as it takes, all against one computation with every probe row zero
    n = len(ctx.participants)
    slots = min(n, len(firsts) + 1)
    positions = np.sort(numpy_rng(ctx.seed, "round", ctx.round, "dirac-probe", 0).choice(n, slots, replace=False))
    spike_slots = positions[:-1] if slots > 1 else positions
    participants = np.array(ctx.participants, copy=True)
    participants[positions] = ctx.num_clients + np.arange(slots)
    sizes = np.array(ctx.sizes, copy=True)
    sizes[positions] = max(1, int(np.median(ctx.sizes)))
    # a probe row keeps the data of the client it replaces (or, where that one holds none, a
    # participant's that does): a defense that reads a client's data to privatise its update
    # (LUS's |g ⊙ Δ|) meets a client with data whose update is the spike
    data = list(ctx.client_data)
    holders = [i for i in range(n) if len(data[i])]
    empty = [int(p) for p in positions if not len(data[int(p)])]
    for k, p in enumerate(empty if holders else []):
        data[p] = data[holders[k % len(holders)]]
    probe_ctx = replace(ctx, participants=participants, sizes=sizes, client_data=data)
    zero = updates.clone()
    base_row = torch.zeros(dim, dtype=dtype, device=device) if origin is None else origin.detach().to(device=device, dtype=dtype)
    zero[torch.as_tensor(positions, device=device)] = base_row
    # every computation of the round on the same global streams: user code that draws its noise from
    # them gives the zero row and each spike the same draws
    key = derive_seed(ctx.seed, "round", ctx.round, "dirac-probe", 0, "global-streams")
    base_out = _privatized(defense, zero, probe_ctx, key)
    clipped = torch.zeros(len(firsts), dtype=torch.float64)
    anomaly = None
    if tuple(base_out.shape) != tuple(zero.shape):
        anomaly = f"privatize returned {tuple(base_out.shape)} for {tuple(zero.shape)} rows with the canary probes"
    else:
        base = base_out.detach().to(torch.float64)
        scale = float(base.abs().max()) if base.numel() else 1.0
        for start in range(0, len(firsts), len(spike_slots)):
            group = firsts[start:start + len(spike_slots)]
            used = spike_slots[:len(group)]
            spiked = zero.clone()
            at_rows = torch.as_tensor(used, device=device)
            at_coords = torch.as_tensor(coords_np[group], device=device)
            spiked[at_rows, at_coords] = base_row[at_coords] + torch.as_tensor(values_np[group], dtype=dtype, device=device)
            anomaly = _read_spikes(_privatized(defense, spiked, probe_ctx, key), base, scale, used, coords_np[group],
                                   clipped[start:start + len(group)])
            if anomaly is not None:
                break
    if anomaly is not None:
        empty = torch.zeros(len(rows), dtype=torch.float64)
        return DiracPassage(torch.zeros(dim, dtype=dtype, device=device), empty, anomaly=anomaly)
    # the zero probe row's upload less the origin it holds: the noise the defense's code gives one client
    noise = (base[int(positions[-1])] - base_row.to(torch.float64)).cpu()[coords.cpu()]
    values = torch.where(torch.as_tensor(classes >= 0), clipped[torch.as_tensor(np.maximum(classes, 0))],
                         torch.zeros(len(rows), dtype=torch.float64))
    signal = torch.zeros(dim, dtype=torch.float64).index_add_(0, coords.cpu(), values)
    dropped = int(((values == 0) & torch.as_tensor(classes >= 0)).sum())
    return DiracPassage(signal.to(device=device, dtype=dtype), values + noise, noise, dropped=dropped)


def _read_spikes(output: torch.Tensor, base: torch.Tensor, scale: float, used: np.ndarray, coords: np.ndarray,
                 into: torch.Tensor) -> str | None:
    """Each spike row's clipped value (its upload less the zero computation's, on its coordinate)
    written ``into``; or why the spikes cannot be read."""
    if tuple(output.shape) != tuple(base.shape):
        return f"privatize returned {tuple(output.shape)} for {tuple(base.shape)} rows with the canary probes"
    moved = output.detach().to(torch.float64)
    # every row without a spike (the zero probe row's included) must repeat exactly: what differs
    # comes from a source no seed reaches or from another row's input
    still = np.setdiff1d(np.arange(base.shape[0]), used)
    if len(still) and bool(_changed(moved[still], base[still], scale).any()):
        return ("the defense's uploads differ between two computations of one round that differ only in the canary "
                "probes' inputs (noise from a source no seed reaches, or an upload that depends on another client's "
                "input): the canaries' clipped values cannot be read")
    at_rows = torch.as_tensor(used, device=base.device)
    at_coords = torch.as_tensor(coords, device=base.device)
    change = moved[at_rows] - base[at_rows]
    on = change[torch.arange(len(used), device=base.device), at_coords].clone()
    change[torch.arange(len(used), device=base.device), at_coords] = 0
    limit = TOLERANCE * torch.clamp(torch.maximum(on.abs(), torch.full_like(on, scale)), min=1.0)
    if bool((change.abs() > limit[:, None]).any()):
        return ("a one-coordinate input's upload differs from the zero row's off that coordinate (the update spread "
                "over coordinates, or noise that depends on the input): the canaries' clipped values cannot be read")
    into.copy_(on.cpu())
    return None


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
