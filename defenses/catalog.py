"""Importing this module registers every defense in :data:`defenses.base.DEFENSES`."""

from defenses import (  # noqa: F401  (each module registers its defenses)
    ae_dpfl,  # ae-dpfl
    blur_lus,  # dp-fedavg-blur, dp-fedavg-lus, dp-fedavg-blur-lus
    ddgauss,  # ddgauss
    dp_fedsam,  # fedsam, dp-fedsam, dp-fedsam-topk
    fed_smp,  # fed-smp-randk, fed-smp-topk
    fedavg,  # fedavg, dp-fedavg
    fl_basic,  # fl-basic, fl-basic-dp
    fl_cs,  # fl-cs, fl-cs-dp
    fl_std,  # fl-std, fl-std-dp
    fl_top,  # fl-top, fl-top-dp
    ldp_fl,  # ldp-fl
    nbafl,  # nbafl
    udp_fl,  # udp-fl
)
from defenses.base import DEFENSES

__all__ = ["DEFENSES"]
