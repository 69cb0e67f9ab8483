"""Spies for tests that must see a function was (or was not) called."""

from __future__ import annotations

from typing import Any


def count_calls(monkeypatch: Any, module: Any, name: str) -> list[int]:
    """Replace ``module.name`` by a wrapper that counts its calls and calls through; the
    count is the returned list's one item."""
    calls = [0]
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls
