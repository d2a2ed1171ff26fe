"""FL-STD(-DP), the full-model baseline of Kerkouche, Ács, Castelluccia, Genevès, "Constrained
Differentially Private Federated Learning for Low-bandwidth Devices" (UAI 2021), on the
frame of ``subset_training.py``.

FedAvg with uniform averaging and the full model each way (r = 1). FL-STD-DP is FL-TOP-DP
(Alg. 3: clip to S, noise N(0, (Sσ)²/|𝕂|) per client under secure aggregation) with 𝕋 = every
coordinate; S is the norm of one server-side round on the public batch (§4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from defenses.base import DEFENSES
from defenses.subset_training import SubsetFL


@dataclass(frozen=True)
class FLStdParams:
    public_size: int = field(default=10, metadata={"min": 1, "help": "public batch for the clip calibration"})
    keep_fraction: float = field(default=1.0, metadata={"min": 1.0, "max": 1.0, "help": "always 1: the full model"})


@dataclass(frozen=True)
class FLStdDPParams(FLStdParams):
    clip: float = field(default=0.0, metadata={"min": 0.0, "help": "S (0: calibrate on the public batch)"})
    noise_multiplier: float = field(default=1.5406, metadata={"min": 0.0, "min_exclusive": True, "help": "σ"})


class _Std(SubsetFL):
    downstream_full = True  # every coordinate trains; S from the public round with all of them (the frame's default)


@DEFENSES.register
class FLStd(_Std):
    name = "fl-std"
    summary = "Standard FedAvg with uniform averaging, the full model each way (the paper's reference)"
    reference = "Kerkouche et al. 2021 (FL-STD baseline)"
    Params = FLStdParams


@DEFENSES.register("fl-std-dp")
class FLStdDP(_Std):
    name = "fl-std-dp"
    summary = "FL-STD with clipping and client noise under secure aggregation (S calibrated on public data)"
    reference = "Kerkouche et al. 2021 (FL-STD-DP baseline)"
    Params = FLStdDPParams
    private = True
