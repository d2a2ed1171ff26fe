"""Do the uploads the server sees carry the mechanism the claim accounts for? Two exact tests on
canary clients' uploads, every round.

Where the server sees each upload (no secure aggregation), a canary client's upload on its
coordinate is, by the mechanism the claim accounts (the clipped-sum Gaussian mechanism of
McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models", Alg. 1, its
noise placed in the uploads as equal shares), its clipped contribution c, |c| ≤ S, plus Gaussian
noise whose std s_t is the same for every upload of round t and at least
the std s the server's figure accounts (its noise multiplier times S). The canary's raw update is
known to the auditor, and the uploads are the defense's own output, so these are tests of the
implementation against the claim without anything about training:

* **noise** — a held-out canary under zero-out neighbours uploads a zero update, so its upload is
  N(0, s_t²) and V_t = Σ_k (u_{t,k}/s)² is stochastically at least a χ² variable with n_t degrees
  of freedom (one per held-out upload of round t) whenever s_t ≥ s. The lower tail of χ²_{n_t}
  (each round) and of χ²_n (all rounds pooled) tests "s_t ≥ s" — a noise short of the claim from
  some round on, or everywhere. A bias in the uploads only raises V_t: it cannot make a test fire.
* **clip** — an inserted canary's raw update is ±U with U far above S, so an upload of
  |u| > S + x·s_t means a contribution beyond the clip or noise beyond a Gaussian. With s_t bounded
  above by its χ² confidence limit ŝ_t from the same round's held-out uploads (level γ/T each,
  so all T hold with probability ≥ 1 − γ), the excess e = (|u| − S)/ŝ_t of every inserted upload
  satisfies P(e > x) ≤ P(|Z| > x) = 2Φ̄(x). Over the M inserted uploads the smallest 2Φ̄(e), Y,
  gives the p-value M·Y (a union bound; valid under any dependence between uploads). One extreme
  upload is what an unclipped client leaves; a contribution a little beyond the clip in many
  uploads (a sparsifier's rescaling after the clip, 2.5·S on the 40 % of canaries a rand-k mask
  keeps) is what the *count* of exceedances sees: with the canaries' signs s known, s·u − S ≤
  s·noise, so each upload exceeds S + ŝ_t with probability at most Φ̄(1) (2Φ̄(1) without the signs),
  independently given the contributions (each upload's noise is its own draw), and the count N
  over the M uploads is stochastically at most Binomial(M, Φ̄(1)): its upper tail is the second
  p-value. The clip's p-value is γ + 2·min of the two (Bonferroni).

* **fresh noise** — a held-out canary's uploads in consecutive rounds are independent draws of
  symmetric noise, so the products a = u_{t,k}·u_{t+1,k} have mean 0 given the past (a martingale
  difference sequence) and Σa/√Σa² is approximately N(0, 1); its upper tail tests noise reused
  across rounds (a stream keyed without the round: the same draw every round, ρ = 1).
* **tails** — the held-out uploads, each divided by its round's root mean square, are Gaussian
  under the claim: D'Agostino's one-sided kurtosis test (:func:`audit.core.noise_shape.lighter_tails_p`)
  tests bounded noise of the claimed variance (uniform: excess kurtosis −1.2).

The four are one hypothesis — "the uploads carry the claimed mechanism" — with p-value
4·min(p_noise, p_clip, p_fresh, p_tails) (Bonferroni), the noise p-value itself (T' + 1)·min over
the T' rounds that have held-out uploads and the pooled test. A rejection is a VIOLATION of the claim's mechanism:
less noise than accounted, or a contribution the clip should have bounded. Neither test is an ε
lower bound: it says the accountant was not told what the code does (the conformance check of
the claim, end to end, in every round of a real run). Validated by simulation in the test suite:
rejection at most α under honest uploads (stds above the claim, contributions anywhere in
[−S, S]), and certain rejection of a noise at 0.8 of the claim from round 2 or of one unclipped
upload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from audit.core.noise_shape import lighter_tails_p

if TYPE_CHECKING:
    from scipy import stats
else:  # imported with the first statistic: `list` and `config` name attacks without scipy.stats
    stats = lazy_module("scipy.stats")


#: the share of the clip test's level spent on bounding the noise std from above (γ)
STD_BOUND_LEVEL = 1e-6
#: held-out uploads a round needs before its noise can be measured
MIN_HELD_OUT = 2
#: the tests of the one hypothesis (noise, clip, fresh noise, tails): the Bonferroni factor
TESTS = 4
#: consecutive-round pairs of held-out uploads below which fresh noise is not tested
MIN_PAIRS = 20
#: the clip's count test: exceedances of S by more than this many noise stds (fixed in advance)
COUNT_THRESHOLD = 1.0


@dataclass(frozen=True)
class UploadConformance:
    """The two tests' outcome on one audit's canary uploads (:func:`upload_conformance`)."""

    held_out: int  # held-out canaries' uploads tested for noise (n)
    inserted: int  # inserted canaries' uploads tested against the clip (M)
    rounds: int  # rounds (of all runs) with held-out uploads (T')
    noise_ratio: float  # pooled σ_eff/σ = √(V/n): 1 for noise exactly as claimed
    noise_interval: tuple[float, float]  # its 95 % χ² interval (a confidence interval when s_t is one std)
    least_round: int  # the round (1-based) whose σ_eff/σ is smallest, and that ratio
    least_ratio: float
    excess: float  # the largest (|u| − S)/ŝ_t over inserted uploads, in noise stds (−inf: none)
    excess_round: int  # its round (1-based; 0: none)
    excess_clips: float  # that upload's |u|/S
    p_noise: float
    p_clip: float
    p_value: float
    p_fresh: float = 1.0  # noise reused across rounds (1: not tested)
    fresh_correlation: float = 0.0  # the held-out uploads' correlation between consecutive rounds
    p_tails: float = 1.0  # tails lighter than Gaussian (1: not tested)
    exceeding: int = 0  # inserted uploads more than one noise std beyond the clip (the count test)
    exceed_bound: float = 0.0  # the share of them the claim allows at most
    p_count: float = 1.0  # the clip's two parts: the count of exceedances, and the largest upload
    p_extreme: float = 1.0

    def power(self, level: float) -> float:
        """Probability that the test rejects at ``level`` when every upload carries half the
        claimed noise std — the noise that doubles the μ of a Gaussian claim — through the pooled
        noise test alone (the one-round tests and the clip test can only add to it): fixed by the
        design (the number of held-out uploads), nothing observed."""
        if self.held_out < 1:
            return 0.0
        tail = level / (TESTS * (self.rounds + 1))
        return float(stats.chi2.cdf(4.0 * stats.chi2.ppf(tail, self.held_out), self.held_out))

    def describe(self) -> str:
        """The measured figures in a sentence."""
        low, high = self.noise_interval
        clip = ("no inserted upload to test the clip" if self.inserted == 0 else
                f"largest inserted upload {self.excess_clips:.4g}·S, {self.excess:+.3g} noise stds beyond the clip "
                f"(round {self.excess_round}), {self.exceeding} of {self.inserted} inserted uploads more than one noise "
                f"std beyond it where at most {self.exceed_bound:.1%} may be (p = {self.p_clip:.2g})")
        return (f"noise σ_eff/σ = {self.noise_ratio:.4f} [{low:.4f}, {high:.4f}] over {self.held_out} held-out uploads, "
                f"least {self.least_ratio:.4f} in round {self.least_round} (p = {self.p_noise:.2g}); {clip}; "
                f"consecutive rounds' noise correlation {self.fresh_correlation:+.3f} (p = {self.p_fresh:.2g}); "
                f"tails against the Gaussian's p = {self.p_tails:.2g}")

    def failure(self) -> str:
        """What the rejected test found, for a VIOLATION's sentence."""
        least = min(self.p_noise, self.p_clip, self.p_fresh, self.p_tails)
        if self.p_fresh == least and self.p_fresh < self.p_noise:
            return (f"the uploads' noise repeats from round to round (held-out uploads of consecutive rounds correlate "
                    f"at {self.fresh_correlation:+.3f}): differences of consecutive releases carry no noise")
        if self.p_tails == least and self.p_tails < self.p_noise:
            return ("the uploads' noise has lighter tails than the claimed Gaussian (bounded noise has an unbounded "
                    "privacy loss)")
        if self.p_noise <= self.p_clip:
            return (f"the uploads carry less noise than the claim accounts (σ_eff/σ = {self.least_ratio:.3f} in "
                    f"round {self.least_round}, {self.noise_ratio:.3f} pooled)")
        if self.p_count < self.p_extreme:  # the count, not one upload, is what the clip test rejected
            return (f"{self.exceeding} of {self.inserted} inserted canaries' uploads ({self.exceeding / self.inserted:.1%}) "
                    f"lie more than one noise std beyond the clip S, where a clipped contribution leaves at most "
                    f"{self.exceed_bound:.1%}: contributions the clip should have bounded")
        return (f"an inserted canary's upload reached {self.excess_clips:.4g}·S in round {self.excess_round}, "
                f"{self.excess:.3g} noise stds beyond the clip S: a contribution the clip should have bounded")


def upload_conformance(uploads: Sequence[np.ndarray], inserted: Sequence[np.ndarray], clip: float, claimed_std: float,
                       gamma: float = STD_BOUND_LEVEL, signs: Sequence[np.ndarray] | None = None) -> UploadConformance | None:
    """Both tests on the canary runs' uploads: per run, ``uploads`` [T, K] (each canary's upload on
    its own coordinate per round, NaN where it did not take part) and ``inserted`` [K] (bool: the
    canary's coin); ``clip`` S (the largest contribution one client can make there) and
    ``claimed_std`` s (the least per-upload noise std the claim accounts). A round of a run is the
    unit whose uploads share one noise std. None when no round has :data:`MIN_HELD_OUT` held-out
    uploads (an add/remove design, where held-out canaries are absent: nothing to measure the
    noise on). ``signs`` [K] per run (±1: each canary's raw update's sign) make the count test one-sided.
    """
    if not (clip > 0 and claimed_std > 0 and math.isfinite(clip) and math.isfinite(claimed_std)):
        raise ValueError(f"clip and claimed_std must be positive and finite, got {clip} and {claimed_std}")
    if len(uploads) != len(inserted):
        raise ValueError(f"one inserted mask per run: {len(uploads)} runs of uploads, {len(inserted)} masks")
    if signs is not None and len(signs) != len(uploads):
        raise ValueError(f"one sign vector per run: {len(uploads)} runs of uploads, {len(signs)} sign vectors")
    # per round of a run: (round 1-based, sum of (u/s)² over held-out uploads, their count, inserted |u|,
    # inserted s·u (|u| without the signs))
    rounds: list[tuple[int, float, int, np.ndarray, np.ndarray]] = []
    for r, (run_uploads, run_inserted) in enumerate(zip(uploads, inserted)):
        u = np.asarray(run_uploads, dtype=np.float64)
        keep = np.asarray(run_inserted, dtype=bool)
        if u.ndim != 2 or keep.shape != (u.shape[1],):
            raise ValueError(f"uploads must be [T, K] and inserted [K], got {u.shape} and {keep.shape}")
        signed = np.abs(u) if signs is None else u * np.asarray(signs[r], dtype=np.float64)[None, :]
        taken = ~np.isnan(u)
        for t in range(u.shape[0]):
            out = u[t, taken[t] & ~keep]
            if out.size >= MIN_HELD_OUT:
                rounds.append((t + 1, float(np.sum((out / claimed_std) ** 2)), int(out.size),
                               np.abs(u[t, taken[t] & keep]), signed[t, taken[t] & keep]))
    if not rounds:
        return None
    n, v = sum(c for _, _, c, _, _ in rounds), sum(s for _, s, _, _, _ in rounds)
    tests = len(rounds) + 1
    # lower tails of χ²: each round's, and the pooled one
    p_rounds = [float(stats.chi2.cdf(s, c)) for _, s, c, _, _ in rounds]
    p_noise = min(1.0, tests * min(min(p_rounds), float(stats.chi2.cdf(v, n))))
    ratios = [math.sqrt(s / c) for _, s, c, _, _ in rounds]
    least = int(np.argmin(ratios))
    interval = (math.sqrt(v / stats.chi2.ppf(0.975, n)), math.sqrt(v / stats.chi2.ppf(0.025, n)))
    # the clip: each round's noise std bounded above from its own held-out uploads
    per_round_gamma = gamma / len(rounds)
    log_tail, tested, worst, exceeding = math.inf, 0, (-math.inf, 0, 0.0), 0
    for t, s, c, values, signed in rounds:
        if values.size == 0:
            continue
        upper = claimed_std * math.sqrt(s / stats.chi2.ppf(per_round_gamma, c))
        excess = (values - clip) / upper
        exceeding += int(np.count_nonzero((signed - clip) / upper > COUNT_THRESHOLD))
        tested += values.size
        k = int(np.argmax(excess))
        # log 2Φ̄(e), finite however far the upload lies beyond the clip
        log_tail = min(log_tail, math.log(2.0) + float(stats.norm.logsf(excess[k])))
        if excess[k] > worst[0]:
            worst = (float(excess[k]), t, float(values[k] / clip))
    p_extreme = math.exp(min(0.0, math.log(tested) + log_tail)) if tested else 1.0
    exceed_rate = float(stats.norm.sf(COUNT_THRESHOLD)) * (1.0 if signs is not None else 2.0)
    p_count = float(stats.binom.sf(exceeding - 1, tested, exceed_rate)) if tested else 1.0
    p_clip = min(1.0, gamma + 2.0 * min(p_extreme, p_count)) if tested else 1.0
    p_fresh, correlation = _fresh_noise(uploads, inserted)
    p_tails = _tails(uploads, inserted)
    return UploadConformance(
        held_out=n, inserted=tested, rounds=len(rounds), noise_ratio=math.sqrt(v / n), noise_interval=interval,
        least_round=rounds[least][0], least_ratio=ratios[least], excess=worst[0], excess_round=worst[1],
        excess_clips=worst[2], p_noise=p_noise, p_clip=p_clip, exceeding=exceeding, exceed_bound=exceed_rate,
        p_count=p_count, p_extreme=p_extreme,
        p_value=min(1.0, TESTS * min(p_noise, p_clip, p_fresh, p_tails)), p_fresh=p_fresh, fresh_correlation=correlation,
        p_tails=p_tails)


def _held_out(uploads: Sequence[np.ndarray], inserted: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per run, the held-out canaries' uploads [T, K'] (NaN where a canary did not take part)."""
    return [np.asarray(u, dtype=np.float64)[:, ~np.asarray(keep, dtype=bool)] for u, keep in zip(uploads, inserted)]


def _fresh_noise(uploads: Sequence[np.ndarray], inserted: Sequence[np.ndarray]) -> tuple[float, float]:
    """(p, correlation) of the fresh-noise test: Σa/√Σa² over a = u_t·u_{t+1} of each held-out canary
    in consecutive rounds it took part in (one-sided: reuse correlates positively); p = 1 with fewer
    than :data:`MIN_PAIRS` pairs."""
    products, firsts, seconds = [], [], []
    for u in _held_out(uploads, inserted):
        first, second = u[:-1], u[1:]
        both = ~np.isnan(first) & ~np.isnan(second)
        products.append((first * second)[both])
        firsts.append(first[both])
        seconds.append(second[both])
    a = np.concatenate(products) if products else np.zeros(0)
    if len(a) < MIN_PAIRS or not float(np.sum(a ** 2)) > 0:
        return 1.0, 0.0
    x, y = np.concatenate(firsts), np.concatenate(seconds)
    correlation = float(np.sum(x * y) / math.sqrt(float(np.sum(x ** 2)) * float(np.sum(y ** 2))))
    return float(stats.norm.sf(float(np.sum(a)) / math.sqrt(float(np.sum(a ** 2))))), correlation


def _tails(uploads: Sequence[np.ndarray], inserted: Sequence[np.ndarray]) -> float:
    """p of the light-tails test on the held-out uploads, each divided by its round's root mean square
    (a round of a run shares one noise std); 1 where too few to test."""
    pooled = []
    for u in _held_out(uploads, inserted):
        for row in u:
            values = row[~np.isnan(row)]
            rms = math.sqrt(float(np.mean(values ** 2))) if values.size >= MIN_HELD_OUT else 0.0
            if rms > 0:
                pooled.append(values / rms)
    p = lighter_tails_p(np.concatenate(pooled)) if pooled else None
    return 1.0 if p is None else p
