"""Fixtures for the registry tests (builders live in registry_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from registry_fixtures import MakeModel, write_model


@pytest.fixture
def make_model(tmp_path: Path) -> MakeModel:
    def make(name: str, **kwargs: object) -> Path:
        return write_model(tmp_path / "models" / name, **kwargs)  # type: ignore[arg-type]

    return make
