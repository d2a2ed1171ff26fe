"""UCI Adult census income (Kohavi 1996, "Scaling Up the Accuracy of Naive-Bayes Classifiers: a
Decision-Tree Hybrid") from its CSV file: predict Salary > 50K from 14 attributes.

Numeric columns are standardised, categorical ones one-hot encoded; ``sex`` and ``race`` are
kept as sensitive attributes with the feature columns that encode them (what attribute
inference needs). No download: when the file is missing, the error says where to get it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from audit.core.dataset_files import default_root
from audit.core.dataset_types import Dataset, Split
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

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
    base = Path(root).expanduser() if root else default_root("adult")
    candidates = [base] if base.suffix in (".csv", ".data") else [base / "adult.csv", base / "adult.data"]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise UserInputError(
            f"dataset 'adult': no CSV at {', '.join(str(c) for c in candidates)}; download adult.data from "
            f"https://archive.ics.uci.edu/dataset/2/adult and set dataset.root to its path"
        )
    names, rows = _read_rows(path)
    labels = np.empty(len(rows), dtype=np.int64)
    for i, (line, fields) in enumerate(rows):
        # adult.test writes its labels with a trailing period ("<=50K.")
        salary = fields[names["Salary"]].rstrip(".").strip()
        if salary not in ("<=50K", ">50K"):
            _refuse(path, line, f"Salary is '{_shown(salary)}'", "<=50K or >50K (a trailing '.' is allowed)")
        labels[i] = salary == ">50K"
    encoded: list[tuple[str, np.ndarray, list[str]]] = []  # (column, values or codes, categories)
    for column in ADULT_COLUMNS[:-1]:
        texts = [fields[names[column]] for _, fields in rows]
        if column in ADULT_NUMERIC:
            encoded.append((column, _numbers(path, rows, column, texts), []))
            continue
        categories = sorted(set(texts))
        if len(categories) > MAX_CATEGORIES:
            raise UserInputError(f"dataset.root: {path}: column {column} has {len(categories)} distinct values; "
                                 f"allowed: at most {MAX_CATEGORIES} (the UCI file has at most 42)")
        encoded.append((column, np.searchsorted(categories, texts), categories))
    width = sum(len(categories) or 1 for _, _, categories in encoded)
    if len(rows) * width > MAX_FEATURE_CELLS:
        raise UserInputError(f"dataset.root: {path}: {len(rows)} rows × {width} feature columns is too large; "
                             f"allowed: at most {MAX_FEATURE_CELLS:.3g} feature values")
    features = np.zeros((len(rows), width), dtype=np.float32)
    columns: list[str] = []
    attribute_columns: dict[str, list[int]] = {}
    attribute_values: dict[str, list[str]] = {}
    attributes: dict[str, np.ndarray] = {}
    for column, values, categories in encoded:
        if not categories:
            spread = values.std()
            # a constant column (one row, or a hand-made file) carries no information: all zeros
            features[:, len(columns)] = (values - values.mean()) / (spread if spread > 0 else 1.0)
            columns.append(column)
            continue
        if column in ADULT_SENSITIVE:
            attribute_columns[column] = list(range(len(columns), len(columns) + len(categories)))
            attribute_values[column] = list(categories)
            attributes[column] = values.astype(np.int64)
        features[np.arange(len(rows)), len(columns) + values] = 1.0
        columns.extend(f"{column}={c}" for c in categories)
    return Dataset(
        "adult",
        Split(torch.from_numpy(features), torch.as_tensor(labels), attributes),
        num_classes=2,
        kind="tabular",
        source=f"CSV {path}",
        attribute_values=attribute_values,
        attribute_columns=attribute_columns,
        class_names=["<=50K", ">50K"],
    )


#: the most distinct values a categorical column may have (UCI Adult: 42 native countries); a
#: column of unique strings would otherwise one-hot encode into rows × rows floats
MAX_CATEGORIES = 1000
#: the most feature values (rows × encoded columns, float32) built: 1 GiB; the UCI files need 5·10⁶
MAX_FEATURE_CELLS = 2**28
#: the largest file read (the UCI adult.data is 3.8 MB)
MAX_FILE_BYTES = 256 * 2**20
#: the largest magnitude of a numeric field (fnlwgt, the largest, stays below 1.5·10⁶); beyond,
#: squares in the standardisation overflow
MAX_MAGNITUDE = 1e12


def _shown(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _refuse(path: Path, line: int, what: str, allowed: str) -> None:
    raise UserInputError(f"dataset.root: {path}, line {line}: {what}; allowed: {allowed}")


def _read_rows(path: Path) -> tuple[dict[str, int], list[tuple[int, list[str]]]]:
    """The file's column positions and its data rows as (line number, fields).

    The UCI format: fields separated by commas with optional spaces, no quoting, an optional
    header row starting with ``age``, blank lines and ``|`` comment lines (adult.test's first
    line) skipped. The file is data a user hands us, so every way it can be malformed — not
    UTF-8, a row with the wrong number of fields, no rows — is one line naming the file and
    the line, never a decoding or parsing exception.
    """
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise UserInputError(f"dataset.root: {path} is {path.stat().st_size} bytes; allowed: a CSV of at most "
                                 f"{MAX_FILE_BYTES // 2**20} MiB")
        data = path.read_bytes()
    except OSError as exc:
        raise UserInputError(f"dataset.root: {path} cannot be read ({exc.strerror or exc}); "
                             "allowed: a readable CSV file") from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark, as spreadsheet programs write, is dropped
    except UnicodeDecodeError as exc:
        where = data.count(b"\n", 0, exc.start) + 1
        raise UserInputError(f"dataset.root: {path}, line {where}: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                             "is not UTF-8; allowed: a UTF-8 (or ASCII) CSV — re-save it as UTF-8, e.g. "
                             "iconv -f latin1 -t utf-8") from None
    names: dict[str, int] | None = None
    rows: list[tuple[int, list[str]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("|"):
            continue
        fields = [field.strip() for field in line.split(",")]
        if names is None:
            if fields[0].lower() == "age":  # a header row: its names say where each column is
                missing = [c for c in ADULT_COLUMNS if c not in fields]
                if missing:
                    _refuse(path, number, f"the header lacks the columns {', '.join(missing)}",
                            f"a header naming {', '.join(ADULT_COLUMNS)}")
                names = {name: fields.index(name) for name in ADULT_COLUMNS}
                width = len(fields)
                continue
            names, width = {name: i for i, name in enumerate(ADULT_COLUMNS)}, len(ADULT_COLUMNS)
        if len(fields) != width:
            _refuse(path, number, f"{len(fields)} fields", f"{width} comma-separated fields per row")
        rows.append((number, fields))
    if not rows:
        raise UserInputError(f"dataset.root: {path} has no data rows; allowed: a CSV of UCI Adult rows "
                             f"({', '.join(ADULT_COLUMNS)})")
    assert names is not None
    return names, rows


def _numbers(path: Path, rows: list[tuple[int, list[str]]], column: str, texts: list[str]) -> np.ndarray:
    """A numeric column as float64, every value finite and at most MAX_MAGNITUDE in size."""
    values = np.empty(len(texts), dtype=np.float64)
    for i, text in enumerate(texts):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and abs(value) <= MAX_MAGNITUDE):
            _refuse(path, rows[i][0], f"{column} is '{_shown(text)}'",
                    f"a finite number of magnitude at most {MAX_MAGNITUDE:g}")
        values[i] = value
    return values
