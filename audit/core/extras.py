"""How to install an optional part of dpfl-audit, in a line that works however it was installed.

``pip install 'dpfl-audit[mlflow]'`` works only where the package is on an index; from a clone or
a wheel it finds nothing. The packages an extra brings are in the installed package's own metadata
(``Requires-Dist: ...; extra == "mlflow"``), so the hint names them: ``pip install
'mlflow-skinny>=3.0' 'sqlalchemy>=2.0' 'alembic>=1.13'`` works everywhere.
"""

from __future__ import annotations

import re
from importlib import metadata

DISTRIBUTION = "dpfl-audit"
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_requirements(extra: str) -> list[str]:
    """The requirements ``extra`` adds (``['ray>=2.9']``), from the installed metadata; [] if unknown."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return []
    found = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        match = _EXTRA.search(marker)
        if match and match.group(1) == extra:
            found.append(requirement.strip())
    return found


def install_line(extra: str) -> str:
    """A pip command that installs what ``extra`` adds (``pip install 'ray>=2.9'``)."""
    packages = extra_requirements(extra)
    if not packages:
        return f"pip install -e '.[{extra}]' (in a clone of dpfl-audit)"
    return "pip install " + " ".join(f"'{package}'" for package in packages)
