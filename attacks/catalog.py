"""Importing this module registers every attack in :data:`attacks.base.ATTACKS`."""

from attacks import (  # noqa: F401  (each module registers its attacks)
    attribute_inference,
    canary_queries,
    dirac_canaries,
    gradient_inversion,
    lira,
    model_inversion,
    property_inference,
    record_canaries,
    rmia,
    shokri,
    threshold,
    update_canaries,
)
from attacks.base import ATTACKS

__all__ = ["ATTACKS"]
