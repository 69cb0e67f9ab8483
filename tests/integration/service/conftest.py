"""Fixtures shared by the service tests' modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import tool_families
from tests.integration.service.process import start_gateway


@pytest.fixture(scope="session")
def tool_families_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base url, models folder) of one real `python -m gateway` process serving the tiny
    pair once per tool-call family (tool_families.build), started once for the modules
    that call every family over HTTP (test_tool_formats_api.py, test_langchain.py). Each
    makes a tenant of its own (`process.tenant_key`), so neither spends the other's rate
    limits; both are one unit of work under pytest-xdist (tests/conftest.py GROUPS), so one
    worker runs them and starts the process once. Building the families' models and loading them
    is most of either module's time, and no test there depends on a fresh process."""
    root = tmp_path_factory.mktemp("families")
    manifest = tool_families.build(root)
    proc, url, _ = start_gateway(manifest, tmp_path_factory.mktemp("server"))
    yield url, root
    proc.terminate()
    proc.wait(timeout=60)
