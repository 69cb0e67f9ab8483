"""Shared fixtures for integration tests: the tiny model pair (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import tiny_models


@pytest.fixture(scope="session")
def tiny_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.build(tmp_path_factory.mktemp("models"))
