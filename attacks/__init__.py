"""Attacks on trained runs and on what the server saw.

Importing this package registers the attacks in :data:`ATTACKS`.
"""

from attacks.base import ATTACKS, AttackResult, MembershipAttack, MembershipExperiment
from attacks import lira  # noqa: F401  (registers lira)

__all__ = ["ATTACKS", "AttackResult", "MembershipAttack", "MembershipExperiment"]
