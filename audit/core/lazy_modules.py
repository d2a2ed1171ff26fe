"""Heavy libraries imported when first used, not when the module that uses them is imported.

torch takes seconds to import (scikit-learn one, matplotlib half of one), and the commands that
only describe or judge (``dpfl-audit list``, ``config``, ``epsilon``, ``check``, ``scores``) import
the defenses and attacks without running them. A module that uses torch names it at the top as
usual, for readers and type checkers, and gets a stand-in at run time:

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy_module("torch")

The first attribute read on the stand-in (``torch.zeros``) imports the module; each attribute is
then kept on the stand-in, so later reads cost what a module's do. The stand-in is never put in
``sys.modules``: code that asks whether torch is loaded is told the truth. A module that needs the
library at import (a class deriving from ``nn.Module``, matplotlib's backend chosen before pyplot)
is itself imported through a stand-in by the modules that use it (``attacks.reconstruction.inverse_network``,
``reports.plots``). tests/audit/test_light_commands.py checks which heavy modules (torch, matplotlib,
scikit-learn, dp-accounting, scipy.stats, scipy.optimize, scipy.signal) each light command loads.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _LazyModule(ModuleType):
    """Stands in for the module ``name`` until an attribute is read."""

    def __getattr__(self, attribute: str) -> Any:
        # only called for attributes not yet kept here
        value = getattr(importlib.import_module(self.__name__), attribute)
        setattr(self, attribute, value)
        return value


def lazy_module(name: str) -> ModuleType:
    """A stand-in for the module ``name`` that imports it when one of its attributes is first read."""
    return _LazyModule(name)
