"""Family-wise error control: Holm's step-down procedure (Holm 1979, "A simple sequentially
rejective multiple test procedure", Scand. J. Statist. 6(2)).

k hypotheses with p-values p₍₁₎ ≤ … ≤ p₍ₖ₎: p₍ᵢ₎ is compared with α/(k − i + 1), and rejection
stops at the first that exceeds its level. The probability of rejecting any true hypothesis is at
most α, whatever the dependence between the tests — which is why both the soundness verdicts of
an experiment (correlated ε figures of one set of runs) and the regressions of one ``check``
(correlated metrics of one pair of audits) use it.
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
