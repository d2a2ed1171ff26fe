"""Every claim checker of `dpfl-audit reproduce`, on synthetic runs: a case that must fail and one that
must pass, the expected verdict read from what the claim says (not from the code).

A claim "at every ε" is judged at every ε on differences paired by seed; a gain must be positive;
a tie is not "better"; missing runs leave a claim undecided, never "holds".
"""

from __future__ import annotations

import math

import pytest

from audit.reproduce import render
from audit.reproductions import blur_lus, dp_fedsam, fl_top, ldp_fl, udp_fl
from audit.study import ClaimCheck, RunResult, StudyResults, compare


def run(arm: str, epsilon: float | None, seed: int, accuracy: float = 0.5, *, norm: float = 0.5,
        train: float | None = None, sharpness: float | None = None, by_round: dict[int, tuple[float, float]] | None = None,
        alternatives: dict[str, float | None] | None = None) -> RunResult:
    """A run with the given accuracy; ``by_round``: round → (ε so far, test accuracy)."""
    by_round = by_round or {1: (epsilon if epsilon is not None else math.inf, accuracy)}
    return RunResult(arm=arm, epsilon_target=epsilon, seed=seed, epsilon=epsilon if epsilon is not None else math.inf,
                     final_accuracy=accuracy, best_accuracy=accuracy, train_accuracy=accuracy + 0.01 if train is None else train,
                     accuracy_by_round={t: a for t, (_, a) in by_round.items()},
                     epsilon_by_round={t: e for t, (e, _) in by_round.items()},
                     update_norm_first=norm, update_norm_last=norm, update_norm_mean=norm, clip_fraction=1.0,
                     sharpness=sharpness, seconds=0.0, epsilon_alternatives=alternatives or {})


def grid(arm: str, accuracies: dict[float | None, list[float]], **fields) -> list[RunResult]:
    """One run per ε and seed: ``accuracies[ε][seed]``."""
    return [run(arm, epsilon, seed, value, **fields)
            for epsilon, values in accuracies.items() for seed, value in enumerate(values)]


def find(checks: list[ClaimCheck], start: str) -> ClaimCheck:
    chosen = [c for c in checks if c.claim.startswith(start)]
    assert len(chosen) == 1, [c.claim for c in checks]
    return chosen[0]


def claims(module, runs: list[RunResult], dim: int = 1000) -> list[ClaimCheck]:
    study = module.study(quick=True, dataset="digits", data_root=None)
    study.proxy.update({"dim": dim, "clients": 100, "client_rate": 1.0})
    return study.claims(StudyResults(runs))


# ---------------------------------------------------------------- compare: "at every ε", ties, missing runs

#: Gaussian 1 point above Laplace at ε = 2 and 4, 1.83 below at ε = 8 (64.35 vs 66.18 %): pooled over
#: the six pairs the mean is +0.06 pt, but at ε = 8 the claimed order is reversed
GAUSSIAN = {2.0: [0.60, 0.62], 4.0: [0.63, 0.64], 8.0: [0.6400, 0.6470]}
LAPLACE = {2.0: [0.59, 0.61], 4.0: [0.62, 0.63], 8.0: [0.6600, 0.6636]}


def test_at_every_epsilon_fails_where_one_epsilon_is_reversed():
    check = find(claims(udp_fl, grid("gaussian", GAUSSIAN) + grid("laplace", LAPLACE)), "Gaussian ≥ Laplace at every ε")
    assert check.holds is False
    assert "against the claim at ε=8" in check.detail
    # each ε with its difference, interval and pairs; the two-seed interval is called wide
    assert "ε=2: 61.00 vs 60.00 %, +1.00 pt (95 % interval" in check.detail
    assert "ε=8: 64.35 vs 66.18 %, -1.83 pt (95 % interval" in check.detail
    assert "the claimed way in 0 of 2 pairs" in check.detail and "t = 12.7 with 2 pairs: wide" in check.detail


def test_at_every_epsilon_holds_where_every_epsilon_goes_the_claimed_way():
    laplace = {**LAPLACE, 8.0: [0.6300, 0.6470]}  # a tie in one pair and Gaussian ahead in the other
    check = find(claims(udp_fl, grid("gaussian", GAUSSIAN) + grid("laplace", laplace)), "Gaussian ≥ Laplace at every ε")
    assert check.holds is True and "holds at ε=2, ε=4, ε=8" in check.detail


def test_a_tie_satisfies_at_least_but_not_better_than():
    tie = compare(StudyResults(grid("a", {1.0: [0.80, 0.70]}) + grid("b", {1.0: [0.79, 0.71]})), "a", "b", [1.0])
    assert tie.holds is True and "within seed noise" in tie.detail  # ≥: a tie on average holds
    assert compare(StudyResults(grid("a", {1.0: [0.80, 0.70]}) + grid("b", {1.0: [0.79, 0.71]})), "a", "b", [1.0],
                   strict=True).holds is False
    staircase = {8.0: [0.70, 0.72]}
    for gaussian, expected in (([0.70, 0.72], False), ([0.69, 0.71], True)):  # tied: not "Staircase > Gaussian"
        runs = grid("staircase", staircase) + grid("gaussian", {8.0: gaussian})
        assert find(claims(udp_fl, runs), "Staircase > Gaussian at the largest ε").holds is expected


def test_missing_or_diverged_runs_leave_a_claim_undecided_never_holding():
    laplace = {2.0: LAPLACE[2.0], 8.0: [0.50, 0.50]}  # no Laplace run at ε = 4
    gaussian = {2.0: GAUSSIAN[2.0], 4.0: GAUSSIAN[4.0], 8.0: [0.60, 0.60]}
    check = find(claims(udp_fl, grid("gaussian", gaussian) + grid("laplace", laplace)), "Gaussian ≥ Laplace at every ε")
    assert check.holds is None and "ε=4: no complete pair" in check.detail
    one_seed = compare(StudyResults(grid("a", {1.0: [0.9]}) + grid("b", {1.0: [0.1]})), "a", "b", [1.0])
    assert one_seed.holds is None and "one pair, no interval" in one_seed.detail
    diverged = compare(StudyResults(grid("a", {1.0: [0.9, math.nan, 0.9]}) + grid("b", {1.0: [0.1, 0.1, 0.1]})), "a", "b", [1.0])
    assert diverged.holds is True and "1 seed(s) missing" in diverged.detail  # the two complete pairs decide
    assert compare(StudyResults(grid("a", {1.0: [0.9, 0.9]})), "a", "nothing", [1.0]).holds is None
    # a reversal at an ε with enough pairs is decided even where another ε lacks runs
    against = compare(StudyResults(grid("a", {1.0: [0.1, 0.1], 2.0: [0.9]}) + grid("b", {1.0: [0.5, 0.5], 2.0: [0.1]})),
                      "a", "b", [1.0, 2.0])
    assert against.holds is False


def test_epsilon_none_never_pools_runs_of_several_targets():
    runs = grid("a", {2.0: [0.9, 0.9], 8.0: [0.1, 0.1]}) + grid("b", {None: [0.5, 0.5]})
    assert compare(StudyResults(runs), "a", "b", [None]).holds is None  # two runs per seed: which ε?
    assert compare(StudyResults(runs), "a", "b", [2.0]).holds is True
    assert compare(StudyResults(runs), "a", "b", [8.0]).holds is False


def test_render_marks_undecided_apart_from_not_evaluated():
    study = ldp_fl.study(quick=True, dataset="digits", data_root=None)
    checks = [ClaimCheck("decided", True, "holds: x"), ClaimCheck("short", None, "undecided: y"),
              ClaimCheck("skipped", None, "not evaluated by this reproduction", evaluated=False)]
    text = render(study, StudyResults([]), checks, 1.0, "synthetic")
    assert "**HOLDS** — decided" in text and "**UNDECIDED** — short" in text and "**NOT EVALUATED** — skipped" in text


# ---------------------------------------------------------------- blur-lus (Cheng et al. 2022, Table 1, Fig. 2, Table 3)

def test_blur_lus_gain_must_be_positive_and_largest_at_the_smallest_epsilon():
    fedavg = {2.0: [0.70, 0.72], 8.0: [0.75, 0.77]}

    def gain(low: list[float], high: list[float]) -> ClaimCheck:
        ours = {2.0: [b + g for b, g in zip(fedavg[2.0], low)], 8.0: [b + g for b, g in zip(fedavg[8.0], high)]}
        return find(claims(blur_lus, grid("blur-lus", ours) + grid("dp-fedavg", fedavg)), "the gain over DP-FedAvg")

    # gains −0.12 and −0.25 pt: "largest" at ε = 2, but no gain at all
    check = gain([-0.0010, -0.0014], [-0.0024, -0.0026])
    assert check.holds is False and "gain at ε=2: -0.12 pt" in check.detail
    assert gain([0.0483, 0.0483], [0.0273, 0.0273]).holds is True  # the paper's +4.83 and +2.73 pt
    assert gain([0.0273, 0.0273], [0.0483, 0.0483]).holds is False  # a gain, but largest at ε = 8
    assert gain([0.02, 0.02], [0.02, 0.02]).holds is False  # equal gains: not largest at ε = 2


def test_blur_lus_close_is_judged_at_every_epsilon():
    fedavg = {2.0: [0.70, 0.72], 8.0: [0.75, 0.77]}

    def close(ddgauss: dict[float, list[float]]) -> bool | None:
        return find(claims(blur_lus, grid("ddgauss", ddgauss) + grid("dp-fedavg", fedavg)), "DDGauss ≈ DP-FedAvg").holds

    # −2 pt at ε = 2, +1.6 pt at ε = 8: within 1 pt pooled (−0.2), not at either ε
    assert close({2.0: [0.68, 0.70], 8.0: [0.766, 0.786]}) is False
    assert close({2.0: [0.695, 0.715], 8.0: [0.755, 0.775]}) is True


def test_blur_lus_lower_norms_at_every_epsilon():
    def lower(blur: dict[float, list[float]]) -> bool | None:
        runs = grid("dp-fedavg", {2.0: [0.5, 0.5], 8.0: [0.5, 0.5]}, norm=1.0)
        runs += [run("blur", e, s, 0.5, norm=n) for e, norms in blur.items() for s, n in enumerate(norms)]
        return find(claims(blur_lus, runs), "BLUR lowers the pre-clip update norms").holds

    assert lower({2.0: [0.2, 0.2], 8.0: [1.1, 1.1]}) is False  # lower on average over ε, higher at ε = 8
    assert lower({2.0: [1.0, 1.0], 8.0: [0.2, 0.2]}) is False  # equal at ε = 2 is not lower
    assert lower({2.0: [0.8, 0.9], 8.0: [0.7, 0.9]}) is True


def test_blur_lus_accuracy_claims_at_every_epsilon():
    fedavg = {2.0: [0.70, 0.72], 8.0: [0.75, 0.77]}
    above_on_average = {2.0: [0.78, 0.80], 8.0: [0.74, 0.76]}  # +8 pt at ε = 2, −1 pt at ε = 8
    assert find(claims(blur_lus, grid("blur-lus", above_on_average) + grid("dp-fedavg", fedavg)),
                "BLUR+LUS ≥ DP-FedAvg at equal ε").holds is False
    above = {2.0: [0.78, 0.80], 8.0: [0.76, 0.77]}
    assert find(claims(blur_lus, grid("blur-lus", above) + grid("dp-fedavg", fedavg)),
                "BLUR+LUS ≥ DP-FedAvg at equal ε").holds is True


# ---------------------------------------------------------------- udp-fl (Feng et al. 2024, Table 4)

def test_udp_fl_accuracy_grows_at_every_step():
    def grows(kind: str, accuracies: list[float]) -> bool | None:
        runs = grid(kind, {e: [a, a + 0.01] for e, a in zip((2.0, 4.0, 8.0), accuracies)})
        return find(claims(udp_fl, runs), f"{kind}: accuracy grows").holds

    assert grows("gaussian", [0.60, 0.65, 0.63]) is False  # higher at ε = 8 than at 2, but it falls from 4 to 8
    assert grows("gaussian", [0.60, 0.62, 0.65]) is True
    assert grows("staircase", [0.60, 0.60, 0.65]) is False  # flat from 2 to 4 is not growth
    # Table 4's own Laplace column dips at the second ε: the claim is only "higher at the largest ε"
    assert grows("laplace", [0.60, 0.58, 0.65]) is True
    assert grows("laplace", [0.60, 0.70, 0.59]) is False


def test_udp_fl_below_fedavg_at_every_epsilon():
    fedavg = grid("fedavg", {None: [0.80, 0.82]})
    above_at_4 = grid("laplace", {2.0: [0.60, 0.61], 4.0: [0.83, 0.84], 8.0: [0.70, 0.71]})
    assert find(claims(udp_fl, fedavg + above_at_4), "laplace stays below").holds is False
    below = grid("laplace", {2.0: [0.60, 0.61], 4.0: [0.65, 0.66], 8.0: [0.70, 0.71]})
    assert find(claims(udp_fl, fedavg + below), "laplace stays below").holds is True
    assert find(claims(udp_fl, below), "laplace stays below").holds is None  # no FedAvg runs: not judged


def test_udp_fl_paper_epsilon_is_a_sound_bound():
    def sound(kind: str, figures: dict[float, float | None]) -> bool | None:
        runs = [run(kind, e, s, 0.5, alternatives={"paper_1d": e, "sound": v}) for e, v in figures.items() for s in (0, 1)]
        return find(claims(udp_fl, runs), f"{kind}: the paper's ε is a valid bound").holds

    assert sound("laplace", {2.0: 2.09, 4.0: 5.12, 8.0: 17.2}) is False
    assert sound("laplace", {2.0: 1.9, 4.0: 3.5, 8.0: 7.0}) is True
    assert sound("staircase", {2.0: None, 4.0: None, 8.0: None}) is False  # no finite bound at all
    assert sound("staircase", {2.0: 1.0, 4.0: 2.0, 8.0: 8.5}) is False  # fails at the largest only
    unknown = [run("laplace", 2.0, 0, 0.5, alternatives={"paper_1d": 2.0})]
    assert find(claims(udp_fl, unknown), "laplace: the paper's ε is a valid bound").holds is None


# ---------------------------------------------------------------- dp-fedsam (Shi et al. 2023, Tables I, II, IV, Figs. 3–4)

def test_dp_fedsam_better_at_each_epsilon_level():
    def at_levels(arm: str, accuracies: list[float], seed: int) -> RunResult:
        return run(arm, None, seed, accuracies[-1],
                   by_round={t + 1: (e, a) for t, (e, a) in enumerate(zip((4.0, 6.0, 8.0), accuracies))})

    fedavg = [at_levels("dp-fedavg", [0.60, 0.70, 0.75], s) for s in (0, 1)]
    behind_at_4 = [at_levels("dp-fedsam", [0.58, 0.78, 0.80], s) for s in (0, 1)]  # ahead on average over the levels
    assert find(claims(dp_fedsam, fedavg + behind_at_4), "DP-FedSAM > DP-FedAvg at ε = 4, 6, 8").holds is False
    ahead = [at_levels("dp-fedsam", [0.61, 0.71, 0.76], s) for s in (0, 1)]
    check = find(claims(dp_fedsam, fedavg + ahead), "DP-FedSAM > DP-FedAvg at ε = 4, 6, 8")
    assert check.holds is True and "ε=4" in check.detail and "ε=8" in check.detail


def test_dp_fedsam_best_round_and_flatness():
    fedavg = grid("dp-fedavg", {None: [0.80, 0.82]}, sharpness=0.2)
    assert find(claims(dp_fedsam, fedavg + grid("dp-fedsam", {None: [0.80, 0.82]})),
                "DP-FedSAM > DP-FedAvg (Table I").holds is False
    assert find(claims(dp_fedsam, fedavg + grid("dp-fedsam", {None: [0.81, 0.83]})),
                "DP-FedSAM > DP-FedAvg (Table I").holds is True
    flat, sharp = grid("dp-fedsam", {None: [0.8, 0.8]}, sharpness=0.1), grid("dp-fedsam", {None: [0.8, 0.8]}, sharpness=0.3)
    assert find(claims(dp_fedsam, fedavg + flat), "DP-FedSAM's global model is flatter").holds is True
    assert find(claims(dp_fedsam, fedavg + sharp), "DP-FedSAM's global model is flatter").holds is False
    unmeasured = grid("dp-fedsam", {None: [0.8, 0.8]})
    assert find(claims(dp_fedsam, fedavg + unmeasured), "DP-FedSAM's global model is flatter").holds is None


def test_dp_fedsam_smaller_train_test_gap():
    fedavg = grid("dp-fedavg", {None: [0.80, 0.82]}, train=0.95)  # gaps 15 and 13 pt
    narrower = grid("dp-fedsam", {None: [0.82, 0.84]}, train=0.90)  # 8 and 6 pt
    wider = grid("dp-fedsam", {None: [0.78, 0.80]}, train=0.96)  # 18 and 16 pt
    assert find(claims(dp_fedsam, fedavg + narrower), "DP-FedSAM has a smaller train−test gap").holds is True
    assert find(claims(dp_fedsam, fedavg + wider), "DP-FedSAM has a smaller train−test gap").holds is False
    unknown = grid("dp-fedsam", {None: [0.82, 0.84]}, train=math.nan)
    assert find(claims(dp_fedsam, fedavg + unknown), "DP-FedSAM has a smaller train−test gap").holds is None


# ---------------------------------------------------------------- fl-top (Kerkouche et al. 2021, Table 1)

def test_fl_top_close_to_fl_std():
    std = grid("fl-std", {None: [0.85, 0.86]})

    def close(top: list[float], with_std: bool = True) -> bool | None:
        runs = grid("fl-top-5", {None: top}) + (std if with_std else [])
        return find(claims(fl_top, runs), "FL-TOP at r = 5 % is close to FL-STD").holds

    assert close([0.82, 0.83]) is False  # 3 pt below
    assert close([0.84, 0.85]) is True  # 1 pt below
    assert close([0.87, 0.88]) is True  # above FL-STD: no loss
    assert close([0.84, 0.85], with_std=False) is None  # no FL-STD runs: not judged


def test_fl_top_beats_is_strict_and_figure_1_is_not_evaluated():
    basic = grid("fl-basic-dp-5", {1.0: [0.70, 0.72]})
    checks = claims(fl_top, basic + grid("fl-top-dp-0.5", {1.0: [0.70, 0.72]}))
    assert find(checks, "FL-TOP-DP at r = 0.5 % beats FL-BASIC-DP").holds is False  # a tie does not beat
    assert find(claims(fl_top, basic + grid("fl-top-dp-0.5", {1.0: [0.71, 0.73]})), "FL-TOP-DP at r = 0.5 % beats").holds is True
    figure = find(checks, "Fig. 1")
    assert figure.holds is None and figure.evaluated is False
    assert find(checks, "Table 1's bandwidth cells").holds is True


# ---------------------------------------------------------------- ldp-fl (Sun, Qian, Chen 2021, Table 1)

NOISE_FREE = {None: [0.97, 0.97]}
LDP = {0.1: [0.12, 0.14], 0.5: [0.95, 0.955], 1.0: [0.96, 0.96], 5.0: [0.962, 0.964], 10.0: [0.963, 0.965]}


def test_ldp_fl_close_to_noise_free_at_every_epsilon():
    assert find(claims(ldp_fl, grid("noise-free", NOISE_FREE) + grid("ldp-fl", LDP)),
                "accuracy at most 2 points below").holds is True
    far = {**LDP, 0.5: [0.93, 0.94]}  # 3.5 pt below at ε = 0.5 only
    assert find(claims(ldp_fl, grid("noise-free", NOISE_FREE) + grid("ldp-fl", far)),
                "accuracy at most 2 points below").holds is False
    assert find(claims(ldp_fl, grid("ldp-fl", LDP)), "accuracy at most 2 points below").holds is None


def test_ldp_fl_collapse_at_the_smallest_epsilon():
    assert find(claims(ldp_fl, grid("ldp-fl", LDP)), "ε = 0.1 collapses").holds is True
    assert find(claims(ldp_fl, grid("ldp-fl", {**LDP, 0.1: [0.35, 0.40]})), "ε = 0.1 collapses").holds is False
    assert find(claims(ldp_fl, grid("ldp-fl", {e: v for e, v in LDP.items() if e != 0.1})), "ε = 0.1 collapses").holds is None


def test_ldp_fl_does_not_decrease_at_any_step():
    assert find(claims(ldp_fl, grid("ldp-fl", LDP)), "accuracy does not decrease").holds is True
    dip = {**LDP, 10.0: [0.959, 0.961]}  # 0.3 pt below ε = 5 on average
    check = find(claims(ldp_fl, grid("ldp-fl", dip)), "accuracy does not decrease")
    assert check.holds is False and "ε=10 vs ε=5" in check.detail
    assert find(claims(ldp_fl, grid("ldp-fl", {**LDP, 10.0: LDP[5.0]})), "accuracy does not decrease").holds is True  # flat


@pytest.mark.parametrize("module", [blur_lus, dp_fedsam, udp_fl, fl_top, ldp_fl])
def test_no_runs_never_hold(module):
    """With no runs at all, every claim about runs is undecided: only the arithmetic and analytical
    ones (bandwidth formula, accounting bounds) can be decided."""
    for check in claims(module, []):
        assert check.holds is not True or check.claim.startswith("Table 1's bandwidth"), check
        if check.holds is False:
            assert "d·ε" in check.detail or "Feldman" in check.detail, check
