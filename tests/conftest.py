"""Suite-wide collection order and pytest-xdist groups.

`make test` runs the suite in one process per core (pytest-xdist, `--dist loadgroup`),
which hands out units of work (`scope`: a module, a group, a test) in collection order, a
unit to one worker whole. Two things follow:

- The slowest tests (marked compile, browser or slow: tens of seconds each, and the
  modules of FIRST_MODULES) are collected first, and `--no-loadscope-reorder` keeps that
  order (xdist would otherwise hand out the groups of most tests first). Handed out last,
  one would leave the other workers idle while it runs; handed out first, it runs while
  they work through the many short ones. No test depends on another having run before it,
  so moving them changes no test.
- A module runs on one worker, as one unit: its module-scoped fixtures (a gateway
  process, a database, models) are then built once, as in one process, not once per
  worker that takes some of its tests. The modules of SPLIT are the exceptions: their
  tests each compile their own steps (tens of seconds each, independent), so they are
  spread over the workers; those that share a fixture are a unit of GROUPS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

FIRST = ("compile", "browser", "slow")
"""Markers of the tests that take tens of seconds each (pyproject.toml), started first."""
FIRST_MODULES = frozenset(
    {
        "integration/service/test_tool_formats_api.py",
        "integration/service/test_langchain.py",
        "integration/service/test_real_server_tools.py",
        "integration/service/test_inference_thread.py",
        "integration/service/test_audit_guarantees.py",
        "integration/service/test_real_server.py",
        "integration/audit_db/test_audit_log_api.py",
        "unit/engine/test_draft_head.py",
        "unit/engine/test_batch_sampled.py",
    }
)
"""Modules without such a mark that take a minute or more (`--durations`), started first
too."""
SPLIT = frozenset(
    {
        "unit/speed/test_compiled.py",
        "unit/speed/test_compiled_store.py",
    }
)
"""Modules whose tests are handed out one by one (paths under tests/)."""
GROUPS = {
    "test_compiled-stored": tuple(
        f"tests/unit/speed/test_compiled_store.py::{name}"
        for name in (
            "test_a_step_whose_keys_span_one_position_runs_eager",
            "test_prefill_chunks_run_the_compiled_step_its_guards_accept_and_decode_as_eager",
            "test_a_precompiled_step_is_saved_then_loaded_without_tracing",
            "test_another_model_config_does_not_load_a_precompiled_step",
        )
    ),
    "tool-families-gateway": (
        "tests/integration/service/test_tool_formats_api.py::",
        "tests/integration/service/test_langchain.py::",
    ),
}
"""Tests that share a costly fixture across what would be several scopes (node id
prefixes): test_compiled_store.py's `stored_targets`, service/conftest.py's
`tool_families_gateway`. Each group goes to one worker, which builds the fixture once."""
TESTS = Path(__file__).parent


def scope(nodeid: str) -> str:
    """The unit of work a test is handed out in: its group, its module, or (a module of
    SPLIT) itself."""
    for group, prefixes in GROUPS.items():
        if nodeid.startswith(prefixes):
            return group
    module = nodeid.split("::", 1)[0]
    return nodeid if module.removeprefix("tests/") in SPLIT else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` hands out `scope`s. (xdist's own loadgroup reads `xdist_group`
    marks through a node id suffix that pytest 9 no longer takes: every test would be a
    scope of its own, and a module-scoped gateway started on each worker.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return Scopes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def first(item: pytest.Item) -> bool:
        if any(item.get_closest_marker(m) for m in FIRST):
            return True
        return item.path.is_relative_to(TESTS) and (
            item.path.relative_to(TESTS).as_posix() in FIRST_MODULES
        )

    items.sort(key=lambda item: not first(item))  # stable: the order otherwise kept
