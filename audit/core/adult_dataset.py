"""UCI Adult census income (Kohavi 1996, "Scaling Up the Accuracy of Naive-Bayes Classifiers: a
Decision-Tree Hybrid") from its CSV file: predict Salary > 50K from 14 attributes.

Numeric columns are standardised, categorical ones one-hot encoded; ``sex`` and ``race`` are
kept as sensitive attributes with the feature columns that encode them (what attribute
inference needs). No download: when the file is missing, the error says where to get it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from audit.core.dataset_files import default_root
from audit.core.dataset_types import Dataset, Split
from audit.core.errors import UserInputError

ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "Salary",
]
ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
ADULT_SENSITIVE = ["sex", "race"]


def load_adult(root: str | None = None) -> Dataset:
    """UCI Adult census income (Kohavi 1996): predict Salary > 50K from 14 attributes.

    ``root`` is the CSV file (``adult.data``, or the same with a header row) or a directory
    holding ``adult.csv``/``adult.data``. Fields are separated by ``", "``; ``?`` marks a missing
    value, kept as its own category. Numeric columns are standardised; categorical columns
    one-hot encoded, ``sex`` and ``race`` included, and kept as sensitive attributes together
    with the feature columns that encode them.
    """
    import pandas as pd

    base = Path(root).expanduser() if root else default_root("adult")
    candidates = [base] if base.suffix in (".csv", ".data") else [base / "adult.csv", base / "adult.data"]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise UserInputError(
            f"dataset 'adult': no CSV at {', '.join(str(c) for c in candidates)}; download adult.data from "
            f"https://archive.ics.uci.edu/dataset/2/adult and set dataset.root to its path"
        )
    with open(path, encoding="utf-8") as handle:
        first = handle.readline()
    has_header = first.lower().startswith("age")
    frame = pd.read_csv(path, sep=r"\s*,\s*", engine="python", header=0 if has_header else None,
                        names=None if has_header else ADULT_COLUMNS, skip_blank_lines=True, dtype=str)
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in ADULT_COLUMNS if c not in frame.columns]
    if missing:
        raise UserInputError(f"dataset 'adult': {path} lacks the columns {', '.join(missing)}")
    frame = frame.dropna(subset=["Salary"]).reset_index(drop=True)
    labels = frame["Salary"].str.rstrip(".").str.strip().eq(">50K").to_numpy().astype(np.int64)
    blocks, columns = [], []
    attribute_columns: dict[str, list[int]] = {}
    attribute_values: dict[str, list[str]] = {}
    attributes: dict[str, np.ndarray] = {}
    for column in ADULT_COLUMNS[:-1]:
        if column in ADULT_NUMERIC:
            values = frame[column].astype(np.float64).to_numpy()
            blocks.append(((values - values.mean()) / values.std())[:, None])
            columns.append(column)
            continue
        categories = sorted(frame[column].fillna("?").unique())
        codes = np.searchsorted(categories, frame[column].fillna("?").to_numpy())
        if column in ADULT_SENSITIVE:
            attribute_columns[column] = list(range(len(columns), len(columns) + len(categories)))
            attribute_values[column] = list(categories)
            attributes[column] = codes.astype(np.int64)
        blocks.append(np.eye(len(categories))[codes])
        columns.extend(f"{column}={c}" for c in categories)
    features = np.concatenate(blocks, axis=1)
    return Dataset(
        "adult",
        Split(torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(labels), attributes),
        num_classes=2,
        kind="tabular",
        source=f"CSV {path}",
        attribute_values=attribute_values,
        attribute_columns=attribute_columns,
        class_names=["<=50K", ">50K"],
    )
