"""Datasets embedded in scikit-learn and scikit-image: no files, no download.

``digits`` (scikit-learn's 8×8 digits, the test part of UCI optdigits), ``lfw-faces``
(scikit-image's ``lfw_subset`` of Labeled Faces in the Wild, faces vs non-faces) and
``diabetes`` (scikit-learn's diabetes records, Efron et al. 2004, binarised at the median, with
``sex`` kept as a sensitive attribute).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from audit.core.dataset_types import Dataset, Split, image_tensor
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


def load_digits(root: str | None = None) -> Dataset:
    """scikit-learn's 1,797 8×8 handwritten digits (UCI optdigits test part), 10 classes."""
    from sklearn.datasets import load_digits as sk_digits

    data = sk_digits()
    return Dataset(
        "digits",
        Split(image_tensor(data.images, 16.0), torch.as_tensor(data.target, dtype=torch.int64)),
        num_classes=10,
        kind="image",
        source="sklearn.datasets.load_digits (embedded)",
    )


def load_lfw_faces(root: str | None = None) -> Dataset:
    """scikit-image's ``lfw_subset``: 200 real 25×25 images, 100 faces (label 1) then 100 non-faces (0)."""
    from skimage.data import lfw_subset

    images = lfw_subset()
    labels = np.r_[np.ones(100, dtype=np.int64), np.zeros(len(images) - 100, dtype=np.int64)]
    return Dataset(
        "lfw-faces",
        Split(image_tensor(images, 1.0), torch.as_tensor(labels)),
        num_classes=2,
        kind="image",
        source="skimage.data.lfw_subset (embedded)",
        class_names=["non-face", "face"],
    )


def load_diabetes(root: str | None = None) -> Dataset:
    """scikit-learn's diabetes records (442 patients, 10 standardised features).

    The regression target (disease progression after one year) is binarised at its median
    so that the task is classification; ``sex`` is kept as a sensitive attribute (feature 1).
    """
    from sklearn.datasets import load_diabetes as sk_diabetes

    raw = sk_diabetes(scaled=False)
    features = raw.data.astype(np.float64)
    features = (features - features.mean(0)) / features.std(0)
    target = (raw.target > np.median(raw.target)).astype(np.int64)
    sex_codes = (raw.data[:, 1] > 1.5).astype(np.int64)  # the raw column holds 1 and 2
    return Dataset(
        "diabetes",
        Split(torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(target), {"sex": sex_codes}),
        num_classes=2,
        kind="tabular",
        source="sklearn.datasets.load_diabetes (embedded); label = progression > median",
        attribute_values={"sex": ["sex=1", "sex=2"]},
        attribute_columns={"sex": [1]},
        class_names=["progression <= median", "progression > median"],
    )
