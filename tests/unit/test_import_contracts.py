"""The service layers' contract on the engine's face (pyproject.toml) names every engine
submodule outside the face: a module added to the engine later is covered too, or this
fails."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import gateway.engine

ROOT = Path(__file__).resolve().parents[2]
FACE = {"gateway.engine", "gateway.engine.constraints"}
CONTRACT = "The service layers use the engine's face"


def engine_modules() -> set[str]:
    found = {"gateway.engine"}
    for info in pkgutil.walk_packages(gateway.engine.__path__, "gateway.engine."):
        found.add(info.name)
    return found


def uncovered(modules: set[str], forbidden: list[str]) -> set[str]:
    """The modules neither in the face nor under a forbidden module."""
    return {
        m for m in modules - FACE if not any(m == f or m.startswith(f + ".") for f in forbidden)
    }


def test_the_face_contract_covers_every_engine_submodule() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith(CONTRACT)
    ]
    forbidden = contract["forbidden_modules"]
    modules = engine_modules()
    assert "gateway.engine.batch.scheduler" in modules  # the walk finds nested modules
    assert uncovered(modules, forbidden) == set()
    # negative control: a list without one package leaves its modules uncovered
    short = [f for f in forbidden if f != "gateway.engine.batch"]
    assert "gateway.engine.batch.forward" in uncovered(modules, short)
