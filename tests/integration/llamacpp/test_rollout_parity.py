# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Rollouts of GGUF drafts (tests/integration/rollouts/: the traffic split, the admin
API's errors, the guard rolling a bad canary back, the regression gate and promotion) on
the llama.cpp backend, SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.unit.engine.llamacpp.conftest import needs_llama_cpp

needs_llama_cpp()

from tests.integration.llamacpp.conftest import adopt
from tests.integration.rollouts import test_guard_and_promotion, test_split_and_errors
from tests.integration.rollouts.conftest import sqlite_url
from tests.integration.service.harness import Gateway, running_gateway


@pytest_asyncio.fixture
async def gw(tiny_manifest: Path, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(tiny_manifest, sqlite_url(tmp_path), tmp_path) as g:
        yield g


adopt(test_split_and_errors, globals())
adopt(
    test_guard_and_promotion,
    globals(),
    gaps={
        "test_register_then_promote_a_good_draft": (
            "POST /admin/models checks a new draft's tokenizer against its target's by "
            "reading the target's path as a model folder (models_registry/compat.py "
            "read_tokenizer): a GGUF target's path is a file"
        )
    },
)
