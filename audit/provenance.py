"""Where a result came from: package versions and the machine (for manifests and the report)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

PACKAGES = ("dpfl-audit", "torch", "torchvision", "numpy", "scipy", "scikit-learn", "scikit-image",
            "pandas", "dp-accounting", "safetensors", "matplotlib", "jinja2")


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for package in PACKAGES:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def machine() -> dict[str, str | int]:
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }
