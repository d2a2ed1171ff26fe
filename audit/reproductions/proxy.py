"""The CPU proxy task shared by the reproductions: MNIST's test split (or digits) on many small clients."""

from __future__ import annotations

from typing import Any

from audit.core.errors import UserInputError

DATASETS = ("mnist", "digits")


def proxy_dataset(dataset: str, data_root: str | None) -> tuple[dict[str, Any], str]:
    """The dataset section and a one-line note on what stands in for the paper's data."""
    if dataset not in DATASETS:
        raise UserInputError(f"--dataset: '{dataset}' is not allowed; allowed: {', '.join(DATASETS)}")
    if dataset == "mnist":
        section = {"name": "mnist", "root": data_root, "test_fraction": 0.2, "options": {"download": False}}
        return section, "MNIST's public test split (10,000 images: 8,000 pool, 2,000 test)"
    return {"name": "digits", "test_fraction": 0.2}, "scikit-learn digits (1,797 8×8 images: 1,438 pool, 359 test)"
