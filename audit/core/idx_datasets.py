"""The MNIST family from IDX files: MNIST (LeCun et al.), Fashion-MNIST (Xiao et al. 2017) and
EMNIST (Cohen et al. 2017).

The files (optionally gzipped) are read with torchvision's IDX parser — never unpickled — from
the dataset's directory or torchvision's layout inside it; a directory with only the test pair
is enough (the harness splits it into pool and test). When no files are found a loader tries
torchvision's download (if ``download`` is true), else fails with a one-line error naming the
directories searched.
"""

from __future__ import annotations

import gzip
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from audit.core.dataset_files import attempt_download, default_root
from audit.core.dataset_types import Dataset, Split, image_tensor
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


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
        download_error = attempt_download(base, downloader)
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
        return Split(image_tensor(images, 255.0), labels)

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


def load_mnist(root: str | None = None, download: bool = True) -> Dataset:
    """MNIST (LeCun et al.), 28×28 grey digits. A directory with only the t10k files is enough."""
    return _load_idx_dataset("mnist", root, download, "MNIST", _torchvision_download("MNIST"), 10)


def load_fashion_mnist(root: str | None = None, download: bool = True) -> Dataset:
    """Fashion-MNIST (Xiao et al. 2017), 28×28 grey clothing images, 10 classes."""
    return _load_idx_dataset(
        "fashion-mnist", root, download, "FashionMNIST", _torchvision_download("FashionMNIST"), 10
    )


EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


def load_emnist(root: str | None = None, download: bool = True,
                split: Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"] = "byclass") -> Dataset:
    """EMNIST (Cohen et al. 2017), 28×28 characters; ``split`` ∈ byclass (62 classes), bymerge,
    balanced, letters (26, labels shifted to start at 0), digits, mnist. Images are transposed
    upright, as the raw files store them transposed."""
    if not isinstance(split, str) or split not in EMNIST_CLASSES:
        raise UserInputError(f"dataset.options.split: {split!r} is not allowed; allowed: {', '.join(EMNIST_CLASSES)}")

    def download_split(base: Path) -> None:
        import torchvision.datasets as tvd

        base.mkdir(parents=True, exist_ok=True)
        for train in (True, False):
            tvd.EMNIST(str(base), split=split, train=train, download=True)

    return _load_idx_dataset(
        "emnist", root, download, "EMNIST", download_split, EMNIST_CLASSES[split],
        prefix=f"emnist-{split}-", transpose=True, label_offset=1 if split == "letters" else 0,
    )
