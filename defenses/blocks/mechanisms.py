"""Additive noise mechanisms for one coordinate — Gaussian, Laplace, Staircase — with their
densities, exact samplers, moments and Rényi-DP curves (UDP-FL, Feng et al. 2024, §4.1, Table 3).

Every mechanism adds i.i.d. noise to each coordinate of a query of sensitivity Δ (``scale``).
Its parameter: the Gaussian's noise multiplier z (std zΔ), the Laplace scale ratio λ (scale
λΔ), the Staircase's ε (Geng & Viswanath 2015, "The Optimal Noise-Adding Mechanism in
Differential Privacy"; γ = γ* = 1/(1 + e^{ε/2}) by default).

Rényi DP, two readings:

* :meth:`Mechanism.rdp_1d` — the one-dimensional curve D_α(f ‖ f(· − Δ)) that UDP-FL applies to
  noise on every coordinate of an ℓ2-clipped d-dimensional gradient (``accounting: paper_1d``);
* :meth:`Mechanism.sound_rdp` — a bound that holds for every d (``accounting: sound``). It is the
  same curve for the Gaussian under ℓ2 clipping; α/(2λ²) for the Laplace under ℓ2 clipping (each
  coordinate is pure (|v_i|/b)-DP, hence (|v_i|/b)²/2-zCDP, Bun & Steinke 2016, and these add up to
  α‖v‖²/(2b²)); the 1-D curve for the Laplace under ℓ1 clipping (its RDP is convex in the shift, so
  one concentrated coordinate is the worst case); C·sup_t D_α(t)/t for the Staircase under ℓ1
  clipping; and no finite bound for the Staircase under ℓ2 clipping, whose discontinuous density
  makes D_α(t) grow linearly in a small shift t, so spreading a shift over d coordinates grows
  the divergence like √d.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    from scipy import special
else:  # imported when first used (audit.core.lazy_modules): registering a defense loads no scipy
    torch = lazy_module("torch")
    special = lazy_module("scipy.special")

CLIP_NORMS = ("l2", "l1")


def _orders(orders) -> np.ndarray:
    orders = np.asarray(orders, dtype=np.float64)
    if np.any(orders <= 1):
        raise ValueError("RDP orders must be > 1")
    return orders


class Mechanism(ABC):
    """Noise for one coordinate of a query with sensitivity ``scale`` (Δ)."""

    kind: ClassVar[str] = ""
    parameter_name: ClassVar[str] = ""
    #: True when a larger parameter means more noise (z, λ); False for the Staircase's ε
    larger_is_noisier: ClassVar[bool] = True

    def __init__(self, parameter: float):
        if not (parameter > 0 and math.isfinite(parameter)):
            raise ValueError(f"{self.parameter_name} must be a finite number > 0, got {parameter}")
        self.parameter = float(parameter)

    def with_parameter(self, parameter: float) -> Mechanism:
        return type(self)(parameter)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.parameter_name}={self.parameter:.6g})"

    @abstractmethod
    def log_density(self, x: np.ndarray, scale: float = 1.0) -> np.ndarray: ...

    def density(self, x: np.ndarray, scale: float = 1.0) -> np.ndarray:
        return np.exp(self.log_density(np.asarray(x, dtype=np.float64), scale))

    @abstractmethod
    def sample(self, generator: torch.Generator, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
        """float64 samples drawn on the generator's device."""

    @abstractmethod
    def variance(self, scale: float = 1.0) -> float: ...

    @abstractmethod
    def mean_abs(self, scale: float = 1.0) -> float: ...

    @abstractmethod
    def rdp_1d(self, orders) -> np.ndarray:
        """D_α between the noise and the noise shifted by one sensitivity, at each order (float64)."""

    @abstractmethod
    def sound_rdp(self, orders, clip_norm: str = "l2") -> np.ndarray:
        """An RDP bound valid in every dimension for shifts with ‖v‖ ≤ Δ in ``clip_norm`` (inf: none)."""


class GaussianNoise(Mechanism):
    kind = "gaussian"
    parameter_name = "z"

    def log_density(self, x, scale=1.0):
        sigma = self.parameter * scale
        return -np.asarray(x, dtype=np.float64) ** 2 / (2 * sigma ** 2) - math.log(sigma * math.sqrt(2 * math.pi))

    def sample(self, generator, shape, scale=1.0):
        return torch.randn(shape, generator=generator, dtype=torch.float64, device=generator.device) * (self.parameter * scale)

    def variance(self, scale=1.0):
        return (self.parameter * scale) ** 2

    def mean_abs(self, scale=1.0):
        return self.parameter * scale * math.sqrt(2 / math.pi)

    def rdp_1d(self, orders):
        return _orders(orders) / (2 * self.parameter ** 2)

    def sound_rdp(self, orders, clip_norm="l2"):
        return self.rdp_1d(orders)  # ℓ1 ≤ C implies ℓ2 ≤ C: the ℓ2 bound holds


class LaplaceNoise(Mechanism):
    kind = "laplace"
    parameter_name = "lambda"

    def log_density(self, x, scale=1.0):
        b = self.parameter * scale
        return -np.abs(np.asarray(x, dtype=np.float64)) / b - math.log(2 * b)

    def sample(self, generator, shape, scale=1.0):
        b = self.parameter * scale
        uniform = torch.rand((2, *shape), generator=generator, dtype=torch.float64, device=generator.device)
        exponential = -torch.log1p(-uniform)  # Exp(1); 1 − U ∈ (0, 1]
        return b * (exponential[0] - exponential[1])

    def variance(self, scale=1.0):
        return 2 * (self.parameter * scale) ** 2

    def mean_abs(self, scale=1.0):
        return self.parameter * scale

    def rdp_1d(self, orders):
        """Mironov 2017, Prop. 6: (1/(α−1))·log[α/(2α−1)·e^{(α−1)/λ} + (α−1)/(2α−1)·e^{−α/λ}]."""
        orders = _orders(orders)
        inv = 1.0 / self.parameter
        terms = np.stack([np.log(orders / (2 * orders - 1)) + (orders - 1) * inv,
                          np.log((orders - 1) / (2 * orders - 1)) - orders * inv])
        return special.logsumexp(terms, axis=0) / (orders - 1)

    def sound_rdp(self, orders, clip_norm="l2"):
        if clip_norm == "l1":
            return self.rdp_1d(orders)
        return _orders(orders) / (2 * self.parameter ** 2)


class StaircaseNoise(Mechanism):
    """Geng–Viswanath staircase density with shift Δ: f(x) = a·b^k on |x| ∈ [kΔ, (k+γ)Δ) and a·b^{k+1}
    on [(k+γ)Δ, (k+1)Δ), b = e^{−ε}, a = (1 − b)/(2Δ(γ + (1 − γ)b))."""

    kind = "staircase"
    parameter_name = "epsilon"
    larger_is_noisier = False

    def __init__(self, parameter: float, gamma: float | None = None):
        super().__init__(parameter)
        self.gamma = self.optimal_gamma(parameter) if gamma is None else float(gamma)
        if not 0 < self.gamma <= 0.5:
            raise ValueError(f"gamma must lie in (0, 1/2], got {self.gamma}")

    def with_parameter(self, parameter: float) -> StaircaseNoise:
        return StaircaseNoise(parameter)

    @staticmethod
    def optimal_gamma(epsilon: float) -> float:
        """γ* = 1/(1 + e^{ε/2}), Geng & Viswanath's ℓ1-optimal choice."""
        return 1.0 / (1.0 + math.exp(epsilon / 2))

    @property
    def b(self) -> float:
        return math.exp(-self.parameter)

    def height(self, scale: float = 1.0) -> float:
        """a: the density on [0, γΔ)."""
        b = self.b
        return (1 - b) / (2 * scale * (self.gamma + (1 - self.gamma) * b))

    def log_density(self, x, scale=1.0):
        magnitude = np.abs(np.asarray(x, dtype=np.float64)) / scale
        steps = np.floor(magnitude)
        outer = (magnitude - steps) >= self.gamma
        return math.log(self.height(scale)) + (steps + outer) * (-self.parameter)

    def sample(self, generator, shape, scale=1.0):
        """Geng's sampler: step G ~ Geometric(1 − b) on {0, 1, ...} — G = ⌊log(1−U)/log b⌋, so G ≥ 0
        (the public code's torch Geometric − 1 can give −1) — then the inner or outer part of the
        step, a uniform position within it, and a random sign."""
        uniform = torch.rand((4, *shape), generator=generator, dtype=torch.float64, device=generator.device)
        steps = torch.floor(torch.log1p(-uniform[0]) / math.log(self.b))
        inner_probability = self.gamma / (self.gamma + (1 - self.gamma) * self.b)
        outer = uniform[1] >= inner_probability
        offset = torch.where(outer, self.gamma + (1 - self.gamma) * uniform[2], self.gamma * uniform[2])
        sign = torch.where(uniform[3] < 0.5, -1.0, 1.0).to(torch.float64)
        return sign * scale * (steps + offset)

    def _moments(self) -> tuple[float, float, float, float]:
        b, gamma = self.b, self.gamma
        inner = gamma / (gamma + (1 - gamma) * b)
        outer = 1 - inner
        mean_g, mean_g2 = b / (1 - b), b * (1 + b) / (1 - b) ** 2
        mean_y = inner * gamma / 2 + outer * (1 + gamma) / 2
        mean_y2 = inner * gamma ** 2 / 3 + outer * (1 + gamma + gamma ** 2) / 3
        return mean_g, mean_g2, mean_y, mean_y2

    def variance(self, scale=1.0):
        mean_g, mean_g2, mean_y, mean_y2 = self._moments()
        return scale ** 2 * (mean_g2 + 2 * mean_g * mean_y + mean_y2)

    def mean_abs(self, scale=1.0):
        mean_g, _, mean_y, _ = self._moments()
        return scale * (mean_g + mean_y)

    def rdp_1d(self, orders):
        """Closed form (our derivation, checked numerically; γ ≤ ½): with shift Δ the likelihood ratio
        is e^{ε} for x < 0, e^{−ε} for x ≥ Δ, and e^{ε} / 1 / e^{−ε} on the three parts of [0, Δ), so
        I(α) = ½e^{−αε} + ½e^{(α−1)ε} + aΔ[γe^{(α−1)ε} + (1 − 2γ)e^{−ε} + γe^{−αε}], D_α = log I/(α−1)."""
        orders = _orders(orders)
        eps, gamma, a_delta = self.parameter, self.gamma, self.height(1.0)
        terms = np.stack([
            np.full_like(orders, math.log(0.5)) - orders * eps,
            math.log(0.5) + (orders - 1) * eps,
            math.log(a_delta * gamma) + (orders - 1) * eps,
            np.full_like(orders, math.log(a_delta * (1 - 2 * gamma)) - eps) if gamma < 0.5 else np.full_like(orders, -np.inf),
            math.log(a_delta * gamma) - orders * eps,
        ])
        return special.logsumexp(terms, axis=0) / (orders - 1)

    def small_shift_slope(self, orders) -> np.ndarray:
        """lim_{t→0} D_α(t)/t per unit of Δ. The density jumps only at ±(k + γ)Δ, so for a shift
        t ≤ min(γ, 1 − γ)Δ, D_α(t) = log(1 + (t/Δ)·Σ)/(α − 1) with
        Σ = aΔ/(1 − b)·(b^{1−α} − 1 + b^α − b); D_α(t)/t decreases in t, so this is its supremum."""
        orders = _orders(orders)
        b, a_delta = self.b, self.height(1.0)
        # b^{1−α} = e^{(α−1)ε} overflows to inf once (α−1)ε > 709 (ε = 20 at the largest default
        # orders): the slope at such an order is then inf, an upper bound never chosen by the
        # conversion's minimum over orders, so the overflow is expected and not worth a warning
        with np.errstate(over="ignore"):
            total = a_delta / (1 - b) * (np.exp((1 - orders) * math.log(b)) - 1 + np.exp(orders * math.log(b)) - b)
            return total / (orders - 1)

    def sound_rdp(self, orders, clip_norm="l2"):
        orders = _orders(orders)
        if clip_norm == "l2":
            return np.full_like(orders, np.inf)
        # ‖v‖₁ ≤ Δ: Σ_i D(|v_i|) ≤ Σ_i |v_i|·sup_t D(t)/t ≤ Δ·sup_t D(t)/t (with t in units of Δ)
        return np.maximum(self.small_shift_slope(orders), self.rdp_1d(orders))


MECHANISMS: dict[str, type[Mechanism]] = {m.kind: m for m in (GaussianNoise, LaplaceNoise, StaircaseNoise)}


def make_mechanism(kind: str, parameter: float) -> Mechanism:
    if kind not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {kind}")
    return MECHANISMS[kind](parameter)


def numeric_rdp(mechanism: Mechanism, order: float, shift: float = 1.0, scale: float = 1.0) -> float:
    """D_α(f ‖ f(· − shift)) by numerical integration, for checking the closed forms.

    Piecewise-constant densities (the Staircase) are integrated exactly between the breakpoints
    of both densities; smooth ones with adaptive quadrature.
    """
    from scipy import integrate

    if isinstance(mechanism, StaircaseNoise):
        span = int(math.ceil(order + 60.0 / mechanism.parameter)) + 2
        ks = np.arange(-span, span + 1, dtype=np.float64)
        base = np.concatenate([ks * scale, (ks + mechanism.gamma) * scale, -(ks + mechanism.gamma) * scale])
        points = np.unique(np.concatenate([base, base + shift]))
        mids, widths = (points[1:] + points[:-1]) / 2, np.diff(points)
        log_p, log_q = mechanism.log_density(mids, scale), mechanism.log_density(mids - shift, scale)
        return float(special.logsumexp(order * log_p + (1 - order) * log_q, b=widths) / (order - 1))

    def integrand(x: float) -> float:
        return float(np.exp(order * mechanism.log_density(np.array([x]), scale)[0]
                            + (1 - order) * mechanism.log_density(np.array([x - shift]), scale)[0]))

    spread = math.sqrt(mechanism.variance(scale))
    value, _ = integrate.quad(integrand, -60 * spread - abs(shift), 60 * spread + abs(shift), points=[0.0, shift], limit=500)
    return math.log(value) / (order - 1)
