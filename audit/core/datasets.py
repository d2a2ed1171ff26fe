"""Dataset registry: each dataset's name and its loader, and :func:`load_dataset`.

A loader is any callable ``f(root=None, **options) -> Dataset`` (:class:`Dataset` and
:class:`Split` are defined in :mod:`audit.core.dataset_types` and importable from here, the
plugin API); a config names a registered dataset or a ``module:callable`` loader. The loaders
registered here read embedded data (:mod:`audit.core.embedded_datasets`), the MNIST family's IDX
files (:mod:`audit.core.idx_datasets`), CIFAR's binary release (:mod:`audit.core.cifar_datasets`)
and Adult's CSV (:mod:`audit.core.adult_dataset`). Files are never unpickled.
"""

from __future__ import annotations

from collections.abc import Callable

from audit.core.adult_dataset import load_adult
from audit.core.cifar_datasets import load_cifar10, load_cifar100
from audit.core.dataset_types import Dataset, Split
from audit.core.embedded_datasets import load_diabetes, load_digits, load_lfw_faces
from audit.core.errors import UserInputError
from audit.core.idx_datasets import load_emnist, load_fashion_mnist, load_mnist
from audit.core.registry import Registry
from audit.core.schema import check_options

__all__ = ["DATASETS", "Dataset", "DatasetLoader", "Split", "load_dataset"]

DatasetLoader = Callable[..., Dataset]
DATASETS: Registry[DatasetLoader] = Registry("dataset")

DATASETS.add("digits", load_digits)
DATASETS.add("lfw-faces", load_lfw_faces)
DATASETS.add("diabetes", load_diabetes)
DATASETS.add("mnist", load_mnist)
DATASETS.add("fashion-mnist", load_fashion_mnist)
DATASETS.add("emnist", load_emnist)
DATASETS.add("cifar10", load_cifar10)
DATASETS.add("cifar100", load_cifar100)
DATASETS.add("adult", load_adult)


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
        # a flag must be a real boolean: YAML's "no" in quotes is a string, and a non-empty string
        # is true in Python — `download: "no"` would download
        default = parameters[key].default if key in parameters else None
        if isinstance(default, bool) and not isinstance(options[key], bool):
            raise UserInputError(f"dataset.options.{key}: must be true or false, got {options[key]!r} "
                                 f"({type(options[key]).__name__}); allowed: true, false")
    kwargs = check_options(loader, options, "dataset.options")  # e.g. split: [letters] where a name belongs
    if "root" in parameters or accepts_kwargs:
        kwargs["root"] = root
    dataset = loader(**kwargs)
    if not isinstance(dataset, Dataset):
        raise UserInputError(f"dataset.name: '{name}' returned {type(dataset).__name__}, not audit.core.datasets.Dataset")
    return dataset
