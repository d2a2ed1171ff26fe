"""Importing this module registers every attack in :data:`attacks.base.ATTACKS`."""

from attacks import lira  # noqa: F401  (lira)
from attacks.base import ATTACKS

__all__ = ["ATTACKS"]
