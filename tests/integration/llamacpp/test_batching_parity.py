# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Batching, fair sharing and cancellation on the GGUF pair, llama.cpp backend
(tests/integration/hostile/: a hog tenant cannot starve another in one continuous batch,
and its control; a client gone mid-request is cancelled and recorded 499; a shutdown's
grace is bounded; each with its negative control)."""

from __future__ import annotations

from tests.unit.engine.llamacpp.conftest import needs_llama_cpp

needs_llama_cpp()

from tests.integration.hostile import test_abandoned, test_fair_sharing
from tests.integration.hostile.test_abandoned import gone_mode, grace_mode  # noqa: F401
from tests.integration.llamacpp.conftest import adopt

pytestmark = test_fair_sharing.pytestmark

adopt(test_abandoned, globals())
adopt(test_fair_sharing, globals())
