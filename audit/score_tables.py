"""Reading a score file's table — CSV, Parquet or NPZ (one array per column) — as columns of equal
length, every size limit checked before the data is loaded (from the .npy headers, the Parquet
metadata, the CSV's size and row count), so a huge or lying file is one
:class:`~audit.core.errors.UserInputError` naming the file, not a MemoryError. What the columns
mean is :mod:`audit.score_files`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from audit.core.errors import UserInputError

#: file extension → format
FORMATS = {".csv": "csv", ".parquet": "parquet", ".npz": "npz"}
#: the size limits of a score file, each checked before the data is loaded (from the .npy headers,
#: the Parquet metadata, the CSV's size and row count), so a huge or lying file is one line, not
#: a MemoryError: rows (LiRA's largest published grid, 256 models × 50,000 records, would be split)
MAX_ROWS = 10_000_000
#: ... columns (a score file has four to six; extra ones are reported as not read)
MAX_COLUMNS = 64
#: ... characters of one text cell in an NPZ string array (ids are short names)
MAX_TEXT_CHARS = 1024
#: ... bytes of a CSV file, and of a Parquet file's or an NPZ archive's data once decoded (about
#: 100 bytes a row): counted from the .npy headers (rows × item size, summed over the columns) and,
#: for Parquet, from the footer and the dictionaries (a short dictionary can expand to gigabytes)
MAX_TABLE_BYTES = 100 * MAX_ROWS

class Table:
    """The columns of a file as arrays of equal length, with error messages that name the file."""

    def __init__(self, path: Path, columns: dict[str, np.ndarray]):
        self.path, self.columns = path, columns
        self.rows = len(next(iter(columns.values()))) if columns else 0

    def error(self, text: str) -> UserInputError:
        return UserInputError(f"{self.path}: {text}")


# --------------------------------------------------------------------------- reading the formats


def _too_many_rows(path: Path, rows: str) -> UserInputError:
    return UserInputError(f"{path}: {rows} rows, more than a score file may have; allowed: up to {MAX_ROWS} rows "
                          "(split the scores into several files)")


def _check_names(path: Path, names: list[str]) -> None:
    """Refuse a table with too many columns or a column given twice (readers would silently keep
    one of them, or rename the other)."""
    if len(names) > MAX_COLUMNS:
        raise UserInputError(f"{path}: {len(names)} columns; allowed: up to {MAX_COLUMNS} columns")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise UserInputError(f"{path}: column '{name}' is given twice; allowed: each column once")
        seen.add(name)


def _csv_header(path: Path) -> list[str]:
    """The CSV's header row as the csv module splits it (pandas would rename a repeated name to
    "name.1", hiding the repetition)."""
    import csv

    try:
        with path.open(encoding="utf-8", newline="") as handle:
            # the first row that is not blank, as for pandas (skip_blank_lines)
            return [name.strip() for name in next((row for row in csv.reader(handle) if row), [])]
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); "
                             "is it a CSV file?") from None
    except csv.Error as exc:
        raise UserInputError(f"{path}: not a readable CSV table: {' '.join(str(exc).split())[:200]}") from None


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    size = path.stat().st_size
    if size > MAX_TABLE_BYTES:
        raise UserInputError(f"{path}: {size} bytes, more than a CSV score file may have; allowed: up to "
                             f"{MAX_TABLE_BYTES} bytes ({MAX_ROWS} rows; split the scores into several files)")
    _check_names(path, _csv_header(path))
    # every cell as text: ids keep their spelling ("007" ≠ "7"), and each value is checked by us,
    # with its row, rather than coerced silently by a parser; one row past the limit is read, to
    # tell a file at the limit from one beyond it
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False, skipinitialspace=True,
                            encoding="utf-8", nrows=MAX_ROWS + 1)
    except pd.errors.EmptyDataError:
        raise UserInputError(f"{path}: empty file; a score file needs a header row and at least one row of scores") from None
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); "
                             "is it a CSV file?") from None
    except pd.errors.ParserError as exc:
        raise UserInputError(f"{path}: not a readable CSV table: {' '.join(str(exc).split())[:200]}") from None
    if len(frame) > MAX_ROWS:
        raise _too_many_rows(path, f"more than {MAX_ROWS}")
    return {str(name).strip(): frame[name].to_numpy(dtype=object) for name in frame.columns}


def _read_parquet(path: Path) -> dict[str, np.ndarray]:
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise UserInputError(f"{path}: reading Parquet needs pyarrow, which is not installed: "
                             "pip install pyarrow (or give the scores as .csv or .npz)")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # the sizes from the footer's metadata first, before any column is read
        parquet = pq.ParquetFile(path)
        metadata = parquet.metadata
        if metadata.num_rows > MAX_ROWS:
            raise _too_many_rows(path, str(metadata.num_rows))
        size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        if size > MAX_TABLE_BYTES:
            raise _too_large(path, f"{size} bytes of data once uncompressed")
        # text columns stay dictionary-encoded until their decoded size is known
        schema = parquet.schema_arrow
        text = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
        table = pq.read_table(path, read_dictionary=text)
        _check_decoded_text(path, table)
        table = table.cast(schema) if text else table
    except UserInputError:
        raise
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise UserInputError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())[:200]})") from None
    # the pandas metadata (a JSON blob any writer may set) only restores an index, which a score
    # file does not use, and a broken one makes pandas fail: the columns are read without it
    names = [str(name).strip() for name in table.column_names if not re.fullmatch(r"__index_level_\d+__", name)]
    _check_names(path, names)
    frame = table.replace_schema_metadata(None).to_pandas()
    return {str(name).strip(): frame[name].to_numpy() for name in frame.columns
            if not re.fullmatch(r"__index_level_\d+__", str(name))}


def _too_large(path: Path, what: str) -> UserInputError:
    return UserInputError(f"{path}: {what}, more than a score file may have; allowed: up to {MAX_TABLE_BYTES} bytes "
                          "(split the scores into several files)")


def _check_decoded_text(path: Path, table) -> None:
    """Refuse a Parquet table whose text columns, decoded, exceed :data:`MAX_TABLE_BYTES` (with every
    fixed-size column) or hold a cell longer than :data:`MAX_TEXT_CHARS`: computed from each
    dictionary's entry lengths and the indices, before anything is expanded."""
    import pyarrow as pa
    import pyarrow.compute as pc

    decoded = 0
    for name, column in zip(table.column_names, table.columns):
        if not pa.types.is_dictionary(column.type):
            decoded += column.nbytes
            continue
        for chunk in column.chunks:
            lengths = pc.binary_length(chunk.dictionary).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            if len(lengths) and lengths.max() > 4 * MAX_TEXT_CHARS:
                raise UserInputError(f"{path}: column '{name}' holds text of {int(lengths.max())} bytes a cell; "
                                     f"allowed: up to {MAX_TEXT_CHARS} characters")
            indices = chunk.indices.fill_null(0).to_numpy(zero_copy_only=False)
            decoded += int(np.bincount(indices, minlength=len(lengths)) @ lengths) + 8 * len(chunk)
        if decoded > MAX_TABLE_BYTES:
            raise _too_large(path, f"{decoded} bytes once its text is decoded (up to column '{name}')")


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    import zipfile

    columns = {}
    if not zipfile.is_zipfile(path):  # np.load would take it for a .npy array or a pickle
        raise UserInputError(f"{path}: not an NPZ archive (not a zip file); write one array per column with numpy.savez")
    _check_npz_headers(path)
    try:
        # allow_pickle=False: an object array would be unpickled, which can run code; such an
        # array is refused instead
        with np.load(path, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise UserInputError(f"{path}: not an NPZ archive (one array per column, numpy.savez)")
            for name in archive.files:
                try:
                    columns[name] = archive[name]
                except ValueError as exc:
                    if "allow_pickle" in str(exc):
                        raise UserInputError(f"{path}: array '{name}' holds Python objects, which would have to be "
                                             "unpickled; store numbers or fixed-width strings (numpy dtype 'U')") from None
                    raise UserInputError(f"{path}: array '{name}' is not readable ({exc})") from None
    except UserInputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UserInputError(f"{path}: not a readable NPZ archive ({' '.join(str(exc).split())[:200]})") from None
    for name, array in columns.items():
        if array.ndim != 1:
            raise UserInputError(f"{path}: array '{name}' must be one-dimensional (one entry per row), "
                                 f"has shape {array.shape}")
    lengths = {name: len(array) for name, array in columns.items()}
    if len(set(lengths.values())) > 1:
        first, *rest = lengths.items()
        other = next((name, n) for name, n in rest if n != first[1])
        raise UserInputError(f"{path}: arrays differ in length: '{first[0]}' has {first[1]} entries, "
                             f"'{other[0]}' has {other[1]}; every column needs one entry per row")
    return columns


def _check_npz_headers(path: Path) -> None:
    """Check every member of an NPZ archive from its .npy header alone, before any array is loaded:
    a .npy file (numpy.savez writes nothing else), one dimension, a dtype of numbers, booleans or
    short text, at most :data:`MAX_ROWS` entries — a header is a few bytes, whatever it claims."""
    import zipfile

    from numpy.lib import format as npy

    allowed = "allowed: one-dimensional arrays of numbers, booleans or text (numpy.savez)"
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
            _check_names(path, [name.removesuffix(".npy") for name in members])
            decoded = 0
            for member in members:
                name = member.removesuffix(".npy")
                if not member.endswith(".npy"):
                    raise UserInputError(f"{path}: member '{member}' is not a .npy array; allowed: one .npy array "
                                         "per column, as numpy.savez writes")
                with archive.open(member) as handle:
                    try:
                        version = npy.read_magic(handle)
                        reader = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
                        if reader is None:
                            raise ValueError(f".npy format version {version[0]}.{version[1]} (allowed: 1.0, 2.0)")
                        shape, _, dtype = reader(handle)
                    except ValueError as exc:
                        raise UserInputError(f"{path}: array '{name}' has no valid .npy header "
                                             f"({' '.join(str(exc).split())[:120]})") from None
                if len(shape) != 1:
                    raise UserInputError(f"{path}: array '{name}' must be one-dimensional (one entry per row), "
                                         f"has shape {shape}")
                if shape[0] > MAX_ROWS:
                    raise _too_many_rows(path, f"array '{name}' has {shape[0]}")
                if dtype.kind == "c":
                    raise UserInputError(f"{path}: array '{name}' holds complex numbers ({dtype}); "
                                         "allowed: arrays of real numbers, booleans or text")
                if dtype.kind not in "biufUSO":  # object arrays get their own message when loaded
                    raise UserInputError(f"{path}: array '{name}' has dtype {dtype}; {allowed}")
                chars = dtype.itemsize // (4 if dtype.kind == "U" else 1)
                if dtype.kind in "US" and chars > MAX_TEXT_CHARS:
                    raise UserInputError(f"{path}: array '{name}' holds text of up to {chars} characters a cell; "
                                         f"allowed: up to {MAX_TEXT_CHARS}")
                decoded += shape[0] * dtype.itemsize
                if decoded > MAX_TABLE_BYTES:
                    raise _too_large(path, f"{decoded} bytes once loaded (up to array '{name}')")
    except (OSError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError) as exc:
        # NotImplementedError: an unsupported compression; RuntimeError: an encrypted member
        raise UserInputError(f"{path}: not a readable NPZ archive ({' '.join(str(exc).split())[:200]})") from None


def read_table(path: Path) -> Table:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise UserInputError(f"{path}: extension '{path.suffix}' is not supported; allowed: {', '.join(FORMATS)}")
    if not path.is_file():
        raise UserInputError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise UserInputError(f"{path}: cannot read the file (permission denied)")
    if path.stat().st_size == 0:
        raise UserInputError(f"{path}: empty file; a score file needs a header row and at least one row of scores")
    reader = {"csv": _read_csv, "parquet": _read_parquet, "npz": _read_npz}[FORMATS[suffix]]
    return Table(path, reader(path))
