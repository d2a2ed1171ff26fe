"""What every dataset loader returns: a :class:`Dataset` of labelled :class:`Split` records.

Float32 features (images in [0, 1], shape N×C×H×W — :func:`image_tensor` converts to that;
tabular features standardised, shape N×F), int64 labels, optionally an official test split,
and for tabular data the sensitive attributes kept per record (codes, value names and the
feature columns that encode them, which attribute-inference attacks need). Loaders are
registered by name in :data:`audit.core.datasets.DATASETS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class Split:
    """Labelled records; ``attributes`` maps a sensitive attribute to its integer code per record."""

    features: torch.Tensor
    labels: torch.Tensor
    attributes: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: np.ndarray) -> Split:
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return Split(
            self.features[index],
            self.labels[index],
            {name: codes[np.asarray(indices)] for name, codes in self.attributes.items()},
        )


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Split
    num_classes: int
    kind: str  # "image" or "tabular"
    test: Split | None = None  # the official test split, when the dataset has one
    source: str = ""
    attribute_values: dict[str, list[str]] = field(default_factory=dict)
    attribute_columns: dict[str, list[int]] = field(default_factory=dict)
    class_names: list[str] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.train.features.shape[1:])

    def __post_init__(self) -> None:
        for split in (self.train, self.test):
            if split is None:
                continue
            if split.features.dtype != torch.float32 or split.labels.dtype != torch.int64:
                raise ValueError(f"dataset {self.name}: features must be float32 and labels int64")
            if split.features.shape[0] != split.labels.shape[0]:
                raise ValueError(f"dataset {self.name}: features and labels differ in length")
            if len(split) and (int(split.labels.min()) < 0 or int(split.labels.max()) >= self.num_classes):
                raise ValueError(f"dataset {self.name}: labels outside 0..{self.num_classes - 1}")


def image_tensor(array: np.ndarray, scale: float) -> torch.Tensor:
    """uint8/float images → float32 tensor in [0, 1] with a channel axis (N×C×H×W)."""
    images = torch.as_tensor(np.asarray(array, dtype=np.float32) / scale)
    if images.ndim == 3:
        images = images.unsqueeze(1)
    return images.contiguous()
