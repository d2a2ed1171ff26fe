"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny
Images") from the *binary* release.

The binary release holds fixed-width records (label byte(s), then 3×32×32 pixels), read with
numpy — not the pickled "python" release, so nothing is unpickled. When the files are missing a
loader downloads and extracts the archive (MD5-checked) if ``download`` is true, else fails with
a one-line error naming the directories searched and the archive's address.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from audit.core.dataset_files import attempt_download, default_root
from audit.core.dataset_types import Dataset, Split, image_tensor
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")

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
    return Split(image_tensor(images, 255.0), labels)


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

        download_error = attempt_download(base, fetch)
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


def load_cifar10(root: str | None = None, download: bool = True) -> Dataset:
    """CIFAR-10 (Krizhevsky 2009), 32×32 colour images, 10 classes, from the binary release."""
    return _load_cifar("cifar10", root, download, 0, 10)


def load_cifar100(root: str | None = None, download: bool = True, label: str = "fine") -> Dataset:
    """CIFAR-100, 100 fine classes (or 20 coarse with ``label: coarse``), from the binary release."""
    if label not in ("fine", "coarse"):
        raise UserInputError(f"dataset.options.label: '{label}' is not allowed; allowed: fine, coarse")
    return _load_cifar("cifar100", root, download, 1 if label == "fine" else 0, 100 if label == "fine" else 20)
