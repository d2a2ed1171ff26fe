"""Per-scalar ε-LDP mechanisms for model weights (LDP-FL, Sun et al. 2021: Eq. 2, Alg. 2;
Laplace and Duchi are our alternatives).

* **Two-point** (Sun et al. 2021, Eq. 2; an affine generalisation of Duchi et al. 2018): for w
  clipped into [c − r, c + r] and A = (e^ε + 1)/(e^ε − 1),

      M(w) = c + r·A  with probability  p_up(w) = ½ + (w − c)/(2rA),   else  c − r·A.

  M is unbiased (E[M(w)] = w), its variance is r²A² − (w − c)², and the probability ratio of any
  output under two inputs is at most e^ε (Thm 1): ε-LDP per scalar.
* **Laplace**: w + Lap(2r/ε) (sensitivity 2r over the range), ε-LDP per scalar.
* **Duchi**: the two-point mechanism on [−1, 1] (c = 0, r = 1).

Computed in float64 from a torch.Generator; callers cast back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

LDP_MECHANISMS = ("two_point", "laplace", "duchi")


def two_point_magnitude(epsilon: float) -> float:
    """A(ε) = (e^ε + 1)/(e^ε − 1) = coth(ε/2)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon}")
    return 1.0 / math.tanh(epsilon / 2.0)


def probability_up(w: torch.Tensor, center: torch.Tensor | float, radius: torch.Tensor | float, epsilon: float) -> torch.Tensor:
    """p_up(w) = ½ + (w − c)/(2rA), for w already inside [c − r, c + r]."""
    return 0.5 + (w - center) / (2 * radius * two_point_magnitude(epsilon))


def two_point(w: torch.Tensor, center: torch.Tensor | float, radius: torch.Tensor | float, epsilon: float,
              generator: torch.Generator) -> torch.Tensor:
    """Clip into [c − r, c + r], then report c ± r·A with p_up; one independent draw per scalar."""
    w = w.to(torch.float64)
    center = torch.as_tensor(center, dtype=torch.float64, device=w.device)
    radius = torch.as_tensor(radius, dtype=torch.float64, device=w.device)
    if bool((radius <= 0).any()):
        raise ValueError("radius must be > 0")
    clipped = torch.minimum(torch.maximum(w, center - radius), center + radius)
    magnitude = two_point_magnitude(epsilon)
    up = torch.rand(w.shape, generator=generator, dtype=torch.float64, device=generator.device).to(w.device)
    return torch.where(up < probability_up(clipped, center, radius, epsilon), center + radius * magnitude,
                       center - radius * magnitude)


def laplace(w: torch.Tensor, center, radius, epsilon: float, generator: torch.Generator) -> torch.Tensor:
    """Clip into [c − r, c + r], then add Laplace noise of scale 2r/ε (ε-LDP per scalar)."""
    w = w.to(torch.float64)
    center = torch.as_tensor(center, dtype=torch.float64, device=w.device)
    radius = torch.as_tensor(radius, dtype=torch.float64, device=w.device)
    clipped = torch.minimum(torch.maximum(w, center - radius), center + radius)
    uniform = torch.rand((2, *w.shape), generator=generator, dtype=torch.float64, device=generator.device).to(w.device)
    return clipped + (2 * radius / epsilon) * (torch.log1p(-uniform[0]) - torch.log1p(-uniform[1]))


def perturb(kind: str, w: torch.Tensor, center, radius, epsilon: float, generator: torch.Generator) -> torch.Tensor:
    if kind == "two_point":
        return two_point(w, center, radius, epsilon, generator)
    if kind == "duchi":
        return two_point(w, 0.0, 1.0, epsilon, generator)
    if kind == "laplace":
        return laplace(w, center, radius, epsilon, generator)
    raise ValueError(f"mechanism must be one of {', '.join(LDP_MECHANISMS)}, got {kind}")


def shuffle_amplification(epsilon0: float, reports: int, delta: float) -> float | None:
    """Feldman, McMillan, Talwar 2021 (Thm 3.1): k ε0-LDP reports shuffled are (ε_c, δ)-DP with
    ε_c = ln(1 + (e^ε0 − 1)/(e^ε0 + 1)·(8√(e^ε0 ln(4/δ)/k) + 8e^ε0/k)), valid when
    ε0 ≤ ln(k/(16 ln(4/δ))); ``None`` when the bound does not apply."""
    if reports < 1 or epsilon0 > math.log(reports / (16 * math.log(4 / delta))):
        return None
    e0 = math.exp(epsilon0)
    return math.log1p((e0 - 1) / (e0 + 1) * (8 * math.sqrt(e0 * math.log(4 / delta) / reports) + 8 * e0 / reports))
