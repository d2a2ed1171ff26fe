"""Helpers shared by the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

#: a run name that would execute if the report did not escape it
HOSTILE = "<script>alert(1)</script>"

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(*parts: str) -> Path:
    """Path under ../shared/data; skips the test when a user's clone has no shared data."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared real data not present at {path}")
    return path
