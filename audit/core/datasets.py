"""Dataset registry: embedded datasets, torchvision datasets read from local files, and tabular CSVs.

Every loader returns a :class:`Dataset`: float32 features (images in [0, 1], shape N×C×H×W;
tabular features standardised, shape N×F), int64 labels, optionally an official test split,
and for tabular data the sensitive attributes kept per record (codes, value names and the
feature columns that encode them, which attribute-inference attacks need).

Files are never unpickled: MNIST-family IDX files are read with torchvision's IDX parser,
CIFAR from its *binary* release (not the pickled "python" release), Adult from CSV.
When files are missing a loader tries torchvision's download (if ``download`` is true) and
otherwise fails with a one-line error naming the directories searched and how to provide them.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from audit.core.errors import UserInputError
from audit.core.registry import Registry


@dataclass
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


@dataclass
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


DatasetLoader = Callable[..., Dataset]
DATASETS: Registry[DatasetLoader] = Registry("dataset")


def default_root(name: str) -> Path:
    """Where a dataset is looked for when the config gives no ``root``."""
    base = os.environ.get("DPFL_AUDIT_DATA")
    if base:
        return Path(base).expanduser() / name
    return Path.home() / ".cache" / "dpfl-audit" / "data" / name


def _images(array: np.ndarray, scale: float) -> torch.Tensor:
    """uint8/float images → float32 tensor in [0, 1] with a channel axis (N×C×H×W)."""
    images = torch.as_tensor(np.asarray(array, dtype=np.float32) / scale)
    if images.ndim == 3:
        images = images.unsqueeze(1)
    return images.contiguous()


def _attempt_download(base: Path, download: Callable[[Path], None]) -> str:
    """Run ``download(base)``; on failure remove what it created and return the reason for the error."""
    import shutil

    existed = base.exists()
    try:
        download(base)
    except Exception as exc:  # offline, proxy, checksum: the caller's error message says why
        if not existed:
            shutil.rmtree(base, ignore_errors=True)
        return f"; download failed ({type(exc).__name__}: {str(exc)[:120]})"
    return ""


# --------------------------------------------------------------------------- embedded datasets


@DATASETS.register("digits")
def load_digits(root: str | None = None) -> Dataset:
    """scikit-learn's 1,797 8×8 handwritten digits (UCI optdigits test part), 10 classes."""
    from sklearn.datasets import load_digits as sk_digits

    data = sk_digits()
    return Dataset(
        "digits",
        Split(_images(data.images, 16.0), torch.as_tensor(data.target, dtype=torch.int64)),
        num_classes=10,
        kind="image",
        source="sklearn.datasets.load_digits (embedded)",
    )


@DATASETS.register("lfw-faces")
def load_lfw_faces(root: str | None = None) -> Dataset:
    """scikit-image's ``lfw_subset``: 200 real 25×25 images, 100 faces (label 1) then 100 non-faces (0)."""
    from skimage.data import lfw_subset

    images = lfw_subset()
    labels = np.r_[np.ones(100, dtype=np.int64), np.zeros(len(images) - 100, dtype=np.int64)]
    return Dataset(
        "lfw-faces",
        Split(_images(images, 1.0), torch.as_tensor(labels)),
        num_classes=2,
        kind="image",
        source="skimage.data.lfw_subset (embedded)",
        class_names=["non-face", "face"],
    )


@DATASETS.register("diabetes")
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


# --------------------------------------------------------------------------- IDX (MNIST family)


def _read_idx(path: Path) -> torch.Tensor:
    """Read an IDX file (optionally gzipped) with torchvision's parser."""
    from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

    if path.suffix != ".gz":
        return read_sn3_pascalvincent_tensor(str(path), strict=False)
    with gzip.open(path, "rb") as compressed, tempfile.NamedTemporaryFile(suffix=".idx") as plain:
        plain.write(compressed.read())
        plain.flush()
        return read_sn3_pascalvincent_tensor(plain.name, strict=False)


def _find(directories: list[Path], stem: str) -> Path | None:
    for directory in directories:
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _idx_splits(directories: list[Path], prefix: str = "") -> dict[str, tuple[Path, Path]]:
    """The (images, labels) file pair of each split present: 'train' and/or 'test'."""
    found = {}
    for split, stem in (("train", "train"), ("test", "t10k" if not prefix else "test")):
        images = _find(directories, f"{prefix}{stem}-images-idx3-ubyte")
        labels = _find(directories, f"{prefix}{stem}-labels-idx1-ubyte")
        if images is not None and labels is not None:
            found[split] = (images, labels)
    return found


def _load_idx_dataset(
    name: str,
    root: str | None,
    download: bool,
    torchvision_folder: str,
    downloader: Callable[[Path], None],
    num_classes: int,
    prefix: str = "",
    transpose: bool = False,
    label_offset: int = 0,
) -> Dataset:
    base = Path(root).expanduser() if root else default_root(name)
    directories = [base, base / torchvision_folder / "raw", base / "raw", base / "gzip"]
    splits = _idx_splits(directories, prefix)
    download_error = ""
    if not splits and download:
        download_error = _attempt_download(base, downloader)
        splits = _idx_splits(directories, prefix)
    if not splits:
        stem = f"{prefix}{'t10k' if not prefix else 'test'}"
        raise UserInputError(
            f"dataset '{name}': no IDX files ({stem}-images-idx3-ubyte[.gz] and "
            f"{stem}-labels-idx1-ubyte[.gz], or the train-* pair) in "
            f"{', '.join(str(d) for d in directories)}{download_error}; "
            f"copy the files into one of these directories or set dataset.root"
        )

    def read(pair: tuple[Path, Path]) -> Split:
        images = _read_idx(pair[0]).numpy()
        if transpose:  # EMNIST stores images transposed
            images = images.transpose(0, 2, 1)
        labels = _read_idx(pair[1]).to(torch.int64) - label_offset
        return Split(_images(images, 255.0), labels)

    train = read(splits["train"]) if "train" in splits else read(splits["test"])
    test = read(splits["test"]) if "train" in splits and "test" in splits else None
    files = ", ".join(str(p) for pair in splits.values() for p in pair)
    note = "" if "train" in splits else " (test split only: the harness splits it into pool and test)"
    return Dataset(name, train, num_classes, "image", test, source=f"IDX files {files}{note}")


def _torchvision_download(dataset_class: str, **kwargs) -> Callable[[Path], None]:
    def download(base: Path) -> None:
        import torchvision.datasets as tvd

        base.mkdir(parents=True, exist_ok=True)
        cls = getattr(tvd, dataset_class)
        for train in (True, False):
            cls(str(base), train=train, download=True, **kwargs)

    return download


@DATASETS.register("mnist")
def load_mnist(root: str | None = None, download: bool = True) -> Dataset:
    """MNIST (LeCun et al.), 28×28 grey digits. A directory with only the t10k files is enough."""
    return _load_idx_dataset("mnist", root, download, "MNIST", _torchvision_download("MNIST"), 10)


@DATASETS.register("fashion-mnist")
def load_fashion_mnist(root: str | None = None, download: bool = True) -> Dataset:
    """Fashion-MNIST (Xiao et al. 2017), 28×28 grey clothing images, 10 classes."""
    return _load_idx_dataset(
        "fashion-mnist", root, download, "FashionMNIST", _torchvision_download("FashionMNIST"), 10
    )


EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


@DATASETS.register("emnist")
def load_emnist(root: str | None = None, download: bool = True, split: str = "byclass") -> Dataset:
    """EMNIST (Cohen et al. 2017), 28×28 characters; ``split`` ∈ byclass (62 classes), bymerge,
    balanced, letters (26, labels shifted to start at 0), digits, mnist. Images are transposed
    upright, as the raw files store them transposed."""
    if split not in EMNIST_CLASSES:
        raise UserInputError(f"dataset.options.split: '{split}' is not allowed; allowed: {', '.join(EMNIST_CLASSES)}")

    def download_split(base: Path) -> None:
        import torchvision.datasets as tvd

        base.mkdir(parents=True, exist_ok=True)
        for train in (True, False):
            tvd.EMNIST(str(base), split=split, train=train, download=True)

    return _load_idx_dataset(
        "emnist", root, download, "EMNIST", download_split, EMNIST_CLASSES[split],
        prefix=f"emnist-{split}-", transpose=True, label_offset=1 if split == "letters" else 0,
    )


# --------------------------------------------------------------------------- CIFAR (binary release)

CIFAR_BINARY = {
    "cifar10": ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530",
                "cifar-10-batches-bin", [f"data_batch_{i}.bin" for i in range(1, 6)], ["test_batch.bin"], 1),
    "cifar100": ("https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz", "03b5dce01913d631647c71ecec9e9cb8",
                 "cifar-100-binary", ["train.bin"], ["test.bin"], 2),
}


def _read_cifar_binary(paths: list[Path], label_bytes: int, label_index: int) -> Split:
    records = np.concatenate([np.fromfile(p, dtype=np.uint8) for p in paths])
    width = label_bytes + 3 * 32 * 32
    if records.size % width:
        raise UserInputError(f"dataset: {paths[0]} is not a CIFAR binary file (size not a multiple of {width})")
    records = records.reshape(-1, width)
    labels = torch.as_tensor(records[:, label_index].astype(np.int64))
    images = records[:, label_bytes:].reshape(-1, 3, 32, 32)
    return Split(_images(images, 255.0), labels)


def _load_cifar(name: str, root: str | None, download: bool, label_index: int, num_classes: int) -> Dataset:
    url, md5, folder, train_files, test_files, label_bytes = CIFAR_BINARY[name]
    base = Path(root).expanduser() if root else default_root(name)
    candidates = [base / folder, base]

    def located() -> Path | None:
        for directory in candidates:
            if all((directory / f).is_file() for f in train_files + test_files):
                return directory
        return None

    directory = located()
    download_error = ""
    if directory is None and download:

        def fetch(target: Path) -> None:
            from torchvision.datasets.utils import download_and_extract_archive

            target.mkdir(parents=True, exist_ok=True)
            download_and_extract_archive(url, str(target), md5=md5)

        download_error = _attempt_download(base, fetch)
        directory = located()
    if directory is None:
        raise UserInputError(
            f"dataset '{name}': binary CIFAR files ({', '.join(train_files + test_files)}) not found in "
            f"{', '.join(str(c) for c in candidates)}{download_error}; download and extract {url} "
            f"into one of these directories or set dataset.root"
        )
    train = _read_cifar_binary([directory / f for f in train_files], label_bytes, label_index)
    test = _read_cifar_binary([directory / f for f in test_files], label_bytes, label_index)
    return Dataset(name, train, num_classes, "image", test, source=f"CIFAR binary release in {directory}")


@DATASETS.register("cifar10")
def load_cifar10(root: str | None = None, download: bool = True) -> Dataset:
    """CIFAR-10 (Krizhevsky 2009), 32×32 colour images, 10 classes, from the binary release."""
    return _load_cifar("cifar10", root, download, 0, 10)


@DATASETS.register("cifar100")
def load_cifar100(root: str | None = None, download: bool = True, label: str = "fine") -> Dataset:
    """CIFAR-100, 100 fine classes (or 20 coarse with ``label: coarse``), from the binary release."""
    if label not in ("fine", "coarse"):
        raise UserInputError(f"dataset.options.label: '{label}' is not allowed; allowed: fine, coarse")
    return _load_cifar("cifar100", root, download, 1 if label == "fine" else 0, 100 if label == "fine" else 20)


# --------------------------------------------------------------------------- Adult (CSV)

ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "Salary",
]
ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
ADULT_SENSITIVE = ["sex", "race"]


@DATASETS.register("adult")
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


# --------------------------------------------------------------------------- entry point


def load_dataset(name: str, root: str | None = None, options: dict | None = None) -> Dataset:
    """Load a registered dataset (or a ``module:callable`` returning a :class:`Dataset`)."""
    import inspect

    loader = DATASETS.get(name, "dataset.name")
    options = dict(options or {})
    parameters = inspect.signature(loader).parameters
    accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    allowed = [p for p in parameters if p != "root"]
    for key in options:
        if key not in parameters and not accepts_kwargs:
            raise UserInputError(
                f"dataset.options.{key}: unknown option for dataset '{name}'; allowed: {', '.join(allowed) or 'none'}"
            )
    kwargs = dict(options)
    if "root" in parameters or accepts_kwargs:
        kwargs["root"] = root
    dataset = loader(**kwargs)
    if not isinstance(dataset, Dataset):
        raise UserInputError(f"dataset.name: '{name}' returned {type(dataset).__name__}, not audit.core.datasets.Dataset")
    return dataset
