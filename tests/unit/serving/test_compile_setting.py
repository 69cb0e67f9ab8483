"""GATEWAY_COMPILE is off, on or auto (true/false: on/off), and a typo in it or in any
boolean setting is an error at start, not a silently disabled feature; a var folder takes the
default database along."""

from __future__ import annotations

import pytest

from gateway.serving import _compile_mode
from gateway.settings import Settings


def test_compiling_is_off_by_default() -> None:
    assert _compile_mode(Settings.from_env({}).compile) == "off"


@pytest.mark.parametrize(
    ("raw", "mode"),
    [("off", "off"), ("on", "on"), ("AUTO", "auto"), (" auto ", "auto"), ("true", "on"),
     ("false", "off")],
)  # fmt: skip
def test_each_value_names_a_mode(raw: str, mode: str) -> None:
    assert _compile_mode(Settings.from_env({"GATEWAY_COMPILE": raw}).compile) == mode


@pytest.mark.parametrize("raw", ["yes please", "1x", "ture", "compiled"])
def test_an_unknown_mode_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="GATEWAY_COMPILE must be off, on or auto"):
        _compile_mode(Settings.from_env({"GATEWAY_COMPILE": raw}).compile)


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("no", False), ("On", True), ("", False)])
def test_boolean_settings_take_the_usual_spellings(raw: str, value: bool) -> None:
    assert Settings.from_env({"GATEWAY_CONSOLE": raw}).console is value


def test_a_misspelt_boolean_is_refused_with_its_variable_named() -> None:
    with pytest.raises(ValueError, match="GATEWAY_CONSOLE must be true or false"):
        Settings.from_env({"GATEWAY_CONSOLE": "ture"})


def test_cuda_graphs_are_off_by_default_and_refuse_a_typo() -> None:
    from gateway.serving import _graphs_mode

    assert _graphs_mode(Settings.from_env({}).cuda_graphs) == "off"
    assert _graphs_mode(Settings.from_env({"GATEWAY_CUDA_GRAPHS": "auto"}).cuda_graphs) == "auto"
    assert _graphs_mode(Settings.from_env({"GATEWAY_CUDA_GRAPHS": "false"}).cuda_graphs) == "off"
    with pytest.raises(ValueError, match="GATEWAY_CUDA_GRAPHS must be off, on or auto"):
        _graphs_mode(Settings.from_env({"GATEWAY_CUDA_GRAPHS": "graphs"}).cuda_graphs)


def test_the_default_database_lives_in_the_var_folder(tmp_path) -> None:
    moved = Settings.from_env({"GATEWAY_VAR_DIR": str(tmp_path)})
    assert moved.database_url == f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    chosen = Settings.from_env(
        {"GATEWAY_VAR_DIR": str(tmp_path), "GATEWAY_DATABASE_URL": "sqlite+aiosqlite:///x.db"}
    )
    assert chosen.database_url == "sqlite+aiosqlite:///x.db"  # an explicit URL wins
    assert Settings.from_env({}).database_url.endswith("/var/gateway.db")
