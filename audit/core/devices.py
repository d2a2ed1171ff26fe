"""The torch devices an audit may run on: those this machine has.

``torch.device`` accepts many names this tool cannot train on (``meta`` holds no data, ``xpu``,
``hip``, ``vulkan`` or ``lazy`` need a build of torch that is rarely installed, ``cpu:7`` or
``cuda:5`` parse but name no real device), and the failure would come only after training, or
when a stored run is read back. So the allowed names are listed from the machine itself, and a
config or ``--device`` naming anything else is refused before any work.
"""

from __future__ import annotations

from audit.core.errors import UserInputError


def available_devices() -> list[str]:
    """The device names this machine can run on: ``cpu``; ``cuda`` and ``cuda:0`` … ``cuda:N-1``
    for its N CUDA devices; ``mps`` where Apple's Metal backend is available."""
    import torch

    devices = ["cpu"]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        devices += ["cuda"] + [f"cuda:{i}" for i in range(count)]
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def check_device(device: str, field: str = "device") -> None:
    """Refuse a device this machine does not have (one line naming ``field`` and the allowed names)."""
    allowed = available_devices()
    if device not in allowed:
        raise UserInputError(f"{field}: '{device}' is not a device of this machine; allowed: {', '.join(allowed)}")
