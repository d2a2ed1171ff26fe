"""File names from user text, and the rule that every path written lies inside the output folder.

A label or a component name in a config is free text (``"a/b"``, ``"../../etc"``, ``"ε = 1"``).
:func:`slug` turns it into one path component that no file system misreads: ASCII letters,
digits, ``-``, ``_`` and ``.`` only, no leading dot, at most :data:`MAX_LENGTH` characters.
Text that is already such a name is kept as it is (the run ids and score files of ordinary
configs do not change); any other text gets a suffix hashed from the *whole* original, so two
labels that differ only in the characters that were replaced still get different names. The
original text stays what the report displays.

:func:`inside` is the last line of defence: it resolves a path (symbolic links included) and
refuses it unless it lies in the output folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from pathlib import Path

#: longest slug; file systems allow 255 bytes, and run ids append a suffix to it
MAX_LENGTH = 80

_SAFE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")


def is_safe(name: str, max_length: int = MAX_LENGTH) -> bool:
    """True when ``name`` is already a slug: safe characters, no leading dot, at most ``max_length``."""
    return len(name) <= max_length and _SAFE.fullmatch(name) is not None


def slug(text: str) -> str:
    """One safe path component for ``text``; distinct texts give distinct slugs."""
    if is_safe(text):
        return text
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    base = _UNSAFE_RUN.sub("-", ascii_text).strip("-.")[: MAX_LENGTH - 13] or "x"
    # the hash keys on the original (surrogates included), so "a/b" and "a-b" cannot meet
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{base}-{digest}"


def inside(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` if it lies inside ``root`` once both are resolved; otherwise ``ValueError``.

    A ``ValueError`` here is a bug (a name that skipped :func:`slug`), not bad input: it stops
    the write before a byte lands outside the output folder.
    """
    resolved_root = Path(root).resolve()
    resolved = Path(path).resolve()
    if resolved != resolved_root and resolved_root not in resolved.parents:
        raise ValueError(f"refusing to write '{path}': it is outside the output folder '{root}'")
    return Path(path)
