"""Family-wise error control: Holm's step-down procedure (Holm 1979, "A simple sequentially
rejective multiple test procedure", Scand. J. Statist. 6(2)).

k hypotheses with p-values p₍₁₎ ≤ … ≤ p₍ₖ₎: p₍ᵢ₎ is compared with α/(k − i + 1), and rejection
stops at the first that exceeds its level. The weighted procedure (:func:`weighted_holm`, Holm
1979 §5) orders the hypotheses by p/w and compares each with α·w/(the weight not yet rejected):
with fixed weights — chosen before the data are seen — it controls the family-wise error as the
plain one does, and spends α where the tests can detect something. The probability of rejecting any true hypothesis is at
most α, whatever the dependence between the tests — which is why both the soundness verdicts of
an experiment (correlated ε figures of one set of runs) and the regressions of one ``check``
(correlated metrics of one pair of audits) use it.

statsmodels' ``multipletests(p, alpha, method="holm")`` makes the same decisions (checked on
2,000 random families with ties, statsmodels 0.15.0; ``test_holm_rejects_what_the_adjusted_p_values_reject``
checks them against Holm's adjusted p-values). It is not used: it does not return the level each
hypothesis was compared with, which ``check`` turns into its thresholds, it has no weighted
procedure, and importing it (pandas included, ≈ 1.8 s) would weigh on the light ``check`` command.
"""

from __future__ import annotations

from collections.abc import Sequence


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[tuple[bool, float]]:
    """For each p-value, in input order: whether Holm's procedure at family-wise level ``alpha``
    rejects it, and the level it was compared with."""
    k = len(p_values)
    out: list[tuple[bool, float]] = [(False, alpha)] * k
    rejecting = True
    for rank, i in enumerate(sorted(range(k), key=lambda j: p_values[j])):
        level = alpha / (k - rank)
        rejecting = rejecting and p_values[i] <= level
        out[i] = (rejecting, level)
    return out


def weighted_holm(p_values: Sequence[float], weights: Sequence[float], alpha: float = 0.05) -> list[tuple[bool, float]]:
    """Holm's weighted step-down procedure (Holm 1979, §5): hypotheses in order of p/w (ties by
    input position), the j-th compared with α·w₍ⱼ₎ / Σ_{i ≥ j} w₍ᵢ₎; rejection stops at the first
    that exceeds its level. Returns, in input order, whether each is rejected and its level. Equal
    weights give :func:`holm` exactly. The weights must not depend on the data (only then is the
    family-wise error at most α)."""
    k = len(p_values)
    if len(weights) != k or any(not w > 0 for w in weights):
        raise ValueError("weights must be positive, one per p-value")
    if len(set(weights)) <= 1:
        return holm(p_values, alpha)
    order = sorted(range(k), key=lambda j: (p_values[j] / weights[j], j))
    remaining = float(sum(weights))
    out: list[tuple[bool, float]] = [(False, alpha)] * k
    rejecting = True
    for i in order:
        level = alpha * weights[i] / remaining
        rejecting = rejecting and p_values[i] <= level
        out[i] = (rejecting, level)
        remaining -= weights[i]
    return out
