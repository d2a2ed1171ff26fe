"""Resolve ``module:callable`` references so a config can name a user's own dataset, model or defense.

``package.module:factory`` is imported with :mod:`importlib` (the current directory is on the
path, as for ``python -m``); ``path/to/file.py:factory`` is loaded from that file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from audit.errors import UserInputError


def is_reference(name: str) -> bool:
    """True when ``name`` has the ``module:callable`` form rather than a registry name."""
    return ":" in name


def resolve(reference: str, field: str) -> Callable[..., Any]:
    """Import and return the callable named by ``reference``; ``field`` names the config field for errors."""
    module_part, _, attribute = reference.rpartition(":")
    if not module_part or not attribute:
        raise UserInputError(f"{field}: '{reference}' is not of the form 'module:callable'")
    try:
        if module_part.endswith(".py"):
            path = Path(module_part).expanduser().resolve()
            if not path.is_file():
                raise UserInputError(f"{field}: file '{module_part}' does not exist")
            # one module per file, registered in sys.modules (dataclasses and pickling-free
            # introspection look classes up there) and reused by every reference to the file
            name = f"dpfl_audit_user_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{path.stem}"
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is None or spec.loader is None:
                    raise UserInputError(f"{field}: cannot load '{module_part}'")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_part)
    except UserInputError:
        raise
    except Exception as exc:  # an import error in user code: report it on one line
        raise UserInputError(f"{field}: cannot import '{module_part}': {type(exc).__name__}: {exc}") from exc
    target = getattr(module, attribute, None)
    if target is None or not callable(target):
        raise UserInputError(f"{field}: '{module_part}' has no callable '{attribute}'")
    return target
