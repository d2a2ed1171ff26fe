"""Every DPFL algorithm ("defense"), built from shared blocks.

Importing this package registers the defenses in :data:`DEFENSES`.
"""

from defenses.base import DEFENSES, Defense, PrivacyClaim
from defenses import fedavg  # noqa: F401  (registers fedavg, dp-fedavg)

__all__ = ["DEFENSES", "Defense", "PrivacyClaim"]
