"""Importing this module registers every attack in :data:`attacks.base.ATTACKS`."""

from attacks.base import ATTACKS
from attacks.canaries import dirac_canaries, record_canaries, record_gradient_canaries, update_canaries  # noqa: F401  (each module registers its attacks)
from attacks.inference import attribute_inference, property_inference  # noqa: F401
from attacks.membership import canary_queries, lira, rmia, shokri, threshold  # noqa: F401
from attacks.reconstruction import gradient_inversion, model_inversion  # noqa: F401

__all__ = ["ATTACKS"]
