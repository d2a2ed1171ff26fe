"""Dataset loaders: embedded data, IDX and CIFAR-binary files read from local directories, Adult CSV."""

from __future__ import annotations

import gzip
import hashlib
import struct

import numpy as np
import pytest
import torch

from audit.core.datasets import DATASETS, load_dataset
from audit.core.errors import UserInputError
from tests.helpers import shared_data


def test_registry_names():
    assert set(DATASETS.names()) == {"digits", "lfw-faces", "diabetes", "mnist", "fashion-mnist", "emnist",
                                     "cifar10", "cifar100", "adult"}


def test_digits(digits):
    assert digits.train.features.shape == (1797, 1, 8, 8) and digits.num_classes == 10 and digits.test is None
    assert float(digits.train.features.min()) >= 0.0 and float(digits.train.features.max()) <= 1.0
    assert np.bincount(digits.train.labels.numpy()).min() > 150


def test_lfw_faces():
    data = load_dataset("lfw-faces")
    assert data.train.features.shape == (200, 1, 25, 25) and data.train.labels.sum() == 100


def test_diabetes_keeps_sex_as_sensitive_attribute():
    data = load_dataset("diabetes")
    assert data.kind == "tabular" and data.train.features.shape == (442, 10)
    sex = data.train.attributes["sex"]
    assert set(np.unique(sex)) == {0, 1}
    column = data.train.features[:, data.attribute_columns["sex"][0]].numpy()
    # the feature column encodes the attribute: two values, ordered like the codes
    assert column[sex == 1].min() > column[sex == 0].max()


def test_mnist_from_shared_test_split_only():
    root = shared_data("mnist")
    data = load_dataset("mnist", str(root))
    assert data.train.features.shape == (10000, 1, 28, 28) and data.test is None
    assert np.bincount(data.train.labels.numpy(), minlength=10).tolist()[:3] == [980, 1135, 1032]
    assert "test split only" in data.source
    digest = hashlib.md5((root / "t10k-labels-idx1-ubyte.gz").read_bytes()).hexdigest()
    assert digest == "ec29112dd5afa0611ce80d1b7f02629c"


def _write_idx(path, array: np.ndarray, compress: bool) -> None:
    header = struct.pack(">I", 0x0800 + array.ndim) + b"".join(struct.pack(">I", s) for s in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(f"{path}.gz", "wb") as out:
            out.write(payload)
    else:
        path.write_bytes(payload)


@pytest.mark.parametrize("compress", [True, False])
def test_idx_files_in_torchvision_layout(tmp_path, compress):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("t10k", 12)):
        _write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), compress)
        _write_idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n), compress)
    data = load_dataset("mnist", str(tmp_path), {"download": False})
    assert len(data.train) == 30 and len(data.test) == 12


def test_cifar_binary_release_is_parsed(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    rng = np.random.default_rng(1)
    labels = {}
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        records = rng.integers(0, 256, (3, 1 + 3072), dtype=np.uint8)
        records[:, 0] %= 10
        labels[name] = records[:, 0].copy()
        records.tofile(folder / name)
    data = load_dataset("cifar10", str(tmp_path), {"download": False})
    assert data.train.features.shape == (15, 3, 32, 32) and len(data.test) == 3
    assert data.test.labels.tolist() == labels["test_batch.bin"].tolist()


def test_missing_dataset_is_a_one_line_error_and_creates_nothing(tmp_path):
    target = tmp_path / "nowhere"
    with pytest.raises(UserInputError) as error:
        load_dataset("fashion-mnist", str(target), {"download": False})
    message = str(error.value)
    assert "\n" not in message and str(target) in message and "dataset.root" in message
    assert not target.exists()


def test_unknown_loader_option_names_the_allowed_ones():
    with pytest.raises(UserInputError, match="dataset.options.colour.*allowed: download"):
        load_dataset("mnist", None, {"colour": True})
    with pytest.raises(UserInputError, match="split"):
        load_dataset("emnist", None, {"split": "bogus"})


def test_adult_from_shared_csv():
    path = shared_data("adult", "adult.csv")
    data = load_dataset("adult", str(path))
    assert len(data.train) == 32561 and data.num_classes == 2
    assert data.train.labels.float().mean().item() == pytest.approx(7841 / 32561)
    for attribute, count in (("sex", 2), ("race", 5)):
        codes = data.train.attributes[attribute]
        columns = data.attribute_columns[attribute]
        assert len(data.attribute_values[attribute]) == count == len(columns)
        one_hot = data.train.features[:, columns].numpy()
        assert np.array_equal(one_hot.argmax(1), codes) and np.allclose(one_hot.sum(1), 1.0)
    assert data.attribute_values["sex"] == ["Female", "Male"]


def test_adult_without_header(tmp_path):
    path = shared_data("adult", "adult.csv")
    lines = path.read_text().splitlines()[1:200]
    headless = tmp_path / "adult.data"
    headless.write_text("\n".join(lines) + "\n")
    data = load_dataset("adult", str(tmp_path))
    assert len(data.train) == 199 and data.train.features.dtype == torch.float32
