"""Without llama_cpp the llama.cpp modules skip, saying why, except under CI=true, where they
fail: `make test` installs the extra, so a missing one is a broken install, not a choice."""

from __future__ import annotations

import importlib

import pytest

from . import conftest


@pytest.fixture
def no_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *args: object) -> object:
        if name == "llama_cpp":
            raise ImportError("No module named 'llama_cpp'")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(conftest.importlib, "import_module", fake)


def test_a_missing_llama_cpp_skips_outside_ci(no_llama_cpp, monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="llama-cpp-python is not installed"):
        conftest.needs_llama_cpp()


def test_a_missing_llama_cpp_fails_under_ci(no_llama_cpp, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="llama-cpp-python is not installed"):
        conftest.needs_llama_cpp()
