"""Resolve ``module:callable`` references so a config can name a user's own dataset, model or defense.

``package.module:factory`` is imported with :mod:`importlib` (the current directory is on the
path, as for ``python -m``); ``path/to/file.py:factory`` is loaded from that file.

A config that names code runs that code: a config is trusted input, like a Makefile. To audit
configs one did not write (a CI job on pull requests), plugins can be switched off — the
``--no-plugins`` option or ``DPFL_AUDIT_NO_PLUGINS=1`` in the environment — and then every
code-loading name is refused before anything is imported.
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

from audit.core.errors import UserInputError

#: environment variable that switches plugins off (any value but "", "0", "false", "no")
NO_PLUGINS_ENV = "DPFL_AUDIT_NO_PLUGINS"


def plugins_allowed() -> bool:
    """False when ``DPFL_AUDIT_NO_PLUGINS`` is set (``--no-plugins`` sets it for its process)."""
    return os.environ.get(NO_PLUGINS_ENV, "").strip().lower() in ("", "0", "false", "no")


def is_reference(name: str) -> bool:
    """True when ``name`` has the ``module:callable`` form rather than a registry name."""
    return ":" in name


def resolve(reference: str, field: str) -> Callable[..., Any]:
    """Import and return the callable named by ``reference``; ``field`` names the config field for errors."""
    if not plugins_allowed():
        raise UserInputError(f"{field}: '{reference}' names code to load, and plugins are off "
                             f"(--no-plugins or {NO_PLUGINS_ENV}); use a registered name (see `dpfl-audit list`)")
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
