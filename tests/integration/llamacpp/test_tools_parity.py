# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Tool calls on the GGUF pair, llama.cpp backend (tests/integration/service/
test_tools_api.py: named, required and parallel calls, streamed deltas, none and auto,
multi-turn with tool results, speculative == standard for a greedy call, the 400s): the
grammar masks the backend's logits as it masks torch's."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.unit.engine.llamacpp.conftest import needs_llama_cpp

needs_llama_cpp()

from tests.integration.llamacpp.conftest import adopt, gguf_build
from tests.integration.service import test_tools_api
from tests.integration.service.harness import Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """As test_tools_api's: a 2,048-token context, the opening tag as one token."""
    manifest = gguf_build(
        tmp_path_factory.mktemp("models"), context=2048, extra_tokens=("<tool_call>",)
    )
    async with sqlite_gateway(manifest, tmp_path_factory.mktemp("var")) as g:
        yield g


adopt(test_tools_api, globals())
