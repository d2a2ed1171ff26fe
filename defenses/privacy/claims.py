"""What a privacy claim states: ε and δ, for which unit and neighbouring relation, against whom.

An (ε, δ)-DP statement is about a pair of neighbouring inputs *and an observer*. A
:class:`PrivacyClaim` therefore carries, besides its headline figure, one :class:`AdversaryClaim`
per observer the defense's noise is meant to protect against:

* ``released`` — a third party that sees the released global models (every round's). It does
  not know who was sampled, so amplification by subsampling applies (Balle, Barthe, Gaboardi
  2018; Mironov, Talwar, Zhang 2019).
* ``server`` — the aggregator. It picks the participants, so it knows who took part: no
  amplification; a client's privacy loss comes from the rounds it joined. It sees the aggregate
  under secure aggregation, each upload without it.
* ``local`` — one upload on its own (the server without secure aggregation, an eavesdropper).

Neighbouring relations (:class:`audit.core.vocabulary.Relation`): ``add-remove`` (one unit added or removed),
``replace-one`` (one unit's data replaced: twice the sensitivity of add/remove for a clipped sum)
and ``zero-out`` (the unit stays, its data is replaced by data that contributes nothing — the
relation an observer who knows the participants can be held to; Kairouz et al. 2021, "Practical
and private (deep) learning without sampling or shuffling", §2).

A figure of ``None`` means "not covered": the defense makes no statement for that observer, and
the notes say why.

Participation against the server (:func:`participation_bound`): a client joins each round with
probability q, so its count K of rounds is Binomial(T, q). Who takes part does not depend on
the data, so if K ≤ k except with probability β and k rounds are (ε_k, δ − β)-DP, the whole run
is (ε_k, δ)-DP for that observer (β is paid from δ; here β = δ/2). The server figure is the
smaller of that and the figure for all T rounds (both are valid bounds). Every server figure
assumes honest sampling (:data:`HONEST_SAMPLING`, stated by :func:`server_notes`): the server
picks who takes part as the protocol says, independently of the data — a malicious server could
put the target in every round.

A mean divided by the *realised* number of participants |P_t| reveals |P_t|: a neighbour with one
client more or fewer changes the scale of everything released, which the Gaussian analysis (noise
on the sum, a public divisor) does not cover. It does cover neighbours that keep every client and
zero one's contribution — the divisor is then the same on both sides (Kairouz, McMahan, Song,
Thakkar, Thakurta, Xu 2021, §2). :func:`divided_by_realised_count` relabels such figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from audit.core.typed_json import from_json, to_json
from audit.core.vocabulary import Observer, Relation, Unit
from defenses.privacy.accounting import GaussianSchedule, accountant_label, compute_epsilon

UNITS: tuple[Unit, ...] = tuple(Unit)
ADVERSARIES: tuple[Observer, ...] = tuple(Observer)
RELATIONS: tuple[Relation, ...] = tuple(Relation)

RELATION_HELP = ("neighbouring relation: one unit added or removed, one unit's data replaced, or one unit's data "
                 "replaced by data that contributes nothing (its participation known)")
ADVERSARY_HELP = ("released: a third party seeing the released models (amplification by sampling applies); server: the "
                  "aggregator, which knows who took part; local: one upload alone")

#: what every server figure assumes (:func:`server_notes`): the participation bound, and the
#: claim that the server only learns who took part, both rest on the sampling being the protocol's
HONEST_SAMPLING = ("assumes honest sampling: the server picks the participants as configured, independently of the "
                   "data (a malicious server could pick the target every round)")

#: why a figure of a mean divided by the realised |P_t| is for zero-out neighbours
REALISED_COUNT_NOTE = ("the mean divides by the realized number of participants, which reveals it: the claim is for "
                       "zero-out neighbours (a client's contribution zeroed, its participation known)")

ADVERSARY_TEXT = {
    Observer.RELEASED: "a third party that sees the released global models",
    Observer.SERVER: "the server, which picks the participants (no amplification by sampling)",
    Observer.LOCAL: "anyone who sees one upload on its own",
}


def _word(kind: type[Unit] | type[Relation] | type[Observer], field_name: str, value: str) -> None:
    """Raise ValueError unless ``value`` is one of ``kind``'s words."""
    if value not in tuple(kind):
        raise ValueError(f"{field_name} must be one of {', '.join(kind)}, got {value}")


@dataclass(frozen=True)
class AdversaryClaim:
    """The guarantee against one observer.

    ``noise_multiplier`` is what a round's Gaussian mechanism is accounted with: the noise std in
    what this adversary sees divided by the largest change one unit can make there under
    ``relation`` (None for non-Gaussian mechanisms); ``round_epsilon`` is ε at ``delta`` of one
    such round without sampling, by the same accountant — the two quantities the conformance
    audit measures against.
    """

    adversary: Observer = field(metadata={"help": ADVERSARY_HELP})
    epsilon: float | None = field(metadata={"min": 0, "help": "null: not covered (see notes)"})
    delta: float = field(metadata={"min": 0, "max": 1})
    relation: Relation = field(metadata={"help": RELATION_HELP})
    observes: str
    accountant: str = ""
    amplification: bool = field(default=False, metadata={"help": "whether amplification by sampling is credited"})
    rounds: int | None = field(default=None, metadata={
        "help": "rounds accounted (a participation bound for observers who know who took part)"})
    noise_multiplier: float | None = field(default=None, metadata={
        "help": "the per-round Gaussian noise multiplier accounted, per change one unit can make in what this observer sees"})
    round_epsilon: float | None = field(default=None, metadata={
        "help": "ε of one round without sampling (what the conformance audit compares with)"})
    participation_rate: float | None = field(default=None, metadata={
        "min": 0, "max": 1, "help": "the rate q at which the claim accounts each unit to take part in a round (its "
                                    "amplification, or its bound on the rounds a unit joins); null: not accounted"})
    notes: str = ""

    def __post_init__(self) -> None:
        _word(Observer, "adversary", self.adversary)
        _word(Relation, "relation", self.relation)
        object.__setattr__(self, "adversary", Observer(self.adversary))
        object.__setattr__(self, "relation", Relation(self.relation))

    @property
    def covered(self) -> bool:
        return self.epsilon is not None and math.isfinite(self.epsilon)

    def as_dict(self) -> dict[str, Any]:
        """As JSON (:func:`audit.core.typed_json.to_json`): ε null when not covered."""
        return to_json(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdversaryClaim:
        return from_json(cls, data)

    @classmethod
    def not_covered(cls, adversary: Observer, why: str, observes: str = "", relation: Relation = Relation.NONE
                    ) -> AdversaryClaim:
        return cls(adversary, None, 0.0, relation, observes, notes=f"not covered: {why}")


@dataclass(frozen=True)
class PrivacyClaim:
    """The guarantee a defense claims: (ε, δ)-DP for neighbouring datasets that differ in one ``unit``.

    ``epsilon`` is the headline figure, against ``adversary`` under ``relation``; ``math.inf`` for
    a non-private defense. ``accountant`` names the accountant, its conversion and its version;
    ``mechanism`` says what was accounted; ``notes`` carries the caveats a reader needs.
    ``adversaries`` holds one figure per observer (:class:`AdversaryClaim`), the headline's among
    them. Where a paper's own accounting differs from a sound one, ``alternatives`` holds the
    other labelled figures.
    """

    epsilon: float = field(metadata={"min": 0, "null_means": math.inf, "help":
                                     "the headline figure (against `adversary`); null: no DP claim (or no finite bound)"})
    delta: float = field(metadata={"min": 0, "max": 1})
    unit: Unit
    accountant: str = field(metadata={"help": "accountant and RDP→(ε,δ) conversion, e.g. rdp-improved"})
    mechanism: str = ""
    notes: str = ""
    alternatives: dict[str, float] = field(default_factory=dict)
    relation: Relation = field(default=Relation.NONE, metadata={"help": RELATION_HELP})
    adversary: Observer = field(default=Observer.RELEASED, metadata={"help": ADVERSARY_HELP})
    adversaries: tuple[AdversaryClaim, ...] = field(default=(), metadata={
        "help": "one figure per observer: released models, the server, one upload alone"})

    def __post_init__(self) -> None:
        _word(Unit, "unit", self.unit)
        _word(Relation, "relation", self.relation)
        _word(Observer, "adversary", self.adversary)
        object.__setattr__(self, "unit", Unit(self.unit))
        object.__setattr__(self, "relation", Relation(self.relation))
        object.__setattr__(self, "adversary", Observer(self.adversary))

    @property
    def is_private(self) -> bool:
        return math.isfinite(self.epsilon)

    def against(self, adversary: Observer) -> AdversaryClaim | None:
        """The figure for ``adversary`` (None when the claim does not name it)."""
        return next((a for a in self.adversaries if a.adversary == adversary), None)

    def as_dict(self) -> dict[str, Any]:
        """As JSON (:func:`audit.core.typed_json.to_json`): ε null for no claim (JSON has no infinity)."""
        return to_json(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyClaim:
        """The inverse of :meth:`as_dict` (ε null → ∞, by the field's ``null_means``)."""
        return from_json(cls, data)

    def for_observer(self, adversary: Observer) -> PrivacyClaim | None:
        """The claim as ``adversary`` is promised it: that observer's figure as the headline (None
        when the claim does not name the observer)."""
        figure = self.against(adversary)
        if figure is None:
            return None
        epsilon = float(figure.epsilon) if figure.covered and figure.epsilon is not None else math.inf
        return PrivacyClaim(epsilon, figure.delta, self.unit, figure.accountant or self.accountant, self.mechanism,
                            figure.notes, relation=figure.relation if figure.covered else Relation.NONE,
                            adversary=adversary, adversaries=(figure,))

    @classmethod
    def non_private(cls, notes: str = "") -> PrivacyClaim:
        return cls(math.inf, 0.0, Unit.NONE, "none", "no noise", notes,
                   adversaries=tuple(AdversaryClaim.not_covered(a, "no differential privacy") for a in ADVERSARIES))


# --------------------------------------------------------------------------- shared caveats


def server_notes(*parts: str) -> str:
    """The notes of a server figure: ``parts`` (empty ones dropped) and, last, the honest-sampling
    assumption every server figure rests on (:data:`HONEST_SAMPLING`), stated in one place."""
    return "; ".join([part for part in parts if part] + [HONEST_SAMPLING])


def divided_by_realised_count(adversaries: tuple[AdversaryClaim, ...]) -> tuple[tuple[AdversaryClaim, ...], str | None]:
    """The figures of a defense whose released mean divides by the realised |P_t|: every add-remove
    figure becomes zero-out (its ε is unchanged: a zeroed contribution moves the sum exactly as an
    added or removed one does, and the divisor is then the same on both sides; Kairouz et al. 2021,
    §2). Returns the figures and :data:`REALISED_COUNT_NOTE`, or None when no figure was add-remove
    (replace-one under fixed-size sampling keeps |P_t| = m, and zero-out stays as it is)."""
    if not any(a.relation == Relation.ADD_REMOVE for a in adversaries):
        return adversaries, None
    relabelled = tuple(replace(a, relation=Relation.ZERO_OUT) if a.relation == Relation.ADD_REMOVE else a
                       for a in adversaries)
    return relabelled, REALISED_COUNT_NOTE


# --------------------------------------------------------------------------- participation and Gaussian rounds


def participation_bound(rounds: int, rate: float, beta: float) -> int:
    """The smallest k with P(Binomial(rounds, rate) > k) ≤ β: how many rounds a client joins, except
    with probability β (exact, float64; every round when the rate is 1)."""
    if rate >= 1.0 or rounds == 0:
        return rounds
    from scipy.stats import binom

    tails = binom.sf(np.arange(rounds + 1), rounds, rate)  # P(K > k) for k = 0..T
    return int(np.flatnonzero(tails <= beta)[0])


def known_participation_epsilon(noise_multiplier: float, rounds: int, rate: float, delta: float,
                                accountant: str, conversion: str) -> tuple[float, int]:
    """ε at δ of a client's rounds when the observer knows who took part: plain Gaussian rounds,
    either every one of the ``rounds`` or the β = δ/2 participation bound (ε at δ/2), whichever
    is smaller. Returns (ε, rounds accounted)."""
    every = compute_epsilon(GaussianSchedule(noise_multiplier, 1.0, rounds), delta, accountant, conversion).epsilon
    if rate >= 1.0 or rounds == 0:
        return every, rounds
    bound = participation_bound(rounds, rate, delta / 2)
    bounded = compute_epsilon(GaussianSchedule(noise_multiplier, 1.0, bound), delta / 2, accountant, conversion).epsilon
    return (bounded, bound) if bounded < every else (every, rounds)


def gaussian_round_epsilon(noise_multiplier: float, delta: float, accountant: str, conversion: str) -> float:
    """ε at δ of one Gaussian round with this multiplier, no sampling."""
    return compute_epsilon(GaussianSchedule(noise_multiplier, 1.0, 1), delta, accountant, conversion).epsilon


@dataclass(frozen=True)
class GaussianRounds:
    """How a round-based Gaussian defense's noise reaches each observer.

    ``aggregate`` and ``upload`` are the noise multipliers of the summed aggregate and of one
    upload (noise std over the clip's sensitivity S), None where the noise there does not
    support a claim; ``server_sees`` is "aggregate", "uploads" or None (the server is not
    covered: ``server_note`` says why); ``why_not`` explains a None multiplier.
    """

    aggregate: float | None
    upload: float | None
    server_sees: str | None
    rounds: int
    rate: float
    sampling: str
    population: int
    server_note: str = ""
    why_not: str = ""


def gaussian_adversaries(noise: GaussianRounds, delta: float, accountant: str, conversion: str
                         ) -> tuple[AdversaryClaim, ...]:
    """The released / server / local figures of T rounds of a clipped-sum Gaussian mechanism.

    released: the sampled Gaussian on the aggregate with amplification (add/remove under Poisson
    or full participation; replace-one, σ/2 per change of 2S, under fixed-size sampling — the
    relation dp-accounting analyses); server and local: plain Gaussian rounds, participation
    known (:func:`known_participation_epsilon`), zero-out neighbours, the server's notes stating
    the honest sampling it assumes (:func:`server_notes`). A defense whose mean divides by the
    realised |P_t| passes the result through :func:`divided_by_realised_count`.
    """
    label = accountant_label(accountant, conversion)
    out: list[AdversaryClaim] = []
    fixed = noise.sampling == "fixed" and noise.rate < 1
    if noise.aggregate is None:
        out.append(AdversaryClaim.not_covered(Observer.RELEASED, noise.why_not, "the global model after every round"))
    else:
        schedule = GaussianSchedule(noise.aggregate, noise.rate, noise.rounds, noise.sampling, noise.population)
        report = compute_epsilon(schedule, delta, accountant, conversion)
        per_change = noise.aggregate / 2 if fixed else noise.aggregate
        out.append(AdversaryClaim(
            Observer.RELEASED, report.epsilon, delta, Relation.REPLACE_ONE if fixed else Relation.ADD_REMOVE,
            "the global model after every round", report.label, amplification=noise.rate < 1, rounds=noise.rounds,
            noise_multiplier=per_change, round_epsilon=gaussian_round_epsilon(per_change, delta, accountant, conversion),
            participation_rate=noise.rate, notes=schedule.describe()))
    views = {"aggregate": (noise.aggregate, "the aggregate of every round it runs"),
             "uploads": (noise.upload, "every client's upload")}
    for adversary in (Observer.SERVER, Observer.LOCAL):
        if adversary == Observer.SERVER:
            if noise.server_sees is None:
                out.append(AdversaryClaim.not_covered(Observer.SERVER, noise.server_note))
                continue
            multiplier, observes = views[noise.server_sees]
        else:
            multiplier, observes = noise.upload, "one client's upload"
        if multiplier is None:
            why = noise.why_not or "the uploads carry no noise of their own"
            out.append(AdversaryClaim.not_covered(adversary, why, observes))
            continue
        epsilon, counted = known_participation_epsilon(multiplier, noise.rounds, noise.rate, delta, accountant, conversion)
        participation = (f"all {noise.rounds} rounds" if counted == noise.rounds else
                         f"at most {counted} of the {noise.rounds} rounds (more with probability ≤ δ/2, paid from δ)")
        notes = f"Gaussian rounds with noise multiplier {multiplier:.4g}, participation known, {participation}"
        out.append(AdversaryClaim(
            adversary, epsilon, delta, Relation.ZERO_OUT, observes, label, amplification=False, rounds=counted,
            noise_multiplier=multiplier, round_epsilon=gaussian_round_epsilon(multiplier, delta, accountant, conversion),
            participation_rate=noise.rate,
            notes=server_notes(notes, noise.server_note) if adversary == Observer.SERVER else notes))
    return tuple(out)


def summary_line(claim: PrivacyClaim) -> str:
    """'released ε = 1, server ε = 8.9, local not covered' — the per-adversary figures in one line."""
    parts = []
    for entry in claim.adversaries:
        parts.append(f"{entry.adversary} ε = {entry.epsilon:.3g}" if entry.covered else f"{entry.adversary} not covered")
    return ", ".join(parts)
