# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""The OpenAI API's tests (tests/integration/service/test_openai_api.py: chat and
completions, speculative == standard, predictions, logprobs, streams, seeds, errors, keys
and roles, tenants, rate limits, the audit chain, JSON schema and JSON mode) and the
constrained-property tests (test_named_properties_api.py) on the GGUF pair, llama.cpp
backend, SQLite (the database is the same code on either backend)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.unit.engine.llamacpp.conftest import needs_llama_cpp

needs_llama_cpp()

from tests.integration.llamacpp.conftest import adopt
from tests.integration.service import test_named_properties_api, test_openai_api
from tests.integration.service.harness import MODEL, Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    async with sqlite_gateway(tiny_manifest, tmp_path_factory.mktemp("var")) as g:
        yield g


adopt(test_openai_api, globals())
adopt(test_named_properties_api, globals())


async def test_the_tests_here_run_on_llama_cpp(gw: Gateway) -> None:
    """What every adopted test above ran on: the GGUF target and draft on llama.cpp."""
    from gateway.engine.backends.llamacpp import LlamaCppModel

    r = await gw.chat(max_tokens=4, temperature=0, decoding={"mode": "speculative", "k": 2})
    assert r.status_code == 200, r.text
    assert all(e.backend == "llama.cpp" for e in gw.services.pool.manifest.entries)
    _, engine = await gw.services.pool.target(MODEL)
    assert isinstance(engine.target.model, LlamaCppModel)
