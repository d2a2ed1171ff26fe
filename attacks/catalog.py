"""Importing this module registers every attack in :data:`attacks.base.ATTACKS`."""

from attacks import (  # noqa: F401  (each module registers its attacks)
    canary_queries,
    lira,
    reconstruction,
    record_canaries,
    run_inference,
    shokri,
    threshold,
    update_canaries,
)
from attacks.base import ATTACKS

__all__ = ["ATTACKS"]
