"""Importing this module registers every defense in :data:`defenses.base.DEFENSES`."""

from defenses import fedavg  # noqa: F401  (fedavg, dp-fedavg)
from defenses.base import DEFENSES

__all__ = ["DEFENSES"]
