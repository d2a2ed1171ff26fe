"""Helpers shared by the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

#: a run name that would execute if the report did not escape it
HOSTILE = "<script>alert(1)</script>"

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(*parts: str) -> Path:
    """Path under SHARED_DATA, the real datasets kept outside the repository; skips the test when a user's clone
    has none."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared real data not present at {path}")
    return path


def tiny_config(**sections: Any) -> str:
    """YAML of a seconds-long audit on digits (2 clients, 1 round, 2 runs, fedavg, loss threshold);
    each keyword replaces one whole top-level section, e.g. ``training={"rounds": 2, ...}``."""
    document: dict[str, Any] = {
        "name": "tiny",
        "dataset": {"name": "digits", "max_pool": 100, "max_test": 50},
        "partition": {"name": "iid", "clients": 2},
        "training": {"rounds": 1, "local_steps": 1, "batch_size": 10, "lr": 0.05},
        "defenses": [{"name": "fedavg"}],
        "membership": {"runs": 2},
        "attacks": [{"name": "loss-threshold"}],
    }
    return yaml.safe_dump({**document, **sections}, sort_keys=False, allow_unicode=True)


README = Path(__file__).resolve().parents[1] / "README.md"
#: the documentation's pages (docs/tutorial, docs/how-to, docs/explanation, ...)
DOCS = Path(__file__).resolve().parents[1] / "docs"


def readme_commands(program: str, document: Path = README) -> list[list[str]]:
    """The arguments of every command line in the README's (or ``document``'s, e.g. a page under
    ``DOCS``) bash blocks that starts with ``program`` (e.g. ``python examples/opacus_audit.py``),
    split as a shell would: the tests run the documentation's examples as printed."""
    import shlex

    text = document.read_text(encoding="utf-8")
    blocks = [block.split("```", 1)[0] for block in text.split("```bash\n")[1:]]
    prefix = shlex.split(program)
    commands = [shlex.split(line, comments=True) for block in blocks for line in block.splitlines()]
    found = [words[len(prefix):] for words in commands if words[:len(prefix)] == prefix]
    if not found:
        raise AssertionError(f"{document.name} shows no command starting with {program!r}")
    return found


def with_out(arguments: list[str], out: Path) -> list[str]:
    """``arguments`` with the value of ``--out`` replaced by ``out``."""
    position = arguments.index("--out")
    return [*arguments[:position + 1], str(out), *arguments[position + 2:]]


def load_script(path: Path, name: str) -> ModuleType:
    """A script outside the package (a benchmark, an example) imported as module ``name``; it is
    registered in ``sys.modules`` first, where dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: what :func:`place_entry` can put at a name of an output folder
ENTRY_KINDS = ("fifo", "folder", "file", "hardlink", "socket", "link-out", "link-in")


def place_entry(out: Path, name: str, kind: str, victim: Path) -> None:
    """Put an entry of ``kind`` at ``out/name`` (its parents created as folders): a FIFO, a folder,
    a file, a hard link to ``victim``, a socket, or a symbolic link to ``victim`` (outside ``out``)
    or to a file inside ``out``."""
    import os
    import socket

    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "file":
        path.write_text("not a folder\n", encoding="utf-8")
    elif kind == "hardlink":
        os.link(victim, path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(os.fspath(path))
        server.close()  # the socket file stays
    else:
        inner = out / "inner.txt"
        inner.write_text("inside\n", encoding="utf-8")
        os.symlink(victim if kind == "link-out" else inner, path)
