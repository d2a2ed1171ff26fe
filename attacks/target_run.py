"""What a run attack is given: one trained run as the server holds it (:class:`TargetRun`).

Its final and per-round global models, the uploads and aggregates the server recorded, and the
data an evaluation needs to score an attack (the clients' records, the test split, attribute
codes); :class:`SideRun` is the same defense trained on another dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")


@dataclass
class SideRun:
    """The audited defense trained once more on another dataset (e.g. a tabular one with a
    sensitive attribute, when the audit's own data have none), by the same pipeline."""

    dataset: Any  # audit.core.datasets.Dataset
    pool: Any  # audit.core.datasets.Split: the candidate records
    members: np.ndarray  # pool indices the run trained on
    model: nn.Module
    params: dict[str, torch.Tensor]
    test_accuracy: float | None = None


@dataclass
class TargetRun:
    """One trained run as an honest-but-curious server holds it, plus the data an evaluation
    needs to score an attack (the clients' records, the test split, attribute codes)."""

    key: str
    defense: Any  # defenses.base.Defense
    training: Any  # defenses.federated.training_job.TrainingConfig
    model: nn.Module  # architecture template
    params: dict[str, torch.Tensor]  # final global model
    initial: dict[str, torch.Tensor]  # global model before round 1
    load_global: Callable[[int], dict[str, torch.Tensor] | None]  # global model after round t (None: not stored)
    server_view: dict[str, torch.Tensor]  # recorded uploads/aggregates, "round_0001/client_00003" → flat tensor
    pool_x: torch.Tensor
    pool_y: torch.Tensor
    clients: list[np.ndarray]  # pool indices per client
    test_x: torch.Tensor
    test_y: torch.Tensor
    dataset: Any  # audit.core.datasets.Dataset (attributes, value names, attribute columns)
    kind: str  # "image" or "tabular"
    seed: int
    device: str = "cpu"
    #: members of run 0 (pool indices) — the records it trained on
    members: np.ndarray | None = None
    #: sensitive attribute → code per pool record (datasets that have them)
    pool_attributes: dict[str, np.ndarray] = field(default_factory=dict)
    #: train the same defense configuration on another dataset: (dataset name, data root) → SideRun
    train_side: Callable[[str, str | None], SideRun] | None = None

    def global_before(self, round_number: int) -> dict[str, torch.Tensor] | None:
        """The model the clients of ``round_number`` started from."""
        return self.initial if round_number == 1 else self.load_global(round_number - 1)


def auxiliary_records(members: np.ndarray, size: int) -> np.ndarray:
    """Pool records the run did not train on: the attacker's auxiliary data."""
    return np.setdiff1d(np.arange(size), members)
